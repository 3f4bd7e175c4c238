/** Pure parts of the provider: digests as the server computes them, held ids, backoff, the send buffer. */
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Backoff, HeldEntries, YrelayClient, hashHex, hashReady, itemHash } from '../src/index.js'
import { SendBuffer } from '../src/send-buffer.js'
import { idKey, maxId } from '../src/offsets.js'

test('xxh3_128 of an id matches the server (values from yrelay.reconciliation.digest)', async () => {
  await hashReady()
  assert.equal(hashHex(itemHash('1700000000000-0')), '8eaaab92245ffa3b68a6d99eda3911fb')
  assert.equal(hashHex(itemHash('doc-é')), 'cddfbead6fffaa59ee31050d622fc7e0')
})

test('held entries: each id counted once, windows, rebase and reset', async () => {
  await hashReady()
  const held = new HeldEntries()
  for (const id of ['5-0', '3-1', '3-0', '5-0', '9-2']) held.add(id)
  assert.equal(held.size, 4)
  assert.equal(held.last, '9-2')
  const all = held.digest('9-2')
  assert.equal(all.count, 4)
  assert.equal(all.hash, ['3-0', '3-1', '5-0', '9-2'].map(itemHash).reduce((a, b) => a ^ b))
  assert.deepEqual(held.digest('5-0'), { count: 3, hash: ['3-0', '3-1', '5-0'].map(itemHash).reduce((a, b) => a ^ b) })
  held.rebase('3-1')
  assert.equal(held.since, '3-1')
  assert.deepEqual(held.digest('9-2'), { count: 2, hash: itemHash('5-0') ^ itemHash('9-2') })
  assert.equal(held.add('2-0'), false, 'ids at or below the base are not held')
  held.reset('1-0') // a resync moved the base back: nothing above it is dropped
  assert.equal(held.since, '1-0')
  assert.equal(held.size, 2)
})

test('held entries stay under their cap by moving the base up to the recent tail', async () => {
  await hashReady()
  const held = new HeldEntries('0-0', 4)
  const ids = Array.from({ length: 10 }, (_, i) => `${2000 + i}-0`)
  for (const id of ids) held.add(id)
  assert.equal(held.size, 4)
  assert.equal(held.since, ids[5])
  assert.deepEqual(held.digest(ids[9]), { count: 4, hash: ids.slice(6).map(itemHash).reduce((a, b) => a ^ b) })
})

test('stream ids compare as (ms, seq) and reject what the server never issues', () => {
  assert.ok(idKey('10-0') > idKey('9-999'))
  assert.equal(maxId(null, '1-0'), '1-0')
  assert.equal(maxId('2-0', '1-5'), '2-0')
  for (const bad of ['', '1', '1-1000', 'a-1', '1-1-1', null]) assert.throws(() => idKey(bad))
})

test('backoff grows, is capped and jittered below its nominal value', () => {
  const backoff = new Backoff({ base: 100, factor: 2, maxDelay: 1000, jitter: 0.5 })
  for (let attempt = 0; attempt < 12; attempt++) {
    const nominal = Math.min(100 * 2 ** attempt, 1000)
    for (let i = 0; i < 20; i++) {
      const delay = backoff.delay(attempt)
      assert.ok(delay <= nominal && delay >= nominal / 2, `${delay} for attempt ${attempt}`)
    }
  }
})

test('send buffer: clocks keep increasing, resends follow the schedule, exhaustion is reported', () => {
  const buffer = new SendBuffer(new Backoff({ base: 100, jitter: 0, maxAttempts: 2 }))
  const a = buffer.add('d', new Uint8Array([1]))
  const b = buffer.add('e', new Uint8Array([2]))
  assert.deepEqual([a.clock, b.clock], [1, 2])
  buffer.markSent(a, 1000)
  assert.deepEqual(buffer.due(1050).map((item) => item.clock), [2])
  assert.deepEqual(buffer.due(1100).map((item) => item.clock), [1, 2])
  buffer.markSent(a, 1100)
  assert.equal(buffer.exhausted(), true)
  buffer.resetAttempts()
  assert.equal(buffer.exhausted(), false)
  assert.equal(buffer.pop(1).clock, 1)
  assert.equal(buffer.countFor('e'), 1)
  buffer.restore({ clock: 7, doc: 'e', update: new Uint8Array([3]) })
  assert.equal(buffer.add('e', new Uint8Array([4])).clock, 8, 'a restored clock is never reused')
})

test('send buffer: a rate_limited update waits retry_after_ms, and that send was not an attempt', () => {
  const buffer = new SendBuffer(new Backoff({ base: 10, jitter: 0, maxAttempts: 2 }))
  const item = buffer.add('d', new Uint8Array([1]))
  buffer.markSent(item, 1000)
  buffer.defer(item.clock, 5000, 1000)
  assert.equal(item.attempts, 0)
  assert.deepEqual(buffer.due(5999), [])
  assert.deepEqual(buffer.due(6000).map((i) => i.clock), [item.clock])
})

test('client: a refused connection (overloaded) reconnects no sooner than retry_after_ms', async () => {
  const opened = []
  class Refusing { // accepts, says "overloaded, retry in 300 ms", closes with 1013
    constructor () {
      this.readyState = 0
      opened.push(Date.now())
      setTimeout(() => {
        this.readyState = 1
        this.onopen?.()
        this.onmessage?.({ data: JSON.stringify({ op: 'error', code: 'overloaded', message: 'busy', retry_after_ms: 300 }) })
        this.readyState = 3
        this.onclose?.({ code: 1013 })
      }, 1)
    }

    send () {}
    close () {}
  }
  const client = new YrelayClient('ws://refusing.invalid/ws', {
    WebSocketPolyfill: Refusing, backoff: new Backoff({ base: 1, maxDelay: 5, jitter: 0 })
  })
  const deadline = Date.now() + 5000
  while (opened.length < 3 && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 10))
  client.destroy()
  assert.ok(opened.length >= 3, 'it kept reconnecting')
  assert.ok(opened[1] - opened[0] >= 290 && opened[2] - opened[1] >= 290, `gaps ${opened[1] - opened[0]}, ${opened[2] - opened[1]}`)
})
