/**
 * Slow-down closes (issue 30): a real websocket peer (the `ws` server, no
 * yrelay server) welcomes the client, says `rate_limited` without doc and
 * clock, and closes with 4429, as the server does past its hard bound. The
 * client must reconnect no sooner than `retry_after_ms`, and repeated 4429s
 * soon after the welcome must back off exponentially instead of restarting
 * at the first step. Only lower bounds on the gaps: the machine is noisy.
 */
import { test } from 'node:test'
import assert from 'node:assert/strict'
import WebSocket, { WebSocketServer } from 'ws'
import { Backoff, YrelayClient } from '../src/index.js'

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

/**
 * A peer that answers `hello` with a welcome (the real server's fields), then
 * runs `script(socket, index)` for the index-th connection. It records when
 * each connection arrived and when it closed one.
 */
async function peer (script) {
  const server = new WebSocketServer({ port: 0, host: '127.0.0.1' })
  await new Promise((resolve) => server.once('listening', resolve))
  const state = { opened: [], closed: [], server, url: `ws://127.0.0.1:${server.address().port}/ws` }
  server.on('connection', (socket) => {
    const index = state.opened.push(Date.now()) - 1
    socket.on('message', (data) => {
      const frame = JSON.parse(String(data))
      if (frame.op !== 'hello') return
      socket.send(JSON.stringify({
        op: 'welcome', session: 'slow-down-session', resumed: index > 0, protocol: 1,
        limits: { max_frame_bytes: 1572864, max_update_bytes: 16777216 },
        auth: { mode: 'disabled', subject: null, permission: 'write' }, features: ['strict_types', 'synced']
      }))
      script(socket, index, state)
    })
  })
  return state
}

/** The server's 4429: an error frame without doc and clock, then the close. */
function flooded (socket, state, retryAfterMs) {
  if (retryAfterMs !== null) {
    socket.send(JSON.stringify({
      op: 'error', code: 'rate_limited', retry_after_ms: retryAfterMs,
      message: `too many messages: slow down, reconnect no sooner than ${retryAfterMs} ms`
    }))
  }
  state.closed.push(Date.now())
  socket.close(4429, 'too many messages')
}

async function until (predicate, what, ms = 20000) {
  const deadline = Date.now() + ms
  while (!predicate()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await sleep(10)
  }
}

/** ms from the close of connection i to the arrival of connection i + 1. */
const gaps = (state) => state.closed.slice(0, state.opened.length - 1).map((closed, i) => state.opened[i + 1] - closed)

function client (url, backoff) {
  return new YrelayClient(url, { WebSocketPolyfill: WebSocket, backoff: new Backoff(backoff) })
}

test('4429 after rate_limited: reconnects no sooner than retry_after_ms (1 s without one); the app sees the error', async () => {
  // The first close says 600 ms, the second none (1 s by default); the third connection stays.
  const state = await peer((socket, index, state) => { if (index < 2) flooded(socket, state, index === 0 ? 600 : null) })
  const yrelay = client(state.url, { base: 20, factor: 2, maxDelay: 20, jitter: 0 })
  const errors = []
  yrelay.on('error', (frame) => errors.push(frame))
  try {
    await until(() => state.opened.length >= 3 && yrelay.status === 'connected', 'the third connection')
    const [first, second] = gaps(state)
    assert.ok(first >= 590, `reconnected ${first} ms after a 4429 with retry_after_ms 600`)
    assert.ok(second >= 990, `reconnected ${second} ms after a 4429 without retry_after_ms`)
    assert.equal(errors.length, 1, JSON.stringify(errors))
    assert.equal(errors[0].code, 'rate_limited')
    assert.equal(errors[0].retry_after_ms, 600)
    assert.equal(yrelay.pending, 0, 'an error without a clock touches no update')
  } finally {
    yrelay.destroy()
    state.server.close()
  }
})

test('repeated 4429s soon after the welcome back off exponentially (the welcome does not reset the backoff)', async () => {
  const closes = 5
  const state = await peer((socket, index, state) => { if (index < closes) flooded(socket, state, 30) })
  const base = 100
  const yrelay = client(state.url, { base, factor: 2, maxDelay: 10000, jitter: 0 })
  try {
    await until(() => state.opened.length > closes && yrelay.status === 'connected', `${closes + 1} connections`)
    const measured = gaps(state)
    assert.equal(measured.length, closes)
    // Without the fix every gap would be backoff(0) = 100 ms.
    measured.forEach((gap, attempt) => {
      assert.ok(gap >= base * 2 ** attempt - 10, `gap ${attempt}: ${gap} ms, expected >= ${base * 2 ** attempt} (all: ${measured})`)
    })
  } finally {
    yrelay.destroy()
    state.server.close()
  }
})

test('ordinary closes after a welcome still reconnect at the first backoff step', async () => {
  const closes = 5
  const state = await peer((socket, index, state) => {
    if (index < closes) { state.closed.push(Date.now()); socket.close(4000) }
  })
  const yrelay = client(state.url, { base: 100, factor: 2, maxDelay: 10000, jitter: 0 })
  try {
    await until(() => state.opened.length > closes && yrelay.status === 'connected', `${closes + 1} connections`)
    const measured = gaps(state)
    // A growing backoff would wait 1600 ms before the last one; the first step is 100 ms.
    assert.ok(measured[closes - 1] < 1400, `the backoff grew across ordinary closes: ${measured}`)
  } finally {
    yrelay.destroy()
    state.server.close()
  }
})
