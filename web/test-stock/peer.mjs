/**
 * One stock y-websocket 2.1.0 peer for tests/test_yws_stock.py's kill -9 test:
 *   node peer.mjs write <base> <room> <text>: insert <text>; exit once a second
 *     stock client has received it (so it is stored: others get it only from the stream)
 *   node peer.mjs read <base> <room>: print the document's text once synced
 */
import * as Y from 'yjs'
import WebSocket from 'ws'
import { WebsocketProvider } from 'y-websocket'

const [mode, base, room, text] = process.argv.slice(2)
const peers = []
function peer () {
  const doc = new Y.Doc()
  const provider = new WebsocketProvider(`${base}/yws`, room, doc, { WebSocketPolyfill: WebSocket, disableBc: true })
  peers.push(provider)
  return { doc, provider, synced: new Promise((resolve) => provider.once('synced', resolve)) }
}
const until = async (predicate) => { while (!predicate()) await new Promise((resolve) => setTimeout(resolve, 10)) }
const done = (line) => {
  console.log(line)
  for (const provider of peers) { provider.destroy(); provider.awareness.destroy() }
}

const timer = setTimeout(() => { console.log('TIMEOUT'); process.exit(2) }, 20000)
const a = peer()
await a.synced
if (mode === 'write') {
  const b = peer()
  await b.synced
  a.doc.getText('text').insert(a.doc.getText('text').length, text)
  await until(() => b.doc.getText('text').toString().includes(text))
  done('stored')
} else {
  done(JSON.stringify(a.doc.getText('text').toString()))
}
clearTimeout(timer)
