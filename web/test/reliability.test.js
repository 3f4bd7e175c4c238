/**
 * Issue 15 from the provider's side, against a live server and redis-server:
 * an ack means the document holds the update. Redis refuses writes (as with
 * too few replicas) for a moment, so one update gets `unavailable`; what the
 * provider does next, and what the server does with a later update of the
 * same Yjs client that reaches it first.
 */
import { test } from 'node:test'
import assert from 'node:assert/strict'
import * as Y from 'yjs'
import { toBase64 } from 'lib0/buffer'
import { YrelayProvider } from '../src/index.js'
import { bind, clientsOfThisFile, eventually, once, spy, uniqueDoc, writesRefused } from './helpers.js'

const client = clientsOfThisFile()

/** Resends wait 1.5 s, so the test decides what reaches the server first. */
const SLOW = { base: 1500, maxDelay: 1500, jitter: 0, maxAttempts: 30 }

/** While Redis refuses writes, make one edit: the clock of the update that got `unavailable`. */
async function refusedEdit (seen, edit) {
  const unavailable = () => seen.errors.find((frame) => frame.code === 'unavailable' && Number.isInteger(frame.clock))
  return writesRefused(async () => {
    edit()
    await eventually(() => unavailable() !== undefined, 'unavailable')
    return unavailable().clock
  })
}

test('an update refused as unavailable holds back later ones of its document; both are stored in order', async () => {
  const name = uniqueDoc('order')
  const writerClient = client({ backoff: SLOW })
  const writer = bind(writerClient, name)
  const reader = bind(client(), name)
  await Promise.all([once(writer.provider, 'synced'), once(reader.provider, 'synced')])
  const seen = spy(writerClient)
  writer.text.insert(0, 'one ')
  await eventually(() => writer.provider.pending === 0, 'the first ack')
  const first = await refusedEdit(seen, () => writer.text.insert(writer.text.length, 'two '))
  assert.equal(seen.errors.find((frame) => frame.clock === first).doc, name)
  writer.text.insert(writer.text.length, 'three ') // Redis takes writes again, but "two" waits for its resend
  await eventually(() => writerClient.buffer.countFor(name) === 2, 'queued')
  const held = writerClient.buffer.forDoc(name)[1].clock
  const other = bind(writerClient, uniqueDoc('order-other'))
  await once(other.provider, 'synced')
  other.text.insert(0, 'elsewhere')
  await eventually(() => other.provider.pending === 0, 'another document is not held back')
  const sentBefore = seen.updates(name).length
  assert.deepEqual(seen.updates(name).filter((clock) => clock > first), [], 'nothing of the document went out after the refused update')
  await eventually(() => writer.provider.pending === 0, 'the resend, then the held update', 10000)
  assert.deepEqual(seen.updates(name).slice(sentBefore), [first, held], 'the refused update is resent first, then the held one')
  await eventually(() => reader.text.toString() === 'one two three ', 'delivery in order')
  assert.equal(seen.errors.filter((frame) => frame.code === 'missing_dependency').length, 0, 'never sent out of order')
})

test('issue 15: a later update reaching the server first is refused, the client dies before resending, nothing acked is missing', async () => {
  const name = uniqueDoc('issue15')
  const writerClient = client({ backoff: SLOW })
  const writer = bind(writerClient, name)
  await once(writer.provider, 'synced')
  const seen = spy(writerClient)
  const acked = []
  writer.provider.on('appended', ({ update }) => acked.push(update))
  for (const word of ['a0 ', 'a1 ', 'a2 ']) {
    writer.text.insert(writer.text.length, word)
    await eventually(() => writer.provider.pending === 0, 'ack')
  }
  await refusedEdit(seen, () => writer.text.insert(writer.text.length, 'LOST '))
  // Redis is back. The provider holds the next update back; an older client
  // (or a pipelined one) would have sent it: put it on the wire by hand.
  writer.text.insert(writer.text.length, 'LATER ')
  await eventually(() => writerClient.buffer.countFor(name) === 2, 'the later update queued')
  const later = writerClient.buffer.forDoc(name)[1]
  assert.ok(!seen.updates().includes(later.clock), 'the provider itself does not send it')
  writerClient._write({ op: 'update', doc: name, clock: later.clock, update: toBase64(later.update) })
  await eventually(() => seen.errors.some((frame) => frame.clock === later.clock), 'the answer to the later update')
  const refusal = seen.errors.find((frame) => frame.clock === later.clock)
  assert.equal(refusal.code, 'missing_dependency', JSON.stringify(refusal))
  assert.equal(refusal.doc, name)
  assert.equal(refusal.missing[String(writer.doc.clientID)] !== undefined, true, 'names the Yjs client it lacks')
  assert.equal(acked.length, 3, 'the later update was not acked')
  writerClient.destroy() // the page dies before "LOST" is resent
  const fresh = bind(client(), name)
  await eventually(() => fresh.provider.synced, 'a fresh subscriber')
  assert.equal(fresh.text.toString(), 'a0 a1 a2 ', 'every acked update is in the document, nothing stuck behind a gap')
  const replica = bind(client(), name)
  await eventually(() => replica.provider.synced, 'another')
  assert.equal(replica.text.toString(), 'a0 a1 a2 ')
})

test('an update that stays refused with nothing earlier unacked is resolved by a two-way sync push', async () => {
  const name = uniqueDoc('push')
  const writerClient = client({ backoff: SLOW }) // no resend before the update is taken away
  const writer = bind(writerClient, name)
  const reader = bind(client(), name)
  await Promise.all([once(writer.provider, 'synced'), once(reader.provider, 'synced')])
  const seen = spy(writerClient)
  const lost = await refusedEdit(seen, () => writer.text.insert(0, 'gone '))
  writerClient.buffer.pop(lost) // the earlier update is gone (as after a reload without persistence)
  const pushes = []
  writer.provider.on('appended', (event) => { if (event.sync) pushes.push(event) })
  writer.text.insert(writer.text.length, 'then this')
  await eventually(() => seen.errors.some((frame) => frame.code === 'missing_dependency'), 'the refusal')
  await eventually(() => pushes.length === 1 && writer.provider.pending === 0, 'the sync push, acked')
  assert.ok(seen.written.some((frame) => frame.op === 'sync'), 'a two-way sync ran')
  assert.ok(seen.written.some((frame) => frame.op === 'update' && frame.sync === true), 'its diff went as a sync push')
  assert.equal(pushes[0].dropped, undefined, 'the server could store all of it')
  await eventually(() => reader.text.toString() === 'gone then this', 'both updates reach the reader')
  assert.equal(writer.provider.synced, true, 'a push does not unsync the document')
})

test('a sync push with content the server cannot apply yet: stored in part, the rest pushed once its dependency arrives', async () => {
  const name = uniqueDoc('pending')
  // Another Yjs client typed "a" then "b" after it; this page only got "b",
  // which Yjs keeps as a pending struct (it builds on "a").
  const origin = new Y.Doc()
  const originUpdates = []
  origin.on('update', (update) => originUpdates.push(update))
  origin.getText('text').insert(0, 'a')
  origin.getText('text').insert(1, 'b')
  const doc = new Y.Doc()
  Y.applyUpdate(doc, originUpdates[1])
  doc.getText('own').insert(0, 'own content')
  assert.notEqual(doc.store.pendingStructs, null)
  const provider = new YrelayProvider(client(), name, doc, { awareness: null })
  const dropped = []
  provider.on('dropped', (event) => dropped.push(event))
  const reader = bind(client(), name)
  await eventually(() => dropped.length === 1 && provider.pending === 0, 'the sync push, partly stored')
  assert.deepEqual(Object.keys(dropped[0].ranges), [String(origin.clientID)], 'the ranges of the pending struct')
  await eventually(() => reader.doc.getText('own').toString() === 'own content', 'what could be stored arrives')
  assert.equal(reader.text.toString(), '')
  // "a" reaches the server from elsewhere: the page integrates "b" and pushes it.
  const other = new Y.Doc()
  Y.applyUpdate(other, originUpdates[0])
  new YrelayProvider(client(), name, other, { awareness: null }) // eslint-disable-line no-new
  await eventually(() => reader.text.toString() === 'ab', 'the dropped content, pushed again once it could apply')
  assert.equal(doc.getText('text').toString(), 'ab')
})
