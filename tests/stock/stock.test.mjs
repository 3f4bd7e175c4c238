/**
 * Stock y-websocket clients of each major version (1.5.4, 2.1.0, 3.1.0, from
 * npm through package.json's aliases) against a live yrelay /yws, started by
 * tests/test_yws_versions.py (issue 36):
 *   - rooms named as apps like (YRELAY_ROOMS, JSON) work for every version and
 *     across versions;
 *   - a room no document id can hold (YRELAY_REFUSED_ROOM) is refused once:
 *     one permission denied, one socket, no reconnect loop;
 *   - a lone client of each version stays connected with 0 closes for
 *     YRELAY_LONE_SECONDS (longer than y-websocket's 30 s silence timeout).
 */
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import * as Y from 'yjs'
import WebSocket from 'ws'
import { WebsocketProvider as V1 } from 'y-websocket-1'
import { WebsocketProvider as V2 } from 'y-websocket-2'
import { WebsocketProvider as V3 } from 'y-websocket-3'

const BASE = process.env.YRELAY_YWS_URL
const ROOMS = JSON.parse(process.env.YRELAY_ROOMS)
const REFUSED_ROOM = process.env.YRELAY_REFUSED_ROOM
const LONE_SECONDS = Number(process.env.YRELAY_LONE_SECONDS || 45)
const VERSIONS = { '1.5.4': V1, '2.1.0': V2, '3.1.0': V3 }

/** Every permission denied a provider printed (y-websocket's only report of it: console.warn). */
const warnings = []
const warn = console.warn
console.warn = (...args) => { warnings.push(args.join(' ')); warn(...args) }

const providers = []
after(() => { for (const provider of providers) { provider.destroy(); provider.awareness.destroy() } })

/** `new WebsocketProvider(BASE + '/yws', room, doc)` of one version, with what it went through. */
function stock (version, room) {
  const doc = new Y.Doc()
  const provider = new VERSIONS[version](`${BASE}/yws`, room, doc, { WebSocketPolyfill: WebSocket, disableBc: true })
  providers.push(provider)
  const seen = { connected: 0, closes: 0, synced: 0 }
  provider.on('status', ({ status }) => { if (status === 'connected') seen.connected++ })
  provider.on('connection-close', () => { seen.closes++ })
  provider.on('sync', (synced) => { if (synced) seen.synced++ })
  return { version, doc, provider, seen, text: () => doc.getText('text').toString() }
}

async function eventually (predicate, what, timeout = 20000) {
  const deadline = Date.now() + timeout
  while (!predicate()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${typeof what === 'function' ? what() : what}`)
    await new Promise((resolve) => setTimeout(resolve, 20))
  }
}

const synced = (client) => eventually(() => client.provider.synced, `${client.version} synced`)

test('every version names rooms with spaces, unicode, %, / and {, and they meet in one document', async () => {
  for (const room of ROOMS) {
    const clients = Object.keys(VERSIONS).map((version) => stock(version, room))
    await Promise.all(clients.map(synced))
    for (const client of clients) client.doc.getText('text').insert(0, `[${client.version}]`)
    await eventually(() => clients.every((client) => client.text().length === 21 && client.text() === clients[0].text()),
      () => `convergence in ${JSON.stringify(room)}: ${clients.map((client) => client.text()).join(' | ')}`)
    for (const client of clients) assert.equal(client.seen.closes, 0, `${client.version} in ${JSON.stringify(room)}`)
  }
  console.log('ROOMS-DONE')
})

test(`a room no id can hold is refused once, and lone clients stay connected for ${LONE_SECONDS} s`, async () => {
  const refused = Object.keys(VERSIONS).map((version) => stock(version, REFUSED_ROOM))
  const lone = Object.keys(VERSIONS).map((version) => stock(version, `lone ${version}`))
  await Promise.all(lone.map(synced))
  const denied = () => warnings.filter((line) => line.includes('Permission denied') && line.includes(REFUSED_ROOM))
  await eventually(() => denied().length >= refused.length, 'the refusals')
  const started = Date.now()
  // The condition is time itself: longer than y-websocket's 30 s silence timeout and its 2.5 s reconnect backoff.
  await new Promise((resolve) => setTimeout(resolve, LONE_SECONDS * 1000))
  const seconds = (Date.now() - started) / 1000
  for (const client of lone) {
    assert.deepEqual(client.seen, { connected: 1, closes: 0, synced: 1 }, `lone ${client.version}`)
    assert.ok(client.provider.wsconnected && client.provider.synced, `lone ${client.version} still connected`)
  }
  for (const client of refused) {
    assert.deepEqual(client.seen, { connected: 1, closes: 0, synced: 0 }, `refused ${client.version}`)
  }
  assert.equal(denied().length, refused.length, denied().join('\n'))
  console.log(`LONE ${JSON.stringify({ seconds, lone: lone.map((c) => [c.version, c.seen]), refused: refused.map((c) => [c.version, c.seen]) })}`)
})
