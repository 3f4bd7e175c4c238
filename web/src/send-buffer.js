/**
 * Updates sent and not yet acked, keyed by the session's logical clock (the
 * twin of yrelay/client/sendbuffer.py). An update leaves only when the
 * server acks it (`appended`) or rejects it for good.
 *
 * The clock must keep increasing for the session's whole life, across
 * reloads too when the buffer is persisted: the server de-duplicates resends
 * by (session, clock), so reusing a clock would drop a new update.
 */
export class SendBuffer {
  constructor (backoff, clock = 0) {
    this.backoff = backoff
    this.clock = clock
    this._items = new Map() // clock -> { clock, doc, update, attempts, nextSend }
  }

  get size () { return this._items.size }

  add (doc, update) {
    this.clock += 1
    const item = { clock: this.clock, doc, update, attempts: 0, nextSend: 0 }
    this._items.set(item.clock, item)
    return item
  }

  /** Put back an update restored from storage, keeping its clock. */
  restore (item) {
    this._items.set(item.clock, { clock: item.clock, doc: item.doc, update: item.update, attempts: 0, nextSend: 0 })
    this.clock = Math.max(this.clock, item.clock)
  }

  pop (clock) {
    const item = this._items.get(clock)
    this._items.delete(clock)
    return item
  }

  all () { return [...this._items.values()] }

  countFor (doc) {
    let count = 0
    for (const item of this._items.values()) if (item.doc === doc) count++
    return count
  }

  markSent (item, now = Date.now()) {
    item.nextSend = now + this.backoff.delay(item.attempts)
    item.attempts += 1
  }

  /** The server refused the update for now (`rate_limited`): send it again after `delay` ms; that send was not an attempt. */
  defer (clock, delay, now = Date.now()) {
    const item = this._items.get(clock)
    if (item === undefined) return
    item.nextSend = Math.max(item.nextSend, now + delay)
    item.attempts = Math.max(item.attempts - 1, 0)
  }

  due (now = Date.now()) {
    return this.all().filter((item) => item.nextSend <= now)
  }

  /** Has any update (of a document `counts`) used up its attempts: the server is not answering? */
  exhausted (counts = () => true) {
    return this.all().some((item) => counts(item.doc) && item.attempts >= this.backoff.maxAttempts)
  }

  resetAttempts () {
    for (const item of this._items.values()) {
      item.attempts = 0
      item.nextSend = 0
    }
  }
}
