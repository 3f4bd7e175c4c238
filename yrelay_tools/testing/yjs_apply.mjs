// Applies each update of a file (one hex per line, update_fuzz --survivors)
// to a fresh Yjs document, the reference engine of the browser clients, and
// prints how many applied, threw, or were applied with content left pending.
//
//     node yrelay_tools/testing/yjs_apply.mjs survivors.txt [path/to/yjs.mjs]
import { readFileSync } from 'node:fs'
import { pathToFileURL } from 'node:url'
import { resolve } from 'node:path'

const [file, yjsPath = 'web/node_modules/yjs/dist/yjs.mjs'] = process.argv.slice(2)
const Y = await import(pathToFileURL(resolve(yjsPath)).href)
const counts = { applied: 0, pending: 0, threw: 0 }
const examples = {}
for (const line of readFileSync(file, 'utf8').split('\n')) {
  if (!line) continue
  const update = Buffer.from(line, 'hex')
  const doc = new Y.Doc()
  let verdict
  try {
    Y.applyUpdate(doc, new Uint8Array(update))
    verdict = doc.store.pendingStructs || doc.store.pendingDs ? 'pending' : 'applied'
  } catch (error) {
    verdict = 'threw'
    examples[String(error.message).slice(0, 60)] ??= line
  }
  counts[verdict]++
}
console.log(JSON.stringify({ ...counts, total: counts.applied + counts.pending + counts.threw, examples }, null, 1))
