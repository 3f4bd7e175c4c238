/** The provider against a server that requires tokens (started by tests/test_web_provider.py). */
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import * as Y from 'yjs'
import WebSocket from 'ws'
import { YrelayClient, YrelayProvider } from '../src/index.js'
import { FAST, eventually, once, uniqueDoc } from './helpers.js'

const URL = process.env.YRELAY_AUTH_WS_URL
const tokens = JSON.parse(process.env.YRELAY_AUTH_TOKENS || '{}')
if (!URL || !tokens.write) throw new Error('set YRELAY_AUTH_WS_URL and YRELAY_AUTH_TOKENS (tests/test_web_provider.py does)')

const clients = []
function client (token) {
  const created = new YrelayClient(URL, { WebSocketPolyfill: WebSocket, backoff: FAST, token })
  clients.push(created)
  return created
}
after(() => { for (const created of clients) created.destroy() })

test('a token (also from a function, asked on every connect) opens the session', async () => {
  let asked = 0
  const writer = client(async () => { asked++; return tokens.write })
  const doc = new Y.Doc()
  const provider = new YrelayProvider(writer, uniqueDoc('auth'), doc)
  await once(provider, 'synced')
  doc.getText('text').insert(0, 'signed')
  await eventually(() => provider.pending === 0, 'the ack')
  writer._dropSocket()
  await eventually(() => writer.status === 'connected', 'reconnected')
  assert.ok(asked >= 2, 'the token function is asked again on reconnect')
})

test('a read-only token receives, and its updates are refused for good (never retried)', async () => {
  const name = uniqueDoc('auth')
  const writerDoc = new Y.Doc()
  const writer = new YrelayProvider(client(tokens.write), name, writerDoc)
  const readerDoc = new Y.Doc()
  const reader = new YrelayProvider(client(tokens.read), name, readerDoc)
  const errors = []
  reader.on('error', (frame) => errors.push(frame))
  await Promise.all([once(writer, 'synced'), once(reader, 'synced')])
  writerDoc.getText('text').insert(0, 'from the writer')
  await eventually(() => readerDoc.getText('text').toString() === 'from the writer', 'delivery to the reader')
  readerDoc.getText('text').insert(0, 'nope ')
  await eventually(() => errors.some((frame) => frame.code === 'forbidden') && reader.pending === 0, 'the refusal')
  await new Promise((resolve) => setTimeout(resolve, 300))
  assert.equal(writerDoc.getText('text').toString(), 'from the writer')
})

test('a bad token is refused: the error is reported and the session never opens', async () => {
  const bad = client('not-a-token')
  const errors = []
  bad.on('error', (frame) => errors.push(frame))
  await eventually(() => errors.some((frame) => frame.code === 'unauthorized'), 'the refusal')
  assert.notEqual(bad.status, 'connected')
})
