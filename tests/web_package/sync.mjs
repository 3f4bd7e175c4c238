/**
 * An app's script (run from a fresh npm app where @yrelay/client was
 * installed from its tarball, with the app's own yjs and ws): two providers
 * on two sockets, one writes, the other must read it through the server with
 * the app's Yjs types. Prints one JSON line for tests/test_web_package.py.
 */
import * as Y from 'yjs'
import WebSocket from 'ws'
import { YrelayClient, YrelayProvider } from '@yrelay/client'

const url = process.env.YRELAY_WS_URL
const name = `package-${process.pid}-${Date.now()}`

function bind () {
  const doc = new Y.Doc()
  const socket = new YrelayClient(url, { WebSocketPolyfill: WebSocket })
  return { doc, socket, provider: new YrelayProvider(socket, name, doc, { awareness: null }) }
}

async function eventually (predicate, what) {
  const deadline = Date.now() + 20000
  while (!predicate()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await new Promise((resolve) => setTimeout(resolve, 10))
  }
}

const writer = bind()
const reader = bind()
await eventually(() => writer.provider.synced && reader.provider.synced, 'both providers synced')
writer.doc.transact(() => {
  writer.doc.getText('text').insert(0, 'written through the packed client')
  writer.doc.getMap('map').set('nested', new Y.Text('a nested text'))
})
await eventually(() => writer.provider.pending === 0, 'the writer\'s update acked')
await eventually(() => reader.doc.getMap('map').has('nested'), 'the update delivered to the reader')
const nested = reader.doc.getMap('map').get('nested')
console.log(JSON.stringify({
  text: reader.doc.getText('text').toString(),
  textIsYText: reader.doc.share.get('text') instanceof Y.Text,
  nestedIsYText: nested instanceof Y.Text,
  nested: String(nested)
}))
for (const side of [writer, reader]) side.socket.destroy()
