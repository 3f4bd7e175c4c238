/**
 * The browser bundle of 2455dc5 (tests/compat/yrelay-client.js, before issue
 * 15's protocol features) against today's server, on one document with
 * today's provider: both converge and every edit of both is acked. The old
 * bundle carries its own Yjs (exported as Y), as a page loading it would.
 */
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import WebSocket from 'ws'
import * as Old from '../../tests/compat/yrelay-client.js'
import { FAST, SERVER, bind, eventually, newClient, once, uniqueDoc } from './helpers.js'

const clients = []
after(() => { for (const created of clients) created.destroy() })

test('the bundle of 2455dc5 and today\'s provider converge on one document', async () => {
  const name = uniqueDoc('compat')
  const oldClient = new Old.YrelayClient(SERVER, { WebSocketPolyfill: WebSocket, backoff: new Old.Backoff(FAST) })
  const newClientSocket = newClient()
  clients.push(oldClient, newClientSocket)
  const oldDoc = new Old.Y.Doc()
  const oldProvider = new Old.YrelayProvider(oldClient, name, oldDoc)
  const current = bind(newClientSocket, name)
  await Promise.all([once(oldProvider, 'synced'), once(current.provider, 'synced')])
  const oldText = oldDoc.getText('text')
  for (let i = 0; i < 20; i++) {
    oldText.insert(oldText.length, `old${i} `)
    current.text.insert(0, `new${i} `)
    if (i % 5 === 4) await new Promise((resolve) => setTimeout(resolve, 20))
  }
  await eventually(() => oldProvider.pending === 0 && current.provider.pending === 0 &&
    oldText.toString() === current.text.toString(), 'convergence')
  for (let i = 0; i < 20; i++) {
    assert.match(current.text.toString(), new RegExp(`old${i} `))
    assert.match(oldText.toString(), new RegExp(`new${i} `))
  }
  const errors = []
  oldProvider.on('error', (frame) => errors.push(frame))
  oldClient._dropSocket() // the old client resumes its session too
  oldText.insert(0, 'after the reconnect ')
  await eventually(() => oldClient.status === 'connected' && oldProvider.pending === 0 &&
    current.text.toString().startsWith('after the reconnect '), 'delivery after the old client reconnected')
  assert.deepEqual(errors, [])
})
