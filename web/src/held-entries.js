/**
 * The client side of a document's drift digest: which stream ids it holds
 * (the JavaScript twin of yrelay/reconciliation/held_entries.py).
 *
 * A client holds the entries delivered to it and the entries its own updates
 * became (`appended.id`), each counted once, above a base `since` it got
 * whole (the snapshot it started from, or the state a resync brought). Its
 * digest over (since, through] must equal the server's over the same window;
 * when the server's window starts later (GC trimmed past `since`), `rebase`
 * drops what the server no longer counts.
 *
 * Memory is bounded by `maxIds`: past it the oldest ids are dropped and the
 * window starts later. That is sound: the window only has to cover the recent
 * tail a failover can lose.
 */
import { itemHash } from './digest.js'
import { ZERO, idKey } from './offsets.js'

/** Ids kept per document before the window's base moves up. */
export const DEFAULT_MAX_IDS = 50000

export class HeldEntries {
  constructor (since = ZERO, maxIds = DEFAULT_MAX_IDS) {
    this.since = since
    this.maxIds = maxIds
    this._sinceKey = idKey(since)
    this._keys = [] // sorted ascending
    this._entries = new Map() // key -> { id, hash }
    this._total = 0n
  }

  get size () { return this._keys.length }

  /** The highest id held (`since` when none is). */
  get last () {
    return this._keys.length ? this._entries.get(this._keys[this._keys.length - 1]).id : this.since
  }

  /** Count `id` once: resent deliveries and duplicate acks repeat ids, and an id XORed twice would cancel. */
  add (id) {
    const key = idKey(id)
    if (key <= this._sinceKey || this._entries.has(key)) return false
    const hash = itemHash(id)
    this._entries.set(key, { id, hash })
    this._total ^= hash
    const keys = this._keys
    if (keys.length === 0 || key > keys[keys.length - 1]) keys.push(key)
    else keys.splice(upperBound(keys, key), 0, key)
    if (keys.length > this.maxIds) this.rebase(this._entries.get(keys[keys.length - this.maxIds - 1]).id)
    return true
  }

  /** Forget ids at or below `since`; the window now starts there. */
  rebase (since) {
    const key = idKey(since)
    if (key <= this._sinceKey) return
    const cut = upperBound(this._keys, key)
    for (const dropped of this._keys.slice(0, cut)) {
      this._total ^= this._entries.get(dropped).hash
      this._entries.delete(dropped)
    }
    this._keys.splice(0, cut)
    this.since = since
    this._sinceKey = key
  }

  /** After a resync to `since`: the base is the server's state there, even if older than what was held. */
  reset (since) {
    this.rebase(since)
    this.since = since
    this._sinceKey = idKey(since)
  }

  /** The held ids in order (for persistence: `new HeldEntries(since)` and `add` restore them). */
  ids () {
    return this._keys.map((key) => this._entries.get(key).id)
  }

  /** `{count, hash}` (hash a BigInt) of the held ids in (since, through]. */
  digest (through) {
    const cut = upperBound(this._keys, idKey(through))
    let hash = this._total
    for (const key of this._keys.slice(cut)) hash ^= this._entries.get(key).hash
    return { count: cut, hash }
  }
}

/** Index of the first element greater than `value` in a sorted array. */
function upperBound (sorted, value) {
  let low = 0
  let high = sorted.length
  while (low < high) {
    const mid = (low + high) >>> 1
    if (sorted[mid] <= value) low = mid + 1
    else high = mid
  }
  return low
}
