/**
 * `synced` means the document holds the server's state (docs/web.md): the
 * provider says so only after the server's `synced` frame, so the usual "if
 * the document is empty once synced, insert a template" never duplicates
 * content. Against a live server: a document of 5,000 updates and no
 * snapshot, and one with a GC snapshot plus newer updates.
 */
import { test } from 'node:test'
import assert from 'node:assert/strict'
import * as Y from 'yjs'
import { bind, clientsOfThisFile, eventually, once, ops, uniqueDoc } from './helpers.js'

const client = clientsOfThisFile()

/** Store `count` updates (one per word, each its own stream entry) through a provider's socket; returns the text. */
async function seed (name, count, prefix, source = new Y.Doc()) {
  const seeder = client()
  const bound = bind(seeder, name, { awareness: null })
  await once(bound.provider, 'synced')
  const updates = []
  source.on('update', (update) => updates.push(update))
  const text = source.getText('text')
  for (let i = 0; i < count; i++) text.insert(text.length, `${prefix}${i} `)
  for (const update of updates) seeder.enqueue(name, update) // one clock each, pipelined
  await eventually(() => seeder.pending === 0, `${count} acks`, 60000)
  seeder.destroy() // the seeder leaves the tracker: GC may fold past it
  return text.toString()
}

/** Bind a new provider; the text it holds at the moment it first says synced. */
async function textWhenSynced (name) {
  const { doc, provider } = bind(client(), name, { awareness: null })
  return new Promise((resolve) => {
    provider.on('synced', (synced) => { if (synced) resolve(doc.getText('text').toString()) })
  })
}

test('synced fires only once the text is there: 5,000 updates and no snapshot', async () => {
  const name = uniqueDoc('synced-many')
  const expected = await seed(name, 5000, 'w')
  assert.ok(expected.length > 25000)
  const atSynced = await textWhenSynced(name)
  assert.equal(atSynced.length, expected.length)
  assert.ok(atSynced === expected)
})

test('synced fires only once the text is there: a GC snapshot plus newer updates', async () => {
  const name = uniqueDoc('synced-snapshot')
  const source = new Y.Doc()
  await seed(name, 300, 'old', source)
  const gc = await ops('/ops/gc', { doc: name })
  assert.ok(gc.folded > 0, JSON.stringify(gc))
  const expected = await seed(name, 1000, 'new', source)
  const atSynced = await textWhenSynced(name)
  assert.equal(atSynced.length, expected.length)
  assert.ok(atSynced === expected)
})

test('an empty document is synced once subscribed, and the template pattern inserts once', async () => {
  const name = uniqueDoc('synced-empty')
  const first = bind(client(), name)
  await once(first.provider, 'synced')
  if (first.text.length === 0) first.text.insert(0, 'template')
  await eventually(() => first.provider.pending === 0, 'ack')
  const second = bind(client(), name)
  await once(second.provider, 'synced')
  if (second.text.length === 0) second.text.insert(0, 'template')
  await eventually(() => second.provider.pending === 0 && first.text.toString() === second.text.toString(), 'convergence')
  assert.equal(second.text.toString(), 'template')
})
