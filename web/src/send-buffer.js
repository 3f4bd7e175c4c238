/**
 * Updates sent and not yet acked, keyed by the session's logical clock (the
 * twin of yrelay/client/sendbuffer.py). An update leaves only when the
 * server acks it (`appended`), rejects it for good, or a two-way sync's diff
 * replaces it (`supersede`).
 *
 * The clock must keep increasing for the session's whole life, across
 * reloads too when the buffer is persisted: the server de-duplicates resends
 * by (session, clock), so reusing a clock would drop a new update. For the
 * same reason the bytes behind a clock never change once they were sent:
 * only updates never sent are merged (`coalesce`).
 *
 * Order (docs/protocol.md#causal-admission): Yjs applies one client's
 * content only in clock order, and a server with causal admission stores an
 * update only when the document can apply it. So per document, updates go
 * out in clock order, and one that waits for a resend (refused for now, or
 * unanswered) holds back every later update of its document; updates on the
 * wire that are still within their answer time do not (pipelining), and
 * other documents never wait.
 */

/** To be sent: never sent on this connection, or due again. */
export const QUEUED = 'queued'
/** On the wire; sent again at `nextSend` when still unanswered. */
export const SENT = 'sent'
/** Refused for now (`unavailable`, `rate_limited`, ...): sent again at `nextSend`. */
export const WAITING = 'waiting'
/** `missing_dependency` while earlier updates of its document were unacked: sent again once they are acked. */
export const AFTER_EARLIER = 'after_earlier'
/** `missing_dependency` with nothing earlier unacked: a two-way sync's diff replaces it. */
export const NEEDS_SYNC = 'needs_sync'

/**
 * Bytes per ms of answer time on top of the backoff (1 MB/s): a 16 MiB
 * update is not resent while it is still uploaded and checked.
 */
const ANSWER_BYTES_PER_MS = 1000

export class SendBuffer {
  constructor (backoff, clock = 0) {
    this.backoff = backoff
    this.clock = clock
    this._items = new Map() // clock -> { clock, doc, update, sync, state, attempts, nextSend, sent }
    this._docs = new Map() // doc -> its items in clock order
  }

  get size () { return this._items.size }

  /** A new update of `doc`; `sync`: a two-way sync's diff (`update {sync: true}`). */
  add (doc, update, { sync = false } = {}) {
    this.clock += 1
    return this._insert({ clock: this.clock, doc, update, sync })
  }

  /** Put back an update restored from storage, keeping its clock (it may have been sent before the reload). */
  restore (item) {
    this.clock = Math.max(this.clock, item.clock)
    return this._insert({ clock: item.clock, doc: item.doc, update: item.update, sync: item.sync === true, sent: true })
  }

  get (clock) { return this._items.get(clock) }

  pop (clock) {
    const item = this._items.get(clock)
    if (item === undefined) return undefined
    this._items.delete(clock)
    const items = this._docs.get(item.doc)
    items.splice(items.indexOf(item), 1)
    if (items.length === 0) this._docs.delete(item.doc)
    return item
  }

  /** Every update, in clock order. */
  all () { return [...this._items.values()].sort((a, b) => a.clock - b.clock) }

  /** The updates of `doc`, in clock order. */
  forDoc (doc) { return this._docs.get(doc) ?? [] }

  countFor (doc) { return this.forDoc(doc).length }

  /** Is an update of `doc` waiting for a two-way sync to replace it? */
  needsSync (doc) { return this.forDoc(doc).some((item) => item.state === NEEDS_SYNC) }

  markSent (item, now = Date.now()) {
    item.nextSend = now + this.backoff.delay(item.attempts) + Math.floor(item.update.length / ANSWER_BYTES_PER_MS)
    item.attempts += 1
    item.state = SENT
    item.sent = true
  }

  /** Refused for now (`unavailable`, `internal_error`, ...): resent on its schedule; later ones of its document wait. */
  hold (clock) {
    const item = this._items.get(clock)
    if (item !== undefined) item.state = WAITING
    return item
  }

  /** The server refused the update for now (`rate_limited`): send it again after `delay` ms; that send was not an attempt. */
  defer (clock, delay, now = Date.now()) {
    const item = this.hold(clock)
    if (item === undefined) return
    item.nextSend = Math.max(item.nextSend, now + delay)
    item.attempts = Math.max(item.attempts - 1, 0)
  }

  /**
   * `missing_dependency`: the document cannot apply the update yet. Behind
   * unacked earlier updates of its document it is resent once they are
   * acked; with none, only a two-way sync can help. Returns the new state.
   */
  refuse (clock) {
    const item = this._items.get(clock)
    if (item === undefined) return undefined
    item.state = this.forDoc(item.doc)[0] === item ? NEEDS_SYNC : AFTER_EARLIER
    return item.state
  }

  /**
   * A two-way sync's diff (or the finding that the server holds everything)
   * covers every update of `doc` below `clock`: the document they came from
   * holds them, and the diff is its state minus the server's. They leave the
   * buffer; returns them (for the persistent store).
   */
  supersede (doc, clock = Infinity) {
    const covered = this.forDoc(doc).filter((item) => item.clock < clock)
    for (const item of covered) this.pop(item.clock)
    return covered
  }

  /**
   * The updates to send now, in clock order: per document, nothing passes an
   * update that waits for a resend (or for a sync); an unanswered one is
   * resent before those after it. `bound(doc)`: documents to consider.
   */
  due (now = Date.now(), bound = () => true) {
    const out = []
    for (const [doc, items] of this._docs) {
      if (!bound(doc)) continue
      for (const [index, item] of items.entries()) {
        if (item.state === SENT) {
          if (item.nextSend <= now) out.push(item) // unanswered: again, before what follows
        } else if (item.state === QUEUED || (item.state === WAITING && item.nextSend <= now) ||
                   (item.state === AFTER_EARLIER && index === 0)) {
          out.push(item)
        } else {
          break // waiting for its resend time, for earlier acks, or for a sync: later ones wait too
        }
      }
    }
    return out.sort((a, b) => a.clock - b.clock)
  }

  /**
   * Merge the run of never-sent updates of `doc` at the head of what is to
   * be sent into its first clock (`merge`: Y.mergeUpdates, which keeps
   * pending structs), up to `maxBytes`. Returns {item, removed} or null.
   */
  coalesce (doc, merge, maxBytes) {
    const items = this.forDoc(doc)
    const start = items.findIndex((item) => item.state === QUEUED && !item.sent && !item.sync)
    if (start < 0 || items.slice(0, start).some((item) => item.state !== SENT)) return null
    let end = start + 1
    let bytes = items[start].update.length
    while (end < items.length && items[end].state === QUEUED && !items[end].sent && !items[end].sync &&
           bytes + items[end].update.length <= maxBytes) {
      bytes += items[end].update.length
      end++
    }
    if (end - start < 2) return null
    const first = items[start]
    const removed = items.slice(start + 1, end)
    first.update = merge(items.slice(start, end).map((item) => item.update))
    for (const item of removed) this.pop(item.clock)
    return { item: first, removed }
  }

  /** Has any update (of a document `counts`) used up its attempts: the server is not answering? */
  exhausted (counts = () => true) {
    return this.all().some((item) => counts(item.doc) && item.attempts >= this.backoff.maxAttempts)
  }

  /** A new connection: everything goes out again, in order (a refused update may be admissible now). */
  resetAttempts () {
    for (const item of this._items.values()) {
      item.attempts = 0
      item.nextSend = 0
      if (item.state !== NEEDS_SYNC) item.state = QUEUED
    }
  }

  _insert (fields) {
    this.pop(fields.clock) // a clock restored twice is one update
    const item = { sync: false, sent: false, ...fields, state: QUEUED, attempts: 0, nextSend: 0 }
    this._items.set(item.clock, item)
    const items = this._docs.get(item.doc)
    if (items === undefined) this._docs.set(item.doc, [item])
    else if (items[items.length - 1].clock < item.clock) items.push(item)
    else items.splice(items.findIndex((other) => other.clock > item.clock), 0, item)
    return item
  }
}
