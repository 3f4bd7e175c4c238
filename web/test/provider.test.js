/** The provider against a live yrelay server (started by tests/test_web_provider.py). */
import { test } from 'node:test'
import assert from 'node:assert/strict'
import * as Y from 'yjs'
import { YrelayProvider } from '../src/index.js'
import { bind, clientsOfThisFile, eventually, once, uniqueDoc } from './helpers.js'

const client = clientsOfThisFile()

test('two clients on one document converge, and every change is acked', async () => {
  const name = uniqueDoc()
  const a = bind(client(), name)
  const b = bind(client(), name)
  await Promise.all([once(a.provider, 'synced'), once(b.provider, 'synced')])
  a.text.insert(0, 'hello ')
  b.text.insert(0, 'world ')
  for (let i = 0; i < 50; i++) (i % 2 ? a : b).text.insert(0, `${i},`)
  await eventually(() => a.text.toString() === b.text.toString() && a.provider.pending === 0 && b.provider.pending === 0,
    'convergence')
  assert.match(a.text.toString(), /hello/)
  assert.match(a.text.toString(), /world/)
  assert.notEqual(a.provider.offset, null)
})

test('several documents share one socket, each with its own state', async () => {
  const shared = client()
  const names = [uniqueDoc(), uniqueDoc(), uniqueDoc()]
  const writers = names.map((name) => bind(shared, name))
  const readers = names.map((name) => bind(client(), name))
  await eventually(() => [...writers, ...readers].every(({ provider }) => provider.synced), 'all synced')
  const socket = shared._ws
  writers.forEach(({ text }, i) => text.insert(0, `doc ${i}`))
  await eventually(() => readers.every(({ text }, i) => text.toString() === `doc ${i}`), 'each document delivered')
  assert.equal(shared._ws, socket, 'one socket carried all three documents')
  assert.equal(shared.providers.size, 3)
})

test('edits made while offline are delivered on reconnect, and the other side keeps its own', async () => {
  const name = uniqueDoc()
  const offlineClient = client()
  const a = bind(offlineClient, name)
  const b = bind(client(), name)
  await Promise.all([once(a.provider, 'synced'), once(b.provider, 'synced')])
  offlineClient.disconnect()
  for (let i = 0; i < 20; i++) a.text.insert(a.text.length, `a${i} `)
  for (let i = 0; i < 20; i++) b.text.insert(0, `b${i} `)
  assert.ok(a.provider.pending > 0, 'offline edits wait in the send buffer')
  await new Promise((resolve) => setTimeout(resolve, 200))
  assert.doesNotMatch(b.text.toString(), /a0 /)
  offlineClient.connect()
  await eventually(() => a.text.toString() === b.text.toString() && a.provider.pending === 0, 'convergence after reconnect')
  for (let i = 0; i < 20; i++) {
    assert.match(a.text.toString(), new RegExp(`a${i} `))
    assert.match(a.text.toString(), new RegExp(`b${i} `))
  }
})

test('a resumed session with nothing lost resubscribes with matching digests: no resync', async () => {
  const name = uniqueDoc()
  const reader = client()
  const a = bind(client(), name)
  const b = bind(reader, name)
  await Promise.all([once(a.provider, 'synced'), once(b.provider, 'synced')])
  for (let i = 0; i < 10; i++) a.text.insert(0, `${i}`)
  b.text.insert(0, 'own ')
  await eventually(() => a.text.toString() === b.text.toString() && b.provider.pending === 0, 'delivery')
  const session = reader.session
  reader._dropSocket() // the network drops; the client reconnects by itself
  await eventually(() => reader.status === 'connected' && b.provider.synced, 'resubscribed')
  assert.equal(reader.session, session, 'the session resumed')
  assert.equal(b.provider.resyncs, 0)
  assert.equal(b.provider.drifts, 0)
  a.text.insert(0, 'after ')
  await eventually(() => b.text.toString().startsWith('after '), 'delivery after the resume')
})

test('a burst of changes in one turn is merged into few updates (Nagle-like batching)', async () => {
  const name = uniqueDoc()
  const a = bind(client(), name)
  await once(a.provider, 'synced')
  let appended = 0
  a.provider.on('appended', () => appended++)
  const pendingSeen = []
  a.provider.on('pending', (count) => pendingSeen.push(count))
  for (let i = 0; i < 200; i++) a.text.insert(0, 'x')
  await eventually(() => a.provider.pending === 0, 'all acked')
  assert.ok(appended >= 1 && appended <= 5, `200 changes went out as ${appended} updates`)
  assert.ok(Math.max(...pendingSeen) > 0 && pendingSeen.at(-1) === 0, 'pending events count up and back to zero')
})

test('a document bound with local content pushes it to the server (two-way sync)', async () => {
  const name = uniqueDoc()
  const writer = bind(client(), name)
  await once(writer.provider, 'synced')
  writer.text.insert(0, 'server side. ')
  await eventually(() => writer.provider.pending === 0, 'ack')
  const doc = new Y.Doc()
  doc.getText('text').insert(0, 'made before binding. ')
  const late = new YrelayProvider(client(), name, doc)
  await eventually(() => late.synced && late.pending === 0, 'sync')
  await eventually(() => writer.text.toString() === doc.getText('text').toString(), 'convergence')
  assert.match(writer.text.toString(), /made before binding/)
  assert.match(writer.text.toString(), /server side/)
})

test('an invalid update is rejected with a clear error and never retried', async () => {
  const name = uniqueDoc()
  const shared = client()
  const a = bind(shared, name)
  await once(a.provider, 'synced')
  const errors = []
  a.provider.on('error', (frame) => { if (frame.clock !== undefined) errors.push(frame) })
  shared.enqueue(name, new Uint8Array([255, 255, 255, 1, 2, 3]))
  await eventually(() => errors.length > 0 && shared.pending === 0, 'the rejection')
  assert.equal(errors[0].code, 'invalid_update')
  a.text.insert(0, 'still works')
  const b = bind(client(), name)
  await eventually(() => b.text.toString() === 'still works', 'the document is not poisoned')
})

test('destroy unbinds the document; the same client can bind it again and gets its content', async () => {
  const name = uniqueDoc()
  const shared = client()
  const a = bind(shared, name)
  await once(a.provider, 'synced')
  a.text.insert(0, 'kept')
  await eventually(() => a.provider.pending === 0, 'ack')
  a.provider.destroy()
  assert.equal(shared.providers.size, 0)
  const again = bind(shared, name)
  await eventually(() => again.text.toString() === 'kept', 'the content, from the server')
})

test('a deleted document unbinds its providers with a deleted event; binding it again gives an empty one', async () => {
  const name = uniqueDoc('deleted')
  const shared = client()
  const a = bind(shared, name)
  await once(a.provider, 'synced')
  a.text.insert(0, 'to be deleted')
  await eventually(() => a.provider.pending === 0, 'ack')
  const deleted = once(a.provider, 'deleted')
  const base = process.env.YRELAY_WS_URL.replace(/^ws/, 'http').replace(/\/ws$/, '')
  const response = await fetch(`${base}/ops/docs/${name}`, {
    method: 'DELETE', headers: { authorization: `Bearer ${process.env.YRELAY_OPS_TOKEN}` }
  })
  assert.equal(response.status, 200, await response.text())
  await deleted
  assert.equal(a.provider.deleted, true)
  assert.equal(shared.providers.has(name), false)
  assert.equal(a.text.toString(), 'to be deleted') // the local copy stays readable
  const again = bind(shared, name)
  await once(again.provider, 'synced')
  assert.equal(again.text.toString(), '')
})

test('presence: each side sees the other, and a leaving client is removed from the others', async () => {
  const name = uniqueDoc()
  const a = bind(client(), name)
  const b = bind(client(), name)
  a.provider.awareness.setLocalStateField('user', { name: 'alice' })
  b.provider.awareness.setLocalStateField('user', { name: 'bob' })
  await Promise.all([once(a.provider, 'synced'), once(b.provider, 'synced')])
  const names = (provider) => [...provider.awareness.getStates().values()].map((state) => state.user?.name).filter(Boolean).sort()
  await eventually(() => names(a.provider).join() === 'alice,bob' && names(b.provider).join() === 'alice,bob',
    'both users on both sides')
  b.provider.awareness.setLocalStateField('cursor', { anchor: 3 })
  await eventually(() => a.provider.awareness.getStates().get(b.doc.clientID)?.cursor?.anchor === 3, 'the cursor')
  const bobsSocket = b.provider.client
  bobsSocket._dropSocket() // bob's connection dies: the server relays his removal, then he comes back
  await eventually(() => bobsSocket.status === 'connected' && b.provider.synced, 'bob reconnected')
  await eventually(() => names(a.provider).join() === 'alice,bob', 'bob visible again after his reconnect')
  const late = bind(client(), name)
  await eventually(() => names(late.provider).join() === 'alice,bob', 'a newcomer gets the current states')
  b.provider.destroy()
  await eventually(() => !a.provider.awareness.getStates().has(b.doc.clientID), 'bob removed after leaving')
  assert.equal(a.text.toString(), '', 'presence never touches the document')
})

test('a drift digest the server disagrees with is caught and repaired by a two-way resync', async () => {
  const name = uniqueDoc()
  const writer = bind(client(), name)
  const readerClient = client()
  const reader = bind(readerClient, name)
  await Promise.all([once(writer.provider, 'synced'), once(reader.provider, 'synced')])
  for (let i = 0; i < 5; i++) {
    writer.text.insert(0, `${i}`)
    await eventually(() => writer.provider.pending === 0, 'ack') // one stream entry each
  }
  await eventually(() => reader.provider.held.size === 5, 'five deliveries')
  // The reader claims an entry the stream never had, inside its window and
  // below the stream's last id (as when a restore from backup lost one and
  // later appends hid the gap): only the digest can tell.
  const [ms, seq] = reader.provider.held.ids()[0].split('-')
  reader.provider.held.add(`${ms}-${Number(seq) + 1}`)
  const reasons = []
  reader.provider.on('resync', ({ reason }) => reasons.push(reason))
  readerClient._dropSocket()
  await eventually(() => reader.provider.resyncs === 1 && reader.provider.synced, 'the resync')
  assert.deepEqual(reasons, ['drift'])
  assert.equal(reader.provider.drifts, 1)
  writer.text.insert(0, 'after ')
  await eventually(() => reader.text.toString() === writer.text.toString(), 'convergence after the repair')
  readerClient._dropSocket() // the repaired digest agrees with the server's again: no second resync
  await eventually(() => readerClient.status === 'connected' && reader.provider.synced, 'resubscribed')
  assert.equal(reader.provider.resyncs, 1)
})

test('acks are coalesced: one per document per interval, carrying the newest offset', async () => {
  const name = uniqueDoc()
  const reader = bind(client(), name)
  await once(reader.provider, 'synced')
  const acks = []
  const send = reader.provider.client.send.bind(reader.provider.client)
  reader.provider.client.send = (frame) => {
    if (frame.op === 'ack') acks.push(frame.offset)
    return send(frame)
  }
  for (let i = 0; i < 20; i++) { // twenty deliveries within one interval
    reader.provider.offset = `${1700000000000 + i}-0`
    reader.provider._ack()
  }
  await new Promise((resolve) => setTimeout(resolve, 150))
  assert.deepEqual(acks, ['1700000000019-0'])
})
