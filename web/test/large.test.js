/**
 * Large pastes against a live server (docs/protocol.md#large-updates): one
 * larger than a frame goes in parts and arrives intact; one over
 * max_update_bytes is refused by the provider with an error naming the
 * document, the clock and the size, and the socket keeps syncing every
 * other document.
 */
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { bind, clientsOfThisFile, eventually, once, spy, uniqueDoc } from './helpers.js'

const client = clientsOfThisFile()

/** `size` characters that are not all alike (a corrupted or reordered part would show). */
function paste (size) {
  const words = []
  let length = 0
  for (let i = 0; length < size; i++) {
    const word = `${i.toString(36)} `
    words.push(word)
    length += word.length
  }
  return words.join('').slice(0, size)
}

test('a 5 MB paste goes in parts and arrives intact at a second provider', async () => {
  const name = uniqueDoc('paste5')
  const writerClient = client()
  const writer = bind(writerClient, name)
  const reader = bind(client(), name)
  await Promise.all([once(writer.provider, 'synced'), once(reader.provider, 'synced')])
  const errors = []
  writer.provider.on('error', (frame) => errors.push(frame))
  const seen = spy(writerClient)
  const text = paste(5 * 1024 * 1024)
  writer.text.insert(0, text)
  await eventually(() => writer.provider.pending === 0, 'the ack', 60000)
  assert.deepEqual(errors, [])
  const sent = seen.written.filter((frame) => frame.op === 'update').map((frame) => JSON.stringify(frame).length)
  assert.ok(sent.length >= 4, `${sent.length} frames`)
  assert.ok(Math.max(...sent) <= writerClient.limits.max_frame_bytes, 'every part fits in a frame')
  await eventually(() => reader.text.length === text.length, 'the delivery', 60000)
  assert.ok(reader.text.toString() === text, 'intact')
})

test('a 20 MB paste is refused locally (doc, clock, size); another document on the socket still syncs within a second', async () => {
  const name = uniqueDoc('paste20')
  const otherName = uniqueDoc('paste20-other')
  const writerClient = client()
  const writer = bind(writerClient, name)
  const other = bind(writerClient, otherName)
  const otherReader = bind(client(), otherName)
  await Promise.all([writer, other, otherReader].map(({ provider }) => once(provider, 'synced')))
  const errors = []
  writer.provider.on('error', (frame) => errors.push(frame))
  const socket = writerClient._ws
  writer.text.insert(0, paste(20 * 1024 * 1024))
  await eventually(() => errors.length > 0, 'the refusal', 20000)
  const [error] = errors
  assert.equal(error.code, 'update_too_large')
  assert.equal(error.doc, name)
  assert.ok(Number.isInteger(error.clock))
  assert.ok(error.size > 20 * 1024 * 1024 && error.limit === writerClient.limits.max_update_bytes, JSON.stringify({ ...error, message: undefined }))
  assert.match(error.message, /max_update_bytes/)
  assert.equal(writer.provider.pending, 0, 'dropped from pending')
  const started = Date.now()
  other.text.insert(0, 'still syncing')
  await eventually(() => otherReader.text.toString() === 'still syncing', 'the other document', 1000)
  const elapsed = Date.now() - started
  assert.ok(elapsed < 1000, `${elapsed} ms`)
  assert.equal(writerClient._ws, socket, 'the socket was never closed')
  await eventually(() => writerClient.pending === 0, 'the ack of the other document')
  // The paste stays in the page's document. Deleting it (Yjs then keeps only
  // its length) lets the document sync again: the next edit is refused
  // (missing_dependency: the paste's clocks), and the two-way sync pushes a small diff.
  const reader = bind(client(), name)
  await once(reader.provider, 'synced')
  writer.text.delete(0, writer.text.length)
  writer.text.insert(0, 'after the paste')
  await eventually(() => reader.text.toString() === 'after the paste' && writer.provider.pending === 0, 'the document syncs again', 20000)
  const later = errors.slice(1).map((frame) => frame.code)
  assert.ok(later.length >= 1 && later.every((code) => code === 'missing_dependency'), `the edit was refused, then synced: ${later}`)
})
