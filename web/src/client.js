/**
 * One websocket to a yrelay server, shared by every document bound through
 * it (docs/protocol.md). It owns what is per session: the handshake and
 * session resume, the send buffer of unacked updates keyed by the session's
 * clock, resends with exponential backoff + jitter, reconnects, and the
 * keep-alive. Everything about one document lives in its YrelayProvider.
 *
 * Guarantees (the same as the Python client's): a local change stays in the
 * send buffer until the server says it is in the stream (`appended`), and is
 * resent on its backoff schedule (an unanswered one only while the
 * connection answers nothing: a server slowing it down answers late, in
 * order) and after every reconnect; when an update has used up its
 * attempts the client reconnects and resyncs every document with a two-way
 * state-vector exchange. Per document, updates go out in clock order and a
 * refused one holds back the later ones (SendBuffer); an update the server
 * could never take is refused here with an `error` event (doc, clock,
 * size), so it never costs the socket (update-frames.js).
 */
import { ObservableV2 } from 'lib0/observable'
import { mergeUpdates } from 'yjs'
import { Backoff } from './backoff.js'
import { hashReady } from './digest.js'
import { BrowserStore } from './persistence.js'
import { NEEDS_SYNC, SendBuffer } from './send-buffer.js'
import { updateFrames } from './update-frames.js'

/** Errors after which resending the same update can never succeed. */
export const FATAL_UPDATE_ERRORS = new Set([
  'invalid_update', 'update_too_large', 'malformed_frame', 'invalid_doc_id', 'frame_too_large', 'forbidden',
  'document_deleted'
])

/**
 * The close code by which the server asks for a pause: 4429 (held back by
 * its rates for too long). The reconnect waits the `retry_after_ms` of the
 * error frame before the close (SLOW_DOWN_DEFAULT_MS without one), and at
 * least the backoff. Not 1013: a server closes with it after a Redis
 * failover or outage, and the client should be back at once to resync (a
 * refusal at the connect, `overloaded`, says when in its error frame).
 */
export const SLOW_DOWN_CLOSES = new Set([4429])
const SLOW_DOWN_DEFAULT_MS = 1000
/**
 * A connection ended by a slow-down close sooner than this after its
 * `welcome` does not reset the reconnect backoff: repeated 4429s back off
 * up to the maximum instead of reconnecting at the first step each time
 * (the server's hard bound ends a flooding connection after ~12 s).
 */
const STABLE_CONNECTION_MS = 60000

const OPEN = 1
const shared = new Map()

export class YrelayClient extends ObservableV2 {
  /**
   * @param {string} url the server's websocket endpoint, e.g. wss://example.com/ws
   * @param {object} [options]
   * @param {typeof WebSocket} [options.WebSocketPolyfill] a WebSocket class (Node: the `ws` package)
   * @param {Backoff|object} [options.backoff] resend and reconnect timing (ms)
   * @param {string|null} [options.session] a session id to resume
   * @param {boolean} [options.connect] connect now (default true)
   * @param {number} [options.pingInterval] ms of silence before a ping
   * @param {number} [options.idleTimeout] ms without any frame before the socket is taken for dead
   * @param {boolean|string} [options.persist] keep the session and unacked updates in IndexedDB
   *   (a database name, or true for "yrelay"), so a reload loses nothing
   * @param {string|function(): (string|Promise<string>)} [options.token] the credential sent in
   *   `hello` (docs/security.md); a function is asked again before every connect, so it can refresh it
   */
  constructor (url, {
    WebSocketPolyfill = globalThis.WebSocket, backoff = new Backoff(), session = null, connect = true,
    pingInterval = 15000, idleTimeout = 45000, tickInterval = 100, persist = false, token = null
  } = {}) {
    super()
    if (!WebSocketPolyfill) throw new Error('no WebSocket: pass options.WebSocketPolyfill (in Node: the ws package)')
    this.url = url
    this.WebSocketPolyfill = WebSocketPolyfill
    this.backoff = backoff instanceof Backoff ? backoff : new Backoff(backoff)
    this.session = session
    this.token = token
    /** 'disconnected' | 'connecting' | 'connected' */
    this.status = 'disconnected'
    /** Limits the server announced in `welcome`. */
    this.limits = null
    /** Additive protocol features the server announced in `welcome` (docs/protocol.md#features). */
    this.features = new Set()
    this.providers = new Map()
    this.buffer = new SendBuffer(this.backoff)
    this.pingInterval = pingInterval
    this.idleTimeout = idleTimeout
    this.tickInterval = tickInterval
    this._ws = null
    this._attempt = 0
    this._shouldConnect = false
    this._reconnectTimer = null
    /** ms the server asked us to wait before reconnecting (`overloaded`, `too_many_connections`, `rate_limited` + 4429). */
    this._retryAfter = 0
    /** When the current connection got its `welcome` (ms). */
    this._welcomedAt = 0
    this._ticker = null
    this._lastReceived = 0
    this._lastSent = 0
    /** The IndexedDB store when persisting (set once `ready` resolves). */
    this.store = null
    /** Resolves once the persisted session and updates are restored (at once without persistence). */
    this.ready = persist ? this._restore(persist === true ? 'yrelay' : persist) : Promise.resolve()
    this._onOnline = () => this._reconnectNow()
    this._onOffline = () => this._dropSocket()
    if (typeof window !== 'undefined' && window.addEventListener) {
      window.addEventListener('online', this._onOnline)
      window.addEventListener('offline', this._onOffline)
    }
    if (connect) this.connect()
  }

  /** One client per URL, so every document of a page shares one socket. */
  static shared (url, options = {}) {
    let client = shared.get(url)
    if (client === undefined || client._destroyed) {
      client = new YrelayClient(url, options)
      shared.set(url, client)
    }
    return client
  }

  /** Start (or resume) connecting; reconnects by itself until `disconnect()`. */
  connect () {
    if (this._shouldConnect) return
    this._shouldConnect = true
    Promise.all([hashReady(), this.ready]).then(() => { if (this._shouldConnect && this._ws === null) this._open() },
      (error) => this.emit('error', [{ code: 'hash_unavailable', message: String(error) }]))
  }

  /** Close the socket and stay offline; edits keep collecting in the send buffer. */
  disconnect () {
    this._shouldConnect = false
    clearTimeout(this._reconnectTimer)
    this._dropSocket()
  }

  /** Close for good: providers are released (not unsubscribed, so the session stays resumable). */
  destroy () {
    for (const provider of [...this.providers.values()]) provider._release()
    this.providers.clear()
    this.disconnect()
    this._destroyed = true
    if (typeof window !== 'undefined' && window.removeEventListener) {
      window.removeEventListener('online', this._onOnline)
      window.removeEventListener('offline', this._onOffline)
    }
    if (shared.get(this.url) === this) shared.delete(this.url)
    super.destroy()
  }

  /** Updates not yet acked by the server, all documents (bound or not). */
  get pending () { return this.buffer.size }

  // ------------------------------------------------------------ documents

  attach (provider) {
    if (this.providers.has(provider.name)) throw new Error(`document ${provider.name} is already bound on this client`)
    this.providers.set(provider.name, provider)
    if (this.status === 'connected') {
      provider._connected()
      this._pump()
    }
  }

  detach (provider) {
    if (this.providers.get(provider.name) !== provider) return
    this.providers.delete(provider.name)
    this.send({ op: 'unsubscribe', doc: provider.name })
  }

  /**
   * Queue an update for the stream; sent when connected (and the document
   * bound) and no earlier update of the document waits for a resend, else
   * after the next handshake. Unacked updates of a document that is unbound
   * stay queued and go out when it is bound again.
   */
  enqueue (doc, update) {
    const item = this.buffer.add(doc, update)
    this._persist(item)
    this._pump()
    return item
  }

  /**
   * A two-way sync's diff (the document's state minus the server's, taken
   * after every queued update of `doc` was applied to it) replaces the
   * document's unacked updates: it holds all they carry that the server
   * lacks. Sent as `update {sync: true}` when the server speaks `sync_push`
   * (it then stores what the document can apply and names the rest); null
   * `diff`: the server holds everything, nothing replaces them.
   */
  pushSync (doc, diff) {
    const item = diff === null ? null : this.buffer.add(doc, diff, { sync: this.features.has('sync_push') })
    if (item !== null) this._persist(item) // stored before what it covers is deleted
    for (const covered of this.buffer.supersede(doc, item?.clock ?? Infinity)) this._forget(covered.clock)
    this._pump()
    return item
  }

  /** Send a frame if the session is open; false when it is not (the caller's state is resent on reconnect). */
  send (frame) {
    const ws = this._ws
    if (ws === null || ws.readyState !== OPEN || this.status !== 'connected') return false
    return this._write(frame)
  }

  // ------------------------------------------------------------ the socket

  _open () {
    clearTimeout(this._reconnectTimer)
    this._retryAfter = 0 // said about an earlier socket
    this._setStatus('connecting')
    let ws
    try {
      ws = new this.WebSocketPolyfill(this.url)
    } catch (error) {
      this._scheduleReconnect()
      return
    }
    this._ws = ws
    ws.onopen = async () => {
      this._lastReceived = Date.now()
      let token = null
      try {
        token = typeof this.token === 'function' ? await this.token() : this.token
      } catch (error) {
        this.emit('error', [{ code: 'token_unavailable', message: String(error?.message ?? error) }])
      }
      if (this._ws === ws) this._write({ op: 'hello', session: this.session, protocol: 1, token })
    }
    ws.onmessage = (event) => {
      if (this._ws !== ws) return
      this._lastReceived = Date.now()
      this._receive(event.data)
    }
    ws.onerror = () => {} // a close event follows; the reconnect is scheduled there
    ws.onclose = (event) => { if (this._ws === ws) this._closed(event?.code) }
  }

  _write (frame) {
    try {
      this._ws.send(JSON.stringify(frame))
      this._lastSent = Date.now()
      return true
    } catch (error) {
      return false
    }
  }

  /** The socket closed (`code`: its close code; none when the client dropped it). */
  _closed (code) {
    this._ws = null
    clearInterval(this._ticker)
    this._ticker = null
    const wasConnected = this.status === 'connected'
    const slowDown = SLOW_DOWN_CLOSES.has(code)
    if (slowDown) this._retryAfter = this._retryAfter || SLOW_DOWN_DEFAULT_MS
    // A session that opened resets the backoff, unless the server told it to slow down soon after.
    if (wasConnected && !(slowDown && Date.now() - this._welcomedAt < STABLE_CONNECTION_MS)) this._attempt = 0
    this._setStatus('disconnected')
    if (wasConnected) for (const provider of this.providers.values()) provider._disconnected()
    if (this._shouldConnect) this._scheduleReconnect()
  }

  _scheduleReconnect () {
    clearTimeout(this._reconnectTimer)
    const delay = Math.max(this.backoff.delay(this._attempt++), this._retryAfter)
    this._retryAfter = 0
    this._reconnectTimer = setTimeout(() => { if (this._shouldConnect && this._ws === null) this._open() }, delay)
  }

  /** The network is back: do not wait out the backoff. */
  _reconnectNow () {
    if (!this._shouldConnect || this._ws !== null) return
    this._attempt = 0
    this._open()
  }

  _dropSocket () {
    const ws = this._ws
    if (ws === null) return
    try { ws.close(4000) } catch (error) {}
    this._closed()
  }

  _setStatus (status) {
    if (this.status === status) return
    this.status = status
    this.emit('status', [{ status }])
  }

  // ------------------------------------------------------------ frames in

  _receive (data) {
    let frame
    try {
      frame = JSON.parse(data)
    } catch (error) {
      this.emit('error', [{ code: 'malformed_frame', message: 'the server sent a frame that is not JSON' }])
      return
    }
    if (frame.op === 'welcome') this._welcome(frame)
    else if (frame.op === 'appended') this._appended(frame)
    else if (frame.op === 'error') this._error(frame)
    else if (frame.op === 'pong') {} // eslint-disable-line no-empty
    else if (typeof frame.doc === 'string') this.providers.get(frame.doc)?._receive(frame)
  }

  _welcome (frame) {
    this.session = frame.session
    this.limits = frame.limits || null
    this.features = new Set(Array.isArray(frame.features) ? frame.features : [])
    this._welcomedAt = Date.now() // the backoff is reset when this connection ends (_closed)
    this._setStatus('connected')
    this.buffer.resetAttempts()
    for (const provider of this.providers.values()) provider._connected()
    this.store?.saveSession(this.url, this.session, this.buffer.clock).catch((error) => this._storeFailed(error))
    this._pump()
    clearInterval(this._ticker)
    this._ticker = setInterval(() => this._tick(), this.tickInterval)
    this.emit('session', [{ session: this.session, resumed: frame.resumed }])
  }

  _appended (frame) {
    this.buffer.answered() // the connection is read: what was sent after this is answered in turn
    const item = this._settle(frame.clock)
    this.providers.get(frame.doc)?._appended(frame, item)
    this._pump() // an update refused behind this one may go now
  }

  _error (frame) {
    if (Number.isInteger(frame.clock)) this.buffer.answered()
    const item = Number.isInteger(frame.clock) ? this.buffer.get(frame.clock) : undefined
    // Every error about an update names its document.
    if (item !== undefined && typeof frame.doc !== 'string') frame = { ...frame, doc: item.doc }
    if (item === undefined) {
      if (Number.isInteger(frame.retry_after_ms) && typeof frame.doc !== 'string') {
        // About the connection (a refusal, or rate_limited before a 4429): the close follows; reconnect no sooner.
        this._retryAfter = frame.retry_after_ms
      }
    } else if (frame.code === 'malformed_frame' && item.parts > 1) {
      this.buffer.hold(frame.clock) // its parts were discarded (one was refused): all again, from part 0
    } else if (FATAL_UPDATE_ERRORS.has(frame.code)) {
      this._settle(frame.clock) // resending cannot help; the local edit stays in the document
    } else if (frame.code === 'rate_limited') {
      this.buffer.defer(frame.clock, frame.retry_after_ms ?? 1000)
    } else if (frame.code === 'missing_dependency') {
      if (this.buffer.refuse(frame.clock) === NEEDS_SYNC) this.providers.get(item.doc)?._pushSync()
    } else {
      this.buffer.hold(frame.clock) // unavailable, internal_error, ...: resent on its schedule, in order
    }
    this._emitError(frame)
    this._pump()
  }

  /** An `error` event on the client and on the document's provider. */
  _emitError (frame) {
    this.emit('error', [frame])
    if (typeof frame.doc === 'string') this.providers.get(frame.doc)?._receive(frame)
  }

  /** An update is done with (acked, or rejected for good): out of the buffer and the store. */
  _settle (clock) {
    const item = this.buffer.pop(clock)
    if (item !== undefined) this._forget(clock)
    return item
  }

  _persist (item) {
    this.store?.putPending(this.url, this.session, item, this.buffer.clock).catch((error) => this._storeFailed(error))
  }

  _forget (clock) {
    this.store?.deletePending(this.url, clock).catch((error) => this._storeFailed(error))
  }

  // ------------------------------------------------------------ persistence

  async _restore (name) {
    try {
      const store = await BrowserStore.open(name)
      const saved = await store.loadSession(this.url)
      if (this.session === null) this.session = saved.session
      this.buffer.clock = Math.max(this.buffer.clock, saved.clock)
      for (const item of saved.pending) this.buffer.restore(item)
      this.store = store
    } catch (error) {
      this._storeFailed(error) // carry on in memory: syncing matters more than surviving a reload
    }
  }

  _storeFailed (error) {
    this.emit('error', [{ code: 'persistence_failed', message: String(error?.message ?? error) }])
  }

  // ------------------------------------------------------------ timers

  /** Send what is due, in order (SendBuffer.due); nothing while the session is not open. */
  _pump (now = Date.now()) {
    if (this.status !== 'connected') return
    for (const item of this.buffer.due(now, (doc) => this.providers.has(doc))) {
      if (this.buffer.get(item.clock) === item) this._sendUpdate(item) // a local refusal may have dropped it
    }
  }

  _sendUpdate (item) {
    this._coalesce(item)
    const plan = updateFrames(item, this.limits, this.features)
    if (plan.refused) {
      this._settle(item.clock)
      const { doc, clock } = item
      this._emitError({ op: 'error', code: 'update_too_large', local: true, doc, clock, ...plan.refused })
      this.providers.get(item.doc)?._emitPending()
      return
    }
    this.buffer.markSent(item)
    item.parts = plan.frames.length
    for (const frame of plan.frames) this.send(frame)
  }

  /** Merge never-sent updates of the document that follow `item` into it (fewer frames; never past half a frame). */
  _coalesce (item) {
    if (item.sent || item.sync) return
    const merged = this.buffer.coalesce(item.doc, mergeUpdates, this._mergeBytes())
    if (merged === null) return
    this._persist(merged.item)
    for (const removed of merged.removed) this._forget(removed.clock)
  }

  _mergeBytes () {
    const frame = this.limits?.max_frame_bytes
    return Number.isInteger(frame) ? Math.floor(frame / 2) : 512 * 1024
  }

  /** Resends on their backoff schedule, the keep-alive, and the give-up path. */
  _tick () {
    const now = Date.now()
    if (now - this._lastReceived > this.idleTimeout) {
      this._dropSocket() // half-open: nothing heard, not even a pong
      return
    }
    if (this.buffer.exhausted((doc) => this.providers.has(doc))) {
      for (const provider of this.providers.values()) provider.needsSync = true
      this._dropSocket()
      return
    }
    this._pump(now)
    if (now - this._lastSent > this.pingInterval) this.send({ op: 'ping' })
  }
}
