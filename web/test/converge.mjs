// A Node "browser" (this package's provider, Yjs) on one document of a
// running server: appends its text, then waits until the document holds
// `expected` (another client's text) and prints what it holds.
// Used by .ci/py313-smoke against a server on CPython 3.13:
//     node web/test/converge.mjs ws://127.0.0.1:PORT/ws DOC "its text" "expected text"
import WebSocket from 'ws'
import * as Y from 'yjs'
import { YrelayProvider } from '../src/index.js'

const [url, name, mine, expected] = process.argv.slice(2)
const doc = new Y.Doc()
const provider = new YrelayProvider(url, name, doc, { batchDelay: 0, clientOptions: { WebSocketPolyfill: WebSocket } })
const text = doc.getText('text')
await new Promise((resolve) => provider.on('synced', (synced) => synced && resolve()))
text.insert(text.length, mine)
const deadline = Date.now() + 30000
while (!text.toString().includes(expected)) {
  if (Date.now() > deadline) throw new Error(`timed out: the document holds ${JSON.stringify(text.toString())}`)
  await new Promise((resolve) => setTimeout(resolve, 20))
}
await new Promise((resolve) => setTimeout(resolve, 300)) // its own edit acked
console.log(text.toString())
provider.destroy()
process.exit(0)
