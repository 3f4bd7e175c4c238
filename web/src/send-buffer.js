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
 *
 * An update on the wire is resent only when the connection makes no
 * progress: its answer time is over *and* no answer came for that long. The
 * server answers a connection's updates in order and, over its rates, reads
 * the socket more slowly instead of refusing (issue 30): while answers keep
 * coming, the update's own is on its way, and a resend would only add to the
 * load that slowed it. Refused updates keep their own schedule.
 */

/** To be sent: never sent on this connection, or due again. */
export const QUEUED = 'queued'
/** On the wire; sent again at `nextSend` when still unanswered and the connection answered nothing for `silence` ms. */
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
    this._items = new Map() // clock -> { clock, doc, update, sync, state, attempts, nextSend, silence, sent }
    this._docs = new Map() // doc -> its items in clock order
    /** When the connection last answered an update (`appended`, or an `error` with a clock); -Infinity on a new one. */
    this.lastAnswer = -Infinity
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
    item.silence = this.backoff.delay(item.attempts) + Math.floor(item.update.length / ANSWER_BYTES_PER_MS)
    item.nextSend = now + item.silence
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

  /** The connection answered an update: it is being read. */
  answered (now = Date.now()) { this.lastAnswer = now }

  /**
   * The updates to send now, in clock order: per document, nothing passes an
   * update that waits for a resend (or for a sync); an unanswered one is
   * resent, before those after it, once the connection answered nothing for
   * its answer time. `bound(doc)`: documents to consider.
   */
  due (now = Date.now(), bound = () => true) {
    const out = []
    for (const [doc, items] of this._docs) {
      if (!bound(doc)) continue
      for (const [index, item] of items.entries()) {
        if (item.state === SENT) {
          // Unanswered with no progress on the connection: again, before what follows.
          if (item.nextSend <= now && this.lastAnswer + item.silence <= now) out.push(item)
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

  /** A new connection: everything goes out again, in order (a refused update may be admissible now); nothing was answered on it yet. */
  resetAttempts () {
    this.lastAnswer = -Infinity
    for (const item of this._items.values()) {
      item.attempts = 0
      item.nextSend = item.silence = 0
      if (item.state !== NEEDS_SYNC) item.state = QUEUED
    }
  }

  _insert (fields) {
    this.pop(fields.clock) // a clock restored twice is one update
    const item = { sync: false, sent: false, ...fields, state: QUEUED, attempts: 0, nextSend: 0, silence: 0 }
    this._items.set(item.clock, item)
    const items = this._docs.get(item.doc)
    if (items === undefined) this._docs.set(item.doc, [item])
    else if (items[items.length - 1].clock < item.clock) items.push(item)
    else items.splice(items.findIndex((other) => other.clock > item.clock), 0, item)
    return item
  }
}
