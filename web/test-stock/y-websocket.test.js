/**
 * The STOCK y-websocket client (2.1.0; 1.5.4 and 3.1.0 through tests/stock/version.mjs) against yrelay's /yws endpoint, next to
 * yrelay's own provider on /ws (started by tests/test_yws_stock.py).
 */
import { readFileSync } from 'node:fs'
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import * as Y from 'yjs'
import WebSocket from 'ws'
import { WebsocketProvider } from 'y-websocket'
import { YrelayProvider } from '../src/index.js'
import { clientsOfThisFile, eventually, once, uniqueDoc } from '../test/helpers.js'

const BASE = process.env.YRELAY_WS_URL.replace(/\/ws$/, '')
const AUTH_BASE = process.env.YRELAY_AUTH_WS_URL.replace(/\/ws$/, '')
const tokens = JSON.parse(process.env.YRELAY_AUTH_TOKENS)
const client = clientsOfThisFile()
// Which stock version this run has (tests/test_yws_stock.py checks it).
const stockVersion = JSON.parse(readFileSync(new URL('../package.json', import.meta.resolve('y-websocket')))).version
console.log(`stock y-websocket ${stockVersion}`)

const providers = []
// y-websocket 2.1.0 does not destroy the awareness it made (its timer would keep node alive).
after(() => { for (const provider of providers) { provider.destroy(); provider.awareness?.destroy() } })

/** `new WebsocketProvider(url + '/yws', room, doc)`: the one change an existing app makes (disableBc:
 * these providers stand for different browsers, not tabs of one that share a BroadcastChannel). */
function stock (room, options = {}, base = BASE) {
  const doc = new Y.Doc()
  const provider = new WebsocketProvider(`${base}/yws`, room, doc, { WebSocketPolyfill: WebSocket, disableBc: true, ...options })
  providers.push(provider)
  return { doc, provider }
}

function yrelay (room) {
  const doc = new Y.Doc()
  const provider = new YrelayProvider(client(), room, doc)
  providers.push(provider)
  return { doc, provider }
}

function synced (provider) {
  return provider.synced ? Promise.resolve() : once(provider, 'synced')
}

/** Everything a document holds, comparable. */
function content (doc) {
  return JSON.stringify([doc.getText('text').toString(), doc.getMap('map').toJSON(), doc.getArray('array').toJSON()])
}

test('two stock clients and one yrelay provider converge on text, map and array edits', async () => {
  const room = uniqueDoc('stock')
  const a = stock(room)
  const b = stock(room)
  const c = yrelay(room)
  await Promise.all([synced(a.provider), synced(b.provider), synced(c.provider)])
  a.doc.getText('text').insert(0, 'from stock a. ')
  b.doc.getMap('map').set('b', 1)
  c.doc.getArray('array').push(['from yrelay'])
  c.doc.getText('text').insert(0, 'from yrelay. ')
  b.doc.getArray('array').push([{ nested: true }])
  await eventually(() => content(a.doc) === content(b.doc) && content(b.doc) === content(c.doc) &&
    c.doc.getArray('array').length === 2 && c.doc.getText('text').length === 27, 'convergence')
  // A late stock client gets it all from the snapshot and stream.
  const late = stock(room)
  await synced(late.provider)
  await eventually(() => content(late.doc) === content(c.doc), 'the late client')
})

test('a stock client that was offline reconnects, and both directions merge', async () => {
  const room = uniqueDoc('stock')
  const a = stock(room)
  const c = yrelay(room)
  await Promise.all([synced(a.provider), synced(c.provider)])
  a.doc.getText('text').insert(0, 'base')
  await eventually(() => c.doc.getText('text').toString() === 'base', 'base')
  a.provider.disconnect()
  a.doc.getText('text').insert(4, ' offline-stock')
  c.doc.getText('text').insert(0, 'online-yrelay ')
  await new Promise((resolve) => setTimeout(resolve, 300))
  assert.ok(!c.doc.getText('text').toString().includes('offline'))
  a.provider.connect()
  await eventually(() => content(a.doc) === content(c.doc) &&
    c.doc.getText('text').toString() === 'online-yrelay base offline-stock', 'merge after reconnect')
})

test('a read-only token (params: {token}) is refused with permission denied; its edits are not stored', async () => {
  const room = 'ro-' + uniqueDoc('stock')
  const writer = stock(room, { params: { token: tokens.write } }, AUTH_BASE)
  // 1.5.x has no `protocols` option: its token can only be a URL parameter.
  const readerAuth = stockVersion.startsWith('1.')
    ? { params: { token: tokens.read } }
    : { protocols: ['yrelay.yws', `yrelay.auth.${tokens.read}`] }
  const reader = stock(room, readerAuth, AUTH_BASE)
  await Promise.all([synced(writer.provider), synced(reader.provider)])
  writer.doc.getText('text').insert(0, 'written')
  await eventually(() => reader.doc.getText('text').toString() === 'written', 'the reader receives')
  const warnings = []
  const warn = console.warn
  console.warn = (...args) => warnings.push(args.join(' '))
  try {
    reader.doc.getText('text').insert(0, 'never stored ')
    await eventually(() => warnings.some((line) => line.includes('read-only')), 'permission denied')
  } finally {
    console.warn = warn
  }
  writer.doc.getText('text').insert(7, '!')
  const fresh = stock(room, { params: { token: tokens.read } }, AUTH_BASE)
  await synced(fresh.provider)
  await eventually(() => fresh.doc.getText('text').toString() === 'written!', () => 'the stored document: ' + fresh.doc.getText('text').toString() + ' writer ' + writer.doc.getText('text').toString() + ' ' + writer.provider.wsconnected)
  assert.equal(fresh.doc.getText('text').toString(), 'written!')
})

test('presence crosses between /yws and /ws clients', async () => {
  const room = uniqueDoc('stock')
  const a = stock(room)
  const c = yrelay(room)
  await Promise.all([synced(a.provider), synced(c.provider)])
  a.provider.awareness.setLocalStateField('user', { name: 'stock' })
  c.provider.awareness.setLocalStateField('user', { name: 'yrelay' })
  await eventually(() => c.provider.awareness.getStates().get(a.doc.clientID)?.user?.name === 'stock', '/yws -> /ws')
  await eventually(() => a.provider.awareness.getStates().get(c.doc.clientID)?.user?.name === 'yrelay', '/ws -> /yws')
})
