/** Shared set-up of the provider tests: the live server's URL and small waits. */
import net from 'node:net'
import { after } from 'node:test'
import WebSocket from 'ws'
import * as Y from 'yjs'
import { Backoff, YrelayClient, YrelayProvider } from '../src/index.js'

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

/** `client(options)` for a test file: each a new socket, all destroyed after the file's tests. */
export function clientsOfThisFile () {
  const clients = []
  after(() => { for (const created of clients) if (!created._destroyed) created.destroy() })
  return (options) => {
    const created = newClient(options)
    clients.push(created)
    return created
  }
}

/** Poll until `predicate()` holds, else fail with `what`. */
export async function eventually (predicate, what = 'condition', timeout = 10000) {
  const deadline = Date.now() + timeout
  while (!predicate()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${typeof what === "function" ? what() : what}`)
    await new Promise((resolve) => setTimeout(resolve, 10))
  }
}

export function once (observable, event) {
  return new Promise((resolve) => {
    const handler = (...args) => { observable.off(event, handler); resolve(args) }
    observable.on(event, handler)
  })
}

/** One command to the redis-server behind the test server (RESP over TCP: Node has no Redis client here). */
export function redisCommand (...args) {
  const url = new URL(process.env.YRELAY_REDIS_URL)
  return new Promise((resolve, reject) => {
    const socket = net.connect(Number(url.port), url.hostname)
    let reply = ''
    socket.on('data', (chunk) => {
      reply += chunk
      if (!reply.endsWith('\r\n')) return
      socket.end()
      if (reply.startsWith('-')) reject(new Error(reply.trim()))
      else resolve(reply.trim())
    })
    socket.on('error', reject)
    socket.write(`*${args.length}\r\n${args.map((arg) => `$${Buffer.byteLength(String(arg))}\r\n${arg}\r\n`).join('')}`)
  })
}

/** Redis refuses every write (as with too few replicas) while `body` runs: appends fail, reads work. */
export async function writesRefused (body) {
  await redisCommand('CONFIG', 'SET', 'min-replicas-to-write', '1')
  try {
    return await body()
  } finally {
    await redisCommand('CONFIG', 'SET', 'min-replicas-to-write', '0')
  }
}

/** POST to the test server's ops API (its token comes from tests/test_web_provider.py). */
export async function ops (path, body) {
  const base = SERVER.replace(/^ws/, 'http').replace(/\/ws$/, '')
  const response = await fetch(base + path, {
    method: 'POST',
    headers: { authorization: `Bearer ${process.env.YRELAY_OPS_TOKEN}`, 'content-type': 'application/json' },
    body: JSON.stringify(body)
  })
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status} ${await response.text()}`)
  return response.json()
}

/** Bind a fresh Y.Doc to `name` through `client`. */
export function bind (client, name, options) {
  const doc = new Y.Doc()
  const provider = new YrelayProvider(client, name, doc, options)
  return { doc, provider, text: doc.getText('text') }
}

/** Record the frames a client writes and the errors it gets. */
export function spy (yclient) {
  const written = []
  const errors = []
  const write = yclient._write.bind(yclient)
  yclient._write = (frame) => { written.push(frame); return write(frame) }
  yclient.on('error', (frame) => errors.push(frame))
  const updates = (doc) => written.filter((frame) => frame.op === 'update' && (doc === undefined || frame.doc === doc))
  return { written, errors, updates: (doc) => updates(doc).map((frame) => frame.clock) }
}
