/** Shared set-up of the provider tests: the live server's URL and small waits. */
import WebSocket from 'ws'
import { Backoff, YrelayClient } from '../src/index.js'

export const SERVER = process.env.YRELAY_WS_URL
if (!SERVER) throw new Error('set YRELAY_WS_URL to a running yrelay server (tests/test_web_provider.py does)')

export const FAST = new Backoff({ base: 20, maxDelay: 300, maxAttempts: 30 })

let counter = 0
/** A document name no other test uses. */
export function uniqueDoc (prefix = 'node') {
  return `${prefix}-${process.pid}-${Date.now()}-${counter++}`
}

/** A client on its own socket (tests need several "browsers"). */
export function newClient (options = {}) {
  return new YrelayClient(SERVER, { WebSocketPolyfill: WebSocket, backoff: FAST, ...options })
}

/** Poll until `predicate()` holds, else fail with `what`. */
export async function eventually (predicate, what = 'condition', timeout = 10000) {
  const deadline = Date.now() + timeout
  while (!predicate()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise((resolve) => setTimeout(resolve, 10))
  }
}

export function once (observable, event) {
  return new Promise((resolve) => {
    const handler = (...args) => { observable.off(event, handler); resolve(args) }
    observable.on(event, handler)
  })
}
