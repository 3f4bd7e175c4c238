/**
 * Ordered sending, causal refusals, large updates and `synced`, against a
 * scripted socket (no server): what the client sends, in which order, and
 * what it does with each answer (docs/protocol.md#causal-admission,
 * #large-updates).
 */
import { test } from 'node:test'
import assert from 'node:assert/strict'
import * as Y from 'yjs'
import { fromBase64 } from 'lib0/buffer'
import { Backoff, YrelayClient, YrelayProvider } from '../src/index.js'
import { AFTER_EARLIER, NEEDS_SYNC, SENT, SendBuffer, WAITING } from '../src/send-buffer.js'
import { updateFrames } from '../src/update-frames.js'

const ALL_FEATURES = ['strict_types', 'causal_admission', 'sync_push', 'update_parts', 'synced']

/** A websocket whose server is the test: it records frames and answers with `reply`. */
class ScriptedSocket {
  constructor () {
    this.readyState = 0
    this.sent = []
    ScriptedSocket.last = this
    setTimeout(() => { this.readyState = 1; this.onopen?.() }, 0)
  }

  send (text) {
    assert.ok(text.length <= (ScriptedSocket.maxFrame ?? Infinity), `a ${text.length}-byte frame`)
    this.sent.push(JSON.parse(text))
  }

  close () {
    this.readyState = 3
    setTimeout(() => this.onclose?.({ code: 4000 }), 0)
  }

  reply (frame) { this.onmessage?.({ data: JSON.stringify(frame) }) }

  /** Update frames sent so far, as [doc, clock] (parts count once). */
  updates () {
    return this.sent.filter((frame) => frame.op === 'update' && !frame.part).map((frame) => [frame.doc, frame.clock])
  }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

async function until (predicate, what) {
  const deadline = Date.now() + 3000
  while (!predicate()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await sleep(2)
  }
}

/** A client whose handshake is answered with `features` and `limits`. */
async function connected ({ features = ALL_FEATURES, limits = {}, backoff = { base: 40, maxDelay: 40, jitter: 0 } } = {}) {
  ScriptedSocket.maxFrame = limits.max_frame_bytes
  ScriptedSocket.last = null
  const client = new YrelayClient('ws://scripted.invalid/ws', {
    WebSocketPolyfill: ScriptedSocket, backoff: new Backoff(backoff), tickInterval: 5
  })
  await until(() => ScriptedSocket.last?.sent.some((frame) => frame.op === 'hello'), 'hello')
  const socket = ScriptedSocket.last
  socket.reply({ op: 'welcome', session: 's', resumed: false, protocol: 1, limits, features })
  return { client, socket }
}

/** Stands for a provider: the client only needs its name and these hooks. */
function stub (client, name) {
  const doc = { name, frames: [], pushes: 0 }
  Object.assign(doc, {
    _connected () {}, _disconnected () {}, _release () {}, _emitPending () {}, _appended () {},
    _receive (frame) { doc.frames.push(frame) },
    _pushSync () { doc.pushes++ }
  })
  client.attach(doc)
  return doc
}

const bytes = (n, seed = 7) => Uint8Array.from({ length: n }, (_, i) => (i * 31 + seed) % 251)

test('send buffer: per document in clock order; a refused update holds back its document only', () => {
  const buffer = new SendBuffer(new Backoff({ base: 100, jitter: 0 }))
  const [a1, a2, b1] = [buffer.add('a', bytes(1)), buffer.add('a', bytes(1)), buffer.add('b', bytes(1))]
  assert.deepEqual(buffer.due(0).map((item) => item.clock), [1, 2, 3])
  for (const item of [a1, a2, b1]) buffer.markSent(item, 1000)
  assert.deepEqual(buffer.due(1050), [], 'on the wire within their answer time')
  buffer.hold(a1.clock) // unavailable
  const a3 = buffer.add('a', bytes(1))
  const b2 = buffer.add('b', bytes(1))
  assert.deepEqual(buffer.due(1050).map((item) => item.clock), [b2.clock], 'a3 waits behind a1; b goes on')
  assert.deepEqual(buffer.due(1100).map((item) => item.clock), [a1.clock, a2.clock, b1.clock, a3.clock, b2.clock],
    'a1 due again: resent first, then what follows it (a2 unanswered too)')
  assert.equal(buffer.refuse(a2.clock), AFTER_EARLIER, 'missing_dependency behind unacked a1')
  assert.deepEqual(buffer.due(1100).map((item) => item.clock), [a1.clock, b1.clock, b2.clock], 'a2 waits for a1, a3 for a2')
  buffer.pop(a1.clock) // a1 acked
  assert.deepEqual(buffer.due(1100).map((item) => item.clock), [a2.clock, b1.clock, a3.clock, b2.clock])
  buffer.markSent(a2, 1100)
  assert.equal(buffer.refuse(a2.clock), NEEDS_SYNC, 'refused with nothing earlier: only a sync helps')
  assert.deepEqual(buffer.due(1100).map((item) => item.doc), ['b', 'b'])
  buffer.resetAttempts()
  assert.equal(a2.state, NEEDS_SYNC, 'a reconnect keeps it for the sync')
  assert.equal(buffer.needsSync('a'), true)
  const sync = buffer.add('a', bytes(9), { sync: true })
  assert.deepEqual(buffer.supersede('a', sync.clock).map((item) => item.clock), [a2.clock, a3.clock])
  assert.deepEqual(buffer.forDoc('a'), [sync])
})

test('send buffer: an unanswered update is resent only once the connection answered nothing for its answer time', () => {
  const buffer = new SendBuffer(new Backoff({ base: 100, jitter: 0, maxAttempts: 3 }))
  const clocks = (now) => buffer.due(now).map((item) => item.clock)
  const [a, b] = [buffer.add('d', bytes(1)), buffer.add('e', bytes(1))]
  for (const item of buffer.due(1000)) buffer.markSent(item, 1000)
  buffer.answered(1090) // an answer (of an earlier update, say): the server reads the connection, slowly
  assert.deepEqual(clocks(1150), [], 'past their answer time, but 60 ms after an answer')
  assert.deepEqual(clocks(1190), [a.clock, b.clock], '100 ms without an answer')
  buffer.markSent(a, 1190) // its second attempt: 200 ms
  buffer.pop(b.clock)
  buffer.answered(1300)
  assert.deepEqual(clocks(1450), [])
  assert.deepEqual(clocks(1500), [a.clock])
  buffer.hold(a.clock) // unavailable: resent on its schedule, answers or not
  buffer.answered(1500)
  assert.deepEqual(clocks(1500), [a.clock])
  const c = buffer.add('f', bytes(1))
  buffer.markSent(c, 1500)
  buffer.defer(c.clock, 300, 1500) // rate_limited (an older server): after retry_after_ms, answers or not
  buffer.answered(1799)
  assert.deepEqual(clocks(1799), [a.clock])
  assert.deepEqual(clocks(1800), [a.clock, c.clock])
  buffer.resetAttempts() // a new connection: sent again at once, and nothing was answered on it yet
  assert.equal(buffer.lastAnswer, -Infinity)
  for (const item of buffer.due(2000)) buffer.markSent(item, 2000)
  assert.deepEqual(clocks(2100), [a.clock, c.clock])
  for (const item of buffer.due(2100)) buffer.markSent(item, 2100)
  for (const item of buffer.due(2300)) buffer.markSent(item, 2300)
  assert.equal(buffer.exhausted(), true, 'a connection that answers nothing still uses up the attempts')
})

test('send buffer: a rate_limited or unavailable update holds back later ones; restored updates are sorted by clock', () => {
  const buffer = new SendBuffer(new Backoff({ base: 10, jitter: 0 }))
  const first = buffer.add('d', bytes(1))
  buffer.markSent(first, 0)
  buffer.defer(first.clock, 500, 0)
  assert.equal(first.state, WAITING)
  buffer.add('d', bytes(1))
  assert.deepEqual(buffer.due(499), [])
  assert.deepEqual(buffer.due(500).map((item) => item.clock), [1, 2])
  const restored = new SendBuffer(new Backoff())
  for (const clock of [9, 4, 6]) restored.restore({ clock, doc: 'd', update: bytes(1) })
  assert.deepEqual(restored.forDoc('d').map((item) => item.clock), [4, 6, 9])
  assert.equal(restored.add('d', bytes(1)).clock, 10)
})

test('send buffer: only never-sent updates are merged, into the first clock, and never past the size cap', () => {
  const buffer = new SendBuffer(new Backoff({ base: 10, jitter: 0 }))
  const source = new Y.Doc()
  const updates = []
  source.on('update', (update) => updates.push(update))
  for (let i = 0; i < 6; i++) source.getText('t').insert(0, `${i}`)
  const sent = buffer.add('d', updates[0])
  buffer.markSent(sent, 0)
  const before = sent.update
  for (const update of updates.slice(1)) buffer.add('d', update)
  const sizes = updates.slice(1).map((update) => update.length)
  const cap = sizes[0] + sizes[1] + sizes[2]
  const { item, removed } = buffer.coalesce('d', Y.mergeUpdates, cap)
  assert.equal(item.clock, 2, 'merged into the first waiting clock')
  assert.deepEqual(removed.map((r) => r.clock), [3, 4])
  assert.equal(sent.update, before, 'the bytes behind a sent clock never change')
  assert.deepEqual(buffer.forDoc('d').map((i) => i.clock), [1, 2, 5, 6])
  const replica = new Y.Doc()
  for (const i of buffer.forDoc('d')) Y.applyUpdate(replica, i.update)
  assert.equal(replica.getText('t').toString(), source.getText('t').toString())
})

test('update frames: one frame when it fits, else parts that never exceed max_frame_bytes and rebuild the update', () => {
  const features = new Set(ALL_FEATURES)
  for (const size of [0, 1, 100, 131, 132, 133, 500, 2999, 3000, 3001]) {
    for (const sync of [false, true]) {
      const item = { doc: 'some/doc', clock: 12345, update: bytes(size), sync }
      const { frames } = updateFrames(item, { max_frame_bytes: 300, max_update_bytes: 10_000 }, features)
      for (const frame of frames) assert.ok(JSON.stringify(frame).length <= 300, `${size}: ${JSON.stringify(frame).length}`)
      const rebuilt = Buffer.concat(frames.map((frame) => fromBase64(frame.update)))
      assert.deepEqual(new Uint8Array(rebuilt), item.update)
      assert.ok(frames.every((frame) => frame.clock === 12345 && frame.doc === 'some/doc' && (frame.sync === true) === sync))
      if (frames.length > 1) assert.deepEqual(frames.map((frame) => [frame.part, frame.parts]), frames.map((_, i) => [i, frames.length]))
      else assert.equal(frames[0].parts, undefined)
    }
  }
  const big = { doc: 'd', clock: 1, update: bytes(5000) }
  assert.equal(updateFrames(big, { max_frame_bytes: 300, max_update_bytes: 4999 }, features).refused.limit, 4999)
  assert.match(updateFrames(big, { max_frame_bytes: 300 }, new Set()).refused.message, /does not take updates in parts/)
  assert.equal(updateFrames(big, null, new Set()).frames.length, 1, 'no limits known: as before')
})

test('client: an unavailable update holds back later updates of its document, not of others; acked ones release them', async () => {
  const { client, socket } = await connected()
  stub(client, 'a')
  stub(client, 'b')
  await until(() => client.status === 'connected', 'connected')
  client.enqueue('a', bytes(3)) // 1
  client.enqueue('a', bytes(3)) // 2
  assert.deepEqual(socket.updates(), [['a', 1], ['a', 2]], 'pipelined')
  socket.reply({ op: 'error', code: 'unavailable', message: 'down', doc: 'a', clock: 1 })
  socket.reply({ op: 'error', code: 'missing_dependency', message: 'needs 1', doc: 'a', clock: 2, missing: { 5: 0 } })
  client.enqueue('a', bytes(3)) // 3: behind 1
  client.enqueue('b', bytes(3)) // 4: another document goes at once
  assert.deepEqual(socket.updates().slice(2), [['b', 4]])
  const ofA = () => socket.updates().filter(([doc]) => doc === 'a').map(([, clock]) => clock)
  await until(() => ofA().length === 3, 'the resend of 1')
  await sleep(100)
  assert.deepEqual(new Set(ofA().slice(2)), new Set([1]), 'nothing of a passes 1 (resent while unanswered)')
  const sentBefore = ofA().length
  socket.reply({ op: 'appended', doc: 'a', clock: 1, id: '1-0', duplicate: false })
  assert.deepEqual(ofA().slice(sentBefore, sentBefore + 2), [2, 3], 'the refused one first, then the held one')
  client.destroy()
})

test('client: refused with nothing earlier unacked, the provider pushes a sync; its diff replaces the refused updates', async () => {
  const { client, socket } = await connected()
  const a = stub(client, 'a')
  await until(() => client.status === 'connected', 'connected')
  client.enqueue('a', bytes(3)) // 1
  client.enqueue('a', bytes(3)) // 2
  socket.reply({ op: 'error', code: 'missing_dependency', message: 'gone', clock: 1, missing: { 5: 3 } })
  socket.reply({ op: 'error', code: 'missing_dependency', message: 'gone', doc: 'a', clock: 2, missing: { 5: 3 } })
  assert.equal(a.pushes, 1, 'one sync for the head; 2 waits behind 1')
  assert.equal(a.frames[0].doc, 'a', 'the error names the document even when the server did not')
  assert.equal(a.frames[0].clock, 1)
  const push = client.pushSync('a', bytes(20))
  assert.equal(client.pending, 1, 'the diff replaced both')
  const frame = socket.sent.at(-1)
  assert.deepEqual([frame.op, frame.clock, frame.sync], ['update', push.clock, true])
  socket.reply({ op: 'appended', doc: 'a', clock: push.clock, id: null, duplicate: false, dropped: { 5: [[3, 9]] } })
  assert.equal(client.pending, 0)
  client.destroy()
})

test('client: a large update goes in parts, one over max_update_bytes is refused locally and the socket keeps working', async () => {
  const limits = { max_frame_bytes: 2000, max_update_bytes: 20_000 }
  const { client, socket } = await connected({ limits })
  stub(client, 'big')
  const small = stub(client, 'small')
  await until(() => client.status === 'connected', 'connected')
  const errors = []
  client.on('error', (frame) => errors.push(frame))
  const paste = bytes(15_000)
  const item = client.enqueue('big', paste)
  const parts = socket.sent.filter((frame) => frame.clock === item.clock)
  assert.ok(parts.length >= 8 && parts.every((frame, i) => frame.part === i && frame.parts === parts.length))
  assert.deepEqual(new Uint8Array(Buffer.concat(parts.map((frame) => fromBase64(frame.update)))), paste)
  const tooBig = client.enqueue('big', bytes(20_001))
  client.enqueue('small', bytes(3))
  assert.equal(errors.length, 1)
  assert.deepEqual([errors[0].code, errors[0].doc, errors[0].clock, errors[0].size], ['update_too_large', 'big', tooBig.clock, 20_001])
  assert.equal(small.frames.length, 0)
  assert.equal(client.buffer.get(tooBig.clock), undefined, 'dropped from pending')
  assert.deepEqual(socket.updates().at(-1), ['small', tooBig.clock + 1], 'the next document is not held back')
  assert.ok(!socket.sent.some((frame) => frame.clock === tooBig.clock), 'never sent')
  client.destroy()
  const old = await connected({ features: [], limits })
  stub(old.client, 'big')
  await until(() => old.client.status === 'connected', 'connected')
  const refused = []
  old.client.on('error', (frame) => refused.push(frame))
  old.client.enqueue('big', paste)
  assert.equal(refused[0]?.code, 'update_too_large', 'a server without update_parts never gets a frame it cannot read')
  assert.equal(old.client.pending, 0)
  old.client.destroy()
})

test('provider: with the synced feature, synced waits for the server\'s synced frame; without it, as before', async () => {
  for (const features of [ALL_FEATURES, []]) {
    const { client, socket } = await connected({ features })
    const doc = new Y.Doc()
    const provider = new YrelayProvider(client, 'doc', doc, { awareness: null })
    await until(() => socket.sent.some((frame) => frame.op === 'subscribe'), 'subscribe')
    const source = new Y.Doc()
    source.getText('t').insert(0, 'server state')
    socket.reply({ op: 'subscribed', doc: 'doc', offset: '5-0' })
    socket.reply({ op: 'snapshot', doc: 'doc', offset: '5-0', update: Buffer.from(Y.encodeStateAsUpdate(source)).toString('base64'), part: 0, parts: 1 })
    if (features.length) {
      assert.equal(provider.synced, false, 'entries may follow the snapshot')
      socket.reply({ op: 'deliver', doc: 'doc', entries: [] })
      assert.equal(provider.synced, false)
      socket.reply({ op: 'synced', doc: 'doc', offset: '5-0' })
    }
    assert.equal(provider.synced, true)
    assert.equal(doc.getText('t').toString(), 'server state')
    client.destroy()
  }
})

test('provider: a sync push answered with id null and dropped ranges holds no id, reports the ranges, leaves nothing pending', async () => {
  const { client, socket } = await connected()
  const doc = new Y.Doc()
  const provider = new YrelayProvider(client, 'doc', doc, { awareness: null })
  await until(() => socket.sent.some((frame) => frame.op === 'subscribe'), 'subscribe')
  socket.reply({ op: 'subscribed', doc: 'doc', offset: '0-0' })
  socket.reply({ op: 'synced', doc: 'doc', offset: '0-0' })
  const dropped = []
  provider.on('dropped', (event) => dropped.push(event))
  const push = client.pushSync('doc', bytes(10))
  assert.equal(socket.sent.at(-1).sync, true)
  socket.reply({ op: 'appended', doc: 'doc', clock: push.clock, id: null, duplicate: false, dropped: { 77: [[0, 4]] } })
  assert.equal(provider.held.size, 0, 'nothing stored: no id held')
  assert.deepEqual(dropped, [{ clock: push.clock, ranges: { 77: [[0, 4]] } }])
  assert.equal(provider.pending, 0)
  assert.equal(provider.needsSync, true, 'offered again at the next subscribe')
  client.destroy()
})
