/**
 * Binds one Y.Doc to one document of a yrelay server (docs/protocol.md),
 * over a YrelayClient's socket (shared by every document of the page).
 *
 * What it keeps per document: the offset (last stream id held, acked
 * cumulatively), the drift digest of the ids held (sent with every
 * resubscribe so a server that lost entries is caught), chunked snapshot and
 * sync replies, Nagle-like batching of local changes with Y.mergeUpdates,
 * and presence through a y-protocols Awareness.
 *
 * Events: 'status' ({status}), 'synced' (bool: the document holds the
 * server's state), 'pending' (count of local updates not yet in the stream),
 * 'offset' (the acked offset), 'drift', 'dropped' (ranges of a sync push the
 * server could not store yet), 'error' (an error about this document; about
 * an update: with its clock).
 */
import * as Y from 'yjs'
import * as awarenessProtocol from 'y-protocols/awareness'
import { ObservableV2 } from 'lib0/observable'
import { fromBase64, toBase64 } from 'lib0/buffer'
import { YrelayClient } from './client.js'
import { hashHex } from './digest.js'
import { HeldEntries } from './held-entries.js'
import { ZERO, idKey, maxId } from './offsets.js'

/** Yjs' encoding of an update that changes nothing. */
const EMPTY_UPDATE_LENGTH = 2
/** Acks are cumulative: one per document per this many ms carries every delivery before it (docs/protocol.md, client behaviour). */
const ACK_INTERVAL = 25

export class YrelayProvider extends ObservableV2 {
  /**
   * @param {string|YrelayClient} server a websocket URL (one shared client per URL) or a client
   * @param {string} name the document id (1-200 of A-Z a-z 0-9 . _ - : / @ and %XX escapes: docs/protocol.md)
   * @param {Y.Doc} doc
   * @param {object} [options]
   * @param {awarenessProtocol.Awareness|null} [options.awareness] presence; a new one by default, null for none
   * @param {number} [options.batchDelay] ms to collect local changes while earlier ones are unacked
   * @param {boolean|string} [options.persist] keep the document, its place and its unacked
   *   updates in IndexedDB (a database name, or true for "yrelay"); sets up the shared client
   * @param {number} [options.persistDelay] ms to gather changes before the document is saved
   * @param {object} [options.clientOptions] options of the shared YrelayClient (WebSocketPolyfill, backoff, ...)
   */
  constructor (server, name, doc, { awareness, batchDelay = 50, persist = false, persistDelay = 250, clientOptions = {} } = {}) {
    super()
    /** An awareness made here is destroyed here (its renewal timer would keep a page or process alive). */
    this._ownsAwareness = awareness === undefined
    if (awareness === undefined) awareness = new awarenessProtocol.Awareness(doc)
    this.client = typeof server === 'string' ? YrelayClient.shared(server, { persist, ...clientOptions }) : server
    this.name = name
    this.doc = doc
    this.awareness = awareness
    this.batchDelay = batchDelay
    /** The last stream id this document holds (and acked); null before the first answer. */
    this.offset = null
    this.held = new HeldEntries()
    this.synced = false
    /** Resync with a two-way state-vector exchange at the next `subscribed` (local state the server may lack). */
    this.needsSync = Y.encodeStateVector(doc).length > 1
    /** Resubscribes where the drift digests differed. */
    this.drifts = 0
    this.resyncs = 0
    this._subscribed = false
    /** A `sync` is out and its reply not in yet. */
    this._syncing = false
    /** A sync push had ranges dropped: push again once this document's pending structs integrate. */
    this._awaitingDependencies = false
    this._fresh = true // no offset was sent with the pending subscribe
    this._parts = []
    this._batch = []
    this._flushTimer = null
    this._ackTimer = null
    this.persistDelay = persistDelay
    this._persistTimer = null
    this._started = false
    this._onDocUpdate = (update, origin) => { if (origin !== this) this._local(update) }
    this._onAwarenessUpdate = (changes, origin) => this._localAwareness(changes, origin)
    doc.on('update', this._onDocUpdate)
    awareness?.on('update', this._onAwarenessUpdate)
    this._onStatus = (event) => this.emit('status', [event])
    this.client.on('status', this._onStatus)
    this._onPageHide = () => { this._flush(); this._persistNow() }
    if (typeof window !== 'undefined' && window.addEventListener) window.addEventListener('pagehide', this._onPageHide)
    /** Resolves once the persisted state (if any) is loaded and the document is bound to the client. */
    this.whenReady = this.client.ready.then(() => this._restore()).then(() => {
      if (this._destroyed) return
      this._started = true
      this.client.attach(this)
      this._flush()
    })
  }

  /** Local changes not yet in the server's stream. */
  get pending () { return this.client.buffer.countFor(this.name) + this._batch.length }

  get status () { return this.client.status }

  /** Stop syncing this document: unsubscribe (the server stops keeping history for this session) and release the doc. */
  destroy () {
    if (this.awareness) awarenessProtocol.removeAwarenessStates(this.awareness, [this.doc.clientID], 'destroy')
    this._flush() // sent before the unsubscribe
    this.client.detach(this)
    this._release()
  }

  /** Drop listeners and timers, without telling the server (the client is going away; its session stays resumable). */
  _release () {
    this._flush()
    this._persistNow()
    this._destroyed = true
    clearTimeout(this._flushTimer)
    clearTimeout(this._ackTimer)
    clearTimeout(this._persistTimer)
    if (typeof window !== 'undefined' && window.removeEventListener) window.removeEventListener('pagehide', this._onPageHide)
    this.doc.off('update', this._onDocUpdate)
    this.client.off('status', this._onStatus)
    if (this.awareness) {
      this.awareness.off('update', this._onAwarenessUpdate)
      if (this._ownsAwareness) this.awareness.destroy()
    }
    super.destroy()
  }

  // ------------------------------------------------------------ local edits

  _local (update) {
    this._batch.push(update)
    this._persistSoon()
    if (this._flushTimer === null) {
      // Nagle: the first change goes out at once; while earlier ones await their ack, collect.
      const delay = this.client.buffer.countFor(this.name) > 0 ? this.batchDelay : 0
      this._flushTimer = setTimeout(() => this._flush(), delay)
    }
    this._emitPending()
  }

  _flush () {
    clearTimeout(this._flushTimer)
    this._flushTimer = null
    const updates = this._batch
    if (updates.length === 0 || !this._started) return // bound (and restored) first: clocks come after the restored ones
    this._batch = []
    this.client.enqueue(this.name, updates.length === 1 ? updates[0] : Y.mergeUpdates(updates))
  }

  _emitPending () { this.emit('pending', [this.pending]) }

  // ------------------------------------------------------------ persistence

  /** Load the saved state, place and held ids; a restored document resyncs (two-way) on subscribe. */
  async _restore () {
    const store = this.client.store
    try {
      const record = store === null ? undefined : await store.loadDocument(this.client.url, this.name)
      if (record !== undefined) {
        Y.applyUpdate(this.doc, record.state, this)
        this.offset = record.offset
        this.held = new HeldEntries(record.since)
        for (const id of record.held) this.held.add(id)
        this.needsSync = true // edits made just before the last save may never have been queued
      }
    } catch (error) {
      this.emit('error', [{ code: 'persistence_failed', message: String(error?.message ?? error) }])
    }
    // Unacked edits (maybe newer than the saved state, or of a doc bound
    // earlier on this client): the bound doc holds all its queued updates,
    // so a two-way sync's diff covers them (YrelayClient.pushSync).
    for (const item of this.client.buffer.forDoc(this.name)) {
      try {
        Y.applyUpdate(this.doc, item.update, this)
      } catch (error) {} // bytes Yjs cannot read: the server refuses them too (invalid_update)
    }
  }

  _persistSoon () {
    if (this.client.store === null || this._persistTimer !== null) return
    this._persistTimer = setTimeout(() => this._persistNow(), this.persistDelay)
  }

  /** The state, offset and held ids in one record, so they always agree. */
  _persistNow () {
    clearTimeout(this._persistTimer)
    this._persistTimer = null
    const store = this.client.store
    if (store === null || !this._started) return
    const record = { state: Y.encodeStateAsUpdate(this.doc), offset: this.offset, since: this.held.since, held: this.held.ids() }
    store.saveDocument(this.client.url, this.name, record).catch((error) => {
      this.emit('error', [{ code: 'persistence_failed', message: String(error?.message ?? error) }])
    })
  }

  // ------------------------------------------------------------ session events (from the client)

  _connected () {
    this._subscribed = false
    this._syncing = false
    if (this.client.buffer.needsSync(this.name)) this.needsSync = true // refused updates wait for the two-way sync
    this._fresh = this.offset === null
    this.client.send(this._subscribeFrame())
  }

  _disconnected () {
    this._subscribed = false
    this._setSynced(false)
    if (this.awareness) {
      // Remote cursors would freeze while offline: drop them; they come back on resubscribe.
      const others = [...this.awareness.getStates().keys()].filter((id) => id !== this.doc.clientID)
      awarenessProtocol.removeAwarenessStates(this.awareness, others, this)
    }
  }

  /** Resubscribe from the offset held, with the drift digest over the window held. */
  _subscribeFrame () {
    const frame = { op: 'subscribe', doc: this.name, offset: this.offset }
    if (this.offset !== null) {
      // Own updates appended after the last delivery are held too: a server
      // that lost them must see it (through past its last id, or a digest gap).
      const through = maxId(this.offset, this.held.last)
      const { count, hash } = this.held.digest(through)
      frame.digest = { since: this.held.since, through, count, hash: hashHex(hash) }
    }
    return frame
  }

  // ------------------------------------------------------------ frames about this document

  _receive (frame) {
    switch (frame.op) {
      case 'subscribed': return this._onSubscribed(frame)
      case 'snapshot': return this._onSnapshot(frame)
      case 'deliver': return this._onDeliver(frame)
      case 'resync_required': return this._onResyncRequired(frame)
      case 'sync_reply': return this._onSyncReply(frame)
      case 'synced': return this._onSynced(frame)
      case 'awareness': return this._onAwareness(frame)
      case 'error':
        this.emit('error', [frame])
        if (frame.code === 'document_deleted' && frame.clock === undefined) return this._onDeleted()
        return this._emitPending()
    }
  }

  /**
   * An operator deleted the document: the server ended the subscription.
   * Unbound (no resubscribe on reconnect) and released (listeners, timers);
   * the Y.Doc keeps what it held. Bind a new provider to start a new, empty
   * document of the same name.
   */
  _onDeleted () {
    this.deleted = true
    this.synced = false
    if (this.client.providers.get(this.name) === this) this.client.providers.delete(this.name)
    this.emit('deleted', [])
    this._release()
  }

  _appended (frame, item) {
    if (typeof frame.id === 'string') this.held.add(frame.id) // also for a late or duplicate answer; null: nothing stored
    this._persistSoon()
    if (frame.dropped && Object.keys(frame.dropped).length) {
      // Content of the sync push the server cannot apply yet: it builds on
      // content the server lacks, which this document lacks too (else the
      // diff had carried it), so Yjs holds it as pending structs here. It
      // is pushed again once they integrate (_applyRemote), or at the next
      // subscribe.
      this.needsSync = true
      this._awaitingDependencies = this.doc.store.pendingStructs !== null
      this.emit('dropped', [{ clock: frame.clock, ranges: frame.dropped }])
    }
    if (item !== undefined) {
      const { clock, id, dropped } = frame
      this.emit('appended', [{ clock, id, update: item.update, sync: item.sync, dropped }])
      if (this.client.buffer.countFor(this.name) === 0 && this._batch.length) this._flush()
    }
    this._emitPending()
  }

  /** Our own update stays refused (`missing_dependency`) with nothing earlier unacked: push the two-way sync's diff. */
  _pushSync () {
    if (!this._subscribed) this.needsSync = true // done at the next `subscribed`
    else if (!this._syncing) this._requestSync({ push: true })
  }

  /** With the `synced` feature only the server says when the document holds its state. */
  get _serverSaysSynced () { return this.client.features.has('synced') }

  _onSubscribed (frame) {
    this._subscribed = true
    this.offset = maxId(this.offset, frame.offset)
    this._announcePresence()
    if (frame.digest && !this._digestAgrees(frame)) {
      this.needsSync = false // the sync below covers it
      this.drifts++
      this.emit('drift', [{ server: frame.digest }])
      this._requestSync()
    } else if (this.needsSync) {
      this.needsSync = false
      this._requestSync()
    } else if (!this._serverSaysSynced && !(this._fresh && frame.offset !== ZERO)) {
      this._setSynced(true) // else the snapshot that follows completes the state
    }
  }

  /** Compare with the server's digest over its window (which starts at or after ours: GC may have trimmed past our base). */
  _digestAgrees (frame) {
    const server = frame.digest
    this.held.rebase(server.since)
    const ours = this.held.digest(server.through ?? frame.offset)
    return ours.count === server.count && hashHex(ours.hash) === server.hash
  }

  _onSnapshot (frame) {
    const update = this._collect(frame)
    if (update === null) return
    this._applyRemote(update)
    this.offset = maxId(this.offset, frame.offset)
    this._ack()
    if (!this._serverSaysSynced) this._setSynced(true)
  }

  /** Everything the document had admitted when the subscribe (or sync) was answered is applied. */
  _onSynced () {
    if (!this._syncing) this._setSynced(true) // a sync still out: its own `synced` follows its reply
  }

  _onDeliver (frame) {
    for (const entry of frame.entries) {
      this._applyRemote(fromBase64(entry.update))
      this.offset = maxId(this.offset, entry.id)
      this.held.add(entry.id)
    }
    this._ack()
  }

  _onResyncRequired (frame) {
    if (frame.reason === 'drift') this.drifts++
    this.emit('resync', [{ reason: frame.reason }])
    this._requestSync()
  }

  /** `push`: only to give the server what it lacks (the document still holds the server's state). */
  _requestSync ({ push = false } = {}) {
    this.resyncs++
    this._syncing = true // (parts of a snapshot still arriving are kept: _collect starts over at a part 0)
    if (!push) this._setSynced(false)
    this.client.send({ op: 'sync', doc: this.name, state_vector: toBase64(Y.encodeStateVector(this.doc)) })
  }

  _onSyncReply (frame) {
    const update = this._collect(frame)
    if (update === null) return
    this._syncing = false
    this._awaitingDependencies = false // the diff below carries whatever is pending again
    this._applyRemote(update)
    this.offset = frame.offset // may move back: the server's history is the reference
    this.held.reset(frame.offset)
    // What the server lacks (with Yjs' pending structs); it replaces every
    // queued update of the document, and the batched changes.
    clearTimeout(this._flushTimer)
    this._flushTimer = null
    this._batch = []
    const missingOnServer = Y.encodeStateAsUpdate(this.doc, fromBase64(frame.state_vector))
    this.client.pushSync(this.name, missingOnServer.length > EMPTY_UPDATE_LENGTH ? missingOnServer : null)
    this._emitPending()
    this._ack()
    if (!this._serverSaysSynced) this._setSynced(true)
  }

  /** Reassemble a chunked snapshot / sync reply; null until complete. */
  _collect (frame) {
    if (frame.part === 0) this._parts = []
    this._parts.push(fromBase64(frame.update))
    if (frame.part + 1 < frame.parts) return null
    const parts = this._parts
    this._parts = []
    return parts.length === 1 ? parts[0] : concat(parts)
  }

  _applyRemote (update) {
    Y.applyUpdate(this.doc, update, this)
    if (this._awaitingDependencies && this.doc.store.pendingStructs === null) {
      this._awaitingDependencies = false // what the server refused can apply now: offer it again
      this._pushSync()
    }
  }

  _ack () {
    this._persistSoon()
    if (this.offset === null) return
    if (this._ackTimer === null) this._ackTimer = setTimeout(() => this._sendAck(), ACK_INTERVAL)
    this.emit('offset', [this.offset])
  }

  /** The newest offset; while subscribed only (after a reconnect the subscribe carries it). */
  _sendAck () {
    this._ackTimer = null
    if (this._subscribed && !this._destroyed && this.offset !== null) this.client.send({ op: 'ack', doc: this.name, offset: this.offset })
  }

  _setSynced (synced) {
    if (this.synced === synced) return
    this.synced = synced
    this.emit('synced', [synced])
  }

  // ------------------------------------------------------------ presence

  _localAwareness ({ added, updated, removed }, origin) {
    if (origin === this) return
    const own = this.doc.clientID
    if (added.includes(own) || updated.includes(own) || removed.includes(own)) this._sendAwareness([own])
  }

  /**
   * Send our state with a clock past the server's removal of it: when a
   * socket closes the server relays state null at our last clock (servers
   * before issue 36: clock + 1), and peers ignore a state whose clock is
   * not above what they hold.
   */
  _announcePresence () {
    const state = this.awareness?.getLocalState()
    if (state == null) return
    const meta = this.awareness.meta.get(this.doc.clientID)
    if (meta !== undefined) meta.clock += 1
    this.awareness.setLocalState(state) // +1 again, and sent by _localAwareness
  }

  _sendAwareness (clients) {
    if (!this._subscribed || clients.length === 0 || !this.awareness) return
    const update = awarenessProtocol.encodeAwarenessUpdate(this.awareness, clients)
    this.client.send({ op: 'awareness', doc: this.name, update: toBase64(update) })
  }

  _onAwareness (frame) {
    if (this.awareness) awarenessProtocol.applyAwarenessUpdate(this.awareness, fromBase64(frame.update), this)
  }
}

function concat (parts) {
  const out = new Uint8Array(parts.reduce((size, part) => size + part.length, 0))
  let at = 0
  for (const part of parts) {
    out.set(part, at)
    at += part.length
  }
  return out
}
