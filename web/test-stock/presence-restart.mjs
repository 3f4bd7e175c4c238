/**
 * Presence across server restarts with STOCK y-websocket 2.1.0 clients
 * (issue 36, item 2), driven by tests/test_yws_presence_restart.py over
 * stdin/stdout (one JSON object a line each way).
 *
 * PRESENCE_CONFIG (JSON): {pairs: [{name, server, base, room, a, b, mallory?}]}
 * where a, b and mallory are {params, headers, base?} of a client (params:
 * the provider's URL parameters, ?token=; headers: X-Forwarded-For behind a
 * trusted proxy; base: another server than the pair's, which is not
 * restarted: that client stays connected). Each pair is two stock
 * providers, alice and bob; a pair with `mallory` is also attacked by a
 * third client (another subject, or another address with auth off)
 * announcing alice's clientID.
 *
 * Commands (stdin):  kill <round>   the servers are about to be stopped
 *                    up <server>    that server answers again
 *                    quit
 * Events (stdout):   ready, spoof, seen, round, summary
 *
 * A stock client ignores a state whose awareness clock has not moved, so a
 * reconnecting client is seen again only at its next renewal (y-protocols
 * renews after 15 s, checked every 3 s). So that every pair renews at the
 * same 3 s tick (and the comparison with y-websocket's server measures the
 * servers, not the clients' phases), every client's last renewal is
 * backdated by a second when a round begins: each renews exactly 15 s
 * after its last renewal (the worst case the issue names).
 */
import readline from 'node:readline'
import * as Y from 'yjs'
import WebSocket from 'ws'
import { WebsocketProvider } from 'y-websocket'
import * as awarenessProtocol from 'y-protocols/awareness'
import * as encoding from 'lib0/encoding'

const MESSAGE_AWARENESS = 1
const { pairs } = JSON.parse(process.env.PRESENCE_CONFIG)
const providers = []
const emit = (event) => console.log(JSON.stringify(event))
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))
const until = async (predicate) => { while (!predicate()) await sleep(10) }
const seconds = (since) => Math.round(performance.now() - since) / 1000

/** A `ws` class that sends `headers` (the stock provider takes a WebSocket class). */
const socketWith = (headers = {}) => class extends WebSocket {
  constructor (url, protocols) { super(url, protocols, { headers }) }
}

function url (pair, client) {
  const query = new URLSearchParams(client.params || {}).toString()
  return `${client.base || pair.base}/yws/${pair.room}${query ? '?' + query : ''}`
}

function stock (pair, client, name) {
  const doc = new Y.Doc()
  const provider = new WebsocketProvider(`${client.base || pair.base}/yws`, pair.room, doc, {
    WebSocketPolyfill: socketWith(client.headers), params: client.params || {}, disableBc: true
  })
  provider.awareness.setLocalState({ user: { name } })
  provider.on('status', ({ status }) => { if (status === 'connected') provider.connectedAt = performance.now() })
  providers.push(provider)
  return provider
}

/** What `viewer` knows of `clientID`'s user name. */
const nameOf = (viewer, clientID) => viewer.awareness.getStates().get(clientID)?.user?.name
const seeEachOther = (pair) =>
  nameOf(pair.alice, pair.bob.doc.clientID) === 'bob' && nameOf(pair.bob, pair.alice.doc.clientID) === 'alice'

// Every provider is made in one go: their awareness timers tick together.
for (const pair of pairs) {
  pair.alice = stock(pair, pair.a, 'alice')
  pair.bob = stock(pair, pair.b, 'bob')
}
const violations = []
for (const pair of pairs.filter((p) => p.mallory && !p.control)) {
  // A spoof that got through shows at bob's, or overwrites alice's own state.
  for (const viewer of [pair.alice, pair.bob]) {
    viewer.awareness.on('change', () => {
      if (nameOf(viewer, pair.alice.doc.clientID) === 'mallory') violations.push({ pair: pair.name, at: performance.now() })
    })
  }
}

function awarenessMessage (clientID, clock, state) {
  const awareness = new awarenessProtocol.Awareness(new Y.Doc())
  awareness.clientID = clientID
  awareness.meta.set(clientID, { clock, lastUpdated: Date.now() })
  awareness.states.set(clientID, state)
  const encoder = encoding.createEncoder()
  encoding.writeVarUint(encoder, MESSAGE_AWARENESS)
  encoding.writeVarUint8Array(encoder, awarenessProtocol.encodeAwarenessUpdate(awareness, [clientID]))
  awareness.destroy()
  return encoding.toUint8Array(encoder)
}

let spoofs = 0
/** Mallory's socket announces alice's clientID at a clock far ahead of
 * hers, then a clientID of its own: once bob sees the second, the server
 * has handled the first (one connection's messages are handled in order,
 * and whatever it relays reaches bob in order). */
async function spoof (pair, when) {
  const own = 1_000_000_000 + process.pid * 100 + spoofs
  spoofs += 1
  const victim = pair.alice.doc.clientID
  const Socket = socketWith(pair.mallory.headers)
  for (;;) {
    const ws = new Socket(url(pair, pair.mallory))
    const opened = await new Promise((resolve) => { ws.onopen = () => resolve(true); ws.onerror = () => resolve(false) })
    if (!opened) { await sleep(50); continue }
    ws.send(awarenessMessage(victim, 1_000_000 + spoofs, { user: { name: 'mallory' } }))
    ws.send(awarenessMessage(own, 1, { user: { name: 'mallory-own' } }))
    await until(() => nameOf(pair.bob, own) === 'mallory-own')
    emit({ event: 'spoof', pair: pair.name, when, taken: nameOf(pair.bob, victim) === 'mallory' })
    ws.close()
    return
  }
}

/** One restart: every pair loses its sockets, then sees each other again. */
async function round (label) {
  const killed = performance.now()
  for (const provider of providers) provider.awareness.meta.get(provider.doc.clientID).lastUpdated -= 1000
  await Promise.all(pairs.filter((pair) => !pair.control).map(async (pair) => {
    pair.up = null
    await until(() => !pair.alice.wsconnected && (pair.b.base !== undefined || !pair.bob.wsconnected))
    await until(() => seeEachOther(pair))
    emit({ event: 'seen', round: label, pair: pair.name, server: pair.server,
           after_kill: seconds(killed), after_up: pair.up === null ? null : seconds(pair.up),
           after_reconnect: seconds(Math.max(pair.alice.connectedAt, pair.bob.connectedAt)) })
  }))
  emit({ event: 'round', round: label })
}

await until(() => pairs.every(seeEachOther))
for (const pair of pairs.filter((p) => p.mallory)) await spoof(pair, 'start')
emit({ event: 'ready', clients: Object.fromEntries(pairs.map((p) => [p.name, [p.alice.doc.clientID, p.bob.doc.clientID]])) })

const spoofing = []
for await (const line of readline.createInterface({ input: process.stdin })) {
  const [command, argument] = line.trim().split(' ')
  if (command === 'kill') {
    round(argument)
  } else if (command === 'up') {
    for (const pair of pairs.filter((p) => p.server === argument && !p.control)) {
      pair.up = performance.now()
      if (pair.mallory) spoofing.push(spoof(pair, 'restart'))  // while alice is still reconnecting
    }
  } else if (command === 'quit') {
    break
  }
}
await Promise.all(spoofing)
emit({ event: 'summary', violations })
for (const provider of providers) { provider.destroy(); provider.awareness.destroy() }
process.exit(0)
