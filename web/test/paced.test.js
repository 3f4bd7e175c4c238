/**
 * Resends against a server that slows the client down (issue 30): the test
 * server at YRELAY_PACED_WS_URL (tests/test_web_provider.py) takes a
 * session's updates at 50 per second after a burst of 10, reading the socket
 * more slowly and answering in order. An update whose answer is merely late
 * behind the paced ones is not resent while answers keep coming
 * (send-buffer.js); every update is acked and nothing is refused.
 */
import { test } from 'node:test'
import assert from 'node:assert/strict'
import WebSocket from 'ws'
import { Backoff, YrelayClient } from '../src/index.js'
import { bind, eventually, once, spy, uniqueDoc } from './helpers.js'

const PACED = process.env.YRELAY_PACED_WS_URL
if (!PACED) throw new Error('set YRELAY_PACED_WS_URL to a yrelay server with low update rates (tests/test_web_provider.py does)')

const EDITS = 300
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

test('a client the server slows down does not resend what is merely answered late', async () => {
  // The default schedule: first resends after 125 to 250 ms, where the last
  // of 300 updates is answered ~6 s after it was sent.
  const yclient = new YrelayClient(PACED, { WebSocketPolyfill: WebSocket, backoff: new Backoff() })
  const sent = spy(yclient)
  try {
    const name = uniqueDoc('paced')
    const a = bind(yclient, name, { batchDelay: 0 })
    await once(a.provider, 'synced')
    for (let i = 0; i < EDITS; i++) {
      a.text.insert(0, 'x')
      await sleep(1) // after the provider's flush (setTimeout 0): each edit its own update
    }
    await eventually(() => a.provider.pending === 0, 'every update acked', 60000)
    const clocks = sent.updates(name)
    const updates = new Set(clocks).size
    const resends = clocks.length - updates
    assert.deepEqual(sent.errors, [])
    assert.equal(a.text.length, EDITS)
    assert.ok(updates >= EDITS * 0.9, `${EDITS} edits went out as ${updates} updates: the server was not pacing many`)
    // Before the change: each update's answer waited behind the paced ones longer than its backoff delay.
    assert.ok(resends <= updates * 0.05, `${resends} resends in ${clocks.length} update frames of ${updates} updates`)
  } finally {
    yclient.destroy()
  }
})
