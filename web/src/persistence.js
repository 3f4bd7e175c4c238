/**
 * Optional IndexedDB persistence, so a reload (or a crashed tab) loses no
 * edit the server has not acked yet, and resumes its session where it was.
 *
 * Three object stores, all keyed by server URL first:
 * - `sessions` [url]: the session id and the last clock used. The clock is
 *   never reused: the server de-duplicates resends by (session, clock), so a
 *   reused clock would drop a new update as a duplicate.
 * - `pending` [url, clock]: every update from the moment it enters the send
 *   buffer until the server acks it, written in the same transaction as the
 *   clock.
 * - `documents` [url, doc]: the document's Yjs state together with the
 *   offset and the ids it holds, in one record, so they always agree.
 *
 * A restored document always resyncs with a two-way state-vector exchange:
 * that covers edits made in the short window before they were queued.
 */
import * as idb from 'lib0/indexeddb'

const SESSIONS = 'sessions'
const PENDING = 'pending'
const DOCUMENTS = 'documents'

export class BrowserStore {
  constructor (db) {
    this.db = db
  }

  /** Open (or create) the database `name` in this origin. */
  static async open (name = 'yrelay') {
    const db = await idb.openDB(name, (created) => idb.createStores(created, [[SESSIONS], [PENDING], [DOCUMENTS]]))
    return new BrowserStore(db)
  }

  async loadSession (url) {
    const [sessions, pending] = idb.transact(this.db, [SESSIONS, PENDING], 'readonly')
    const session = await idb.get(sessions, url)
    const range = idb.createIDBKeyRangeBound([url, 0], [url, Number.MAX_SAFE_INTEGER], false, false)
    const items = await idb.getAll(pending, range)
    return { session: session?.session ?? null, clock: session?.clock ?? 0, pending: items }
  }

  saveSession (url, session, clock) {
    const [sessions] = idb.transact(this.db, [SESSIONS])
    return idb.put(sessions, { session, clock }, url)
  }

  /**
   * The update and the session's last clock (at least the update's), in one
   * transaction. `item.sync`: a two-way sync's diff, resent as such. A merged
   * update keeps an older clock, so the session's clock is passed apart.
   */
  putPending (url, session, item, clock = item.clock) {
    const [sessions, pending] = idb.transact(this.db, [SESSIONS, PENDING])
    return Promise.all([
      idb.put(sessions, { session, clock: Math.max(clock, item.clock) }, url),
      idb.put(pending, { clock: item.clock, doc: item.doc, update: item.update, sync: item.sync === true },
        [url, item.clock])
    ])
  }

  deletePending (url, clock) {
    const [pending] = idb.transact(this.db, [PENDING])
    return idb.del(pending, [url, clock])
  }

  loadDocument (url, doc) {
    const [documents] = idb.transact(this.db, [DOCUMENTS], 'readonly')
    return idb.get(documents, [url, doc])
  }

  /** `record`: {state, offset, since, held} */
  saveDocument (url, doc, record) {
    const [documents] = idb.transact(this.db, [DOCUMENTS])
    return idb.put(documents, record, [url, doc])
  }

  deleteDocument (url, doc) {
    const [documents] = idb.transact(this.db, [DOCUMENTS])
    return idb.del(documents, [url, doc])
  }

  close () { this.db.close() }
}
