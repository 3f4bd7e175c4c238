/**
 * Type declarations of @yrelay/client's public API (src/index.js), written by
 * hand next to the JavaScript they describe: keep them in step when an
 * export, an option or an event changes (tests/test_web_package.py checks
 * that every export declared here exists and that a TypeScript app using
 * them type-checks). Yjs, y-protocols and lib0 types come from the app's
 * own copies (peer dependencies), so a `Y.Doc` here is the app's `Y.Doc`.
 */
import type * as Y from 'yjs'
import type { Awareness } from 'y-protocols/awareness'
import { ObservableV2 } from 'lib0/observable'

/** The shared socket's state. */
export type ConnectionStatus = 'connecting' | 'connected' | 'disconnected'

/**
 * An `error` frame from the server (docs/protocol.md), or one the client
 * makes itself (`update_too_large` with `local: true`, `persistence_failed`,
 * `token_unavailable`, `hash_unavailable`, `malformed_frame`).
 */
export interface ErrorFrame {
  op?: 'error'
  code: string
  message: string
  /** The document the error is about (always set for an error about an update). */
  doc?: string
  /** The session clock of the update it is about. */
  clock?: number
  /** `rate_limited` (without `doc`: before a close 4429), `overloaded`, `too_many_connections`: wait at least this long. */
  retry_after_ms?: number
  /** `update_too_large` refused by the provider itself, never sent. */
  local?: boolean
  size?: number
  limit?: number
  [field: string]: unknown
}

/** `{yjs client id: [[start, end], ...]}`: clock ranges of a sync push the server could not store yet. */
export type DroppedRanges = Record<string, Array<[number, number]>>

/** Limits the server announced in `welcome` (docs/protocol.md). */
export interface ServerLimits {
  max_frame_bytes?: number
  max_update_bytes?: number
  [limit: string]: unknown
}

export interface BackoffOptions {
  /** ms before the first retry (250). */
  base?: number
  /** growth per attempt (2). */
  factor?: number
  /** ms cap (10000). */
  maxDelay?: number
  /** fraction of the delay taken off at random, 0..1 (0.5). */
  jitter?: number
  /** sends of one update before the client gives up and resyncs in full (8). */
  maxAttempts?: number
}

/** Exponential backoff with jitter, shared by resends and reconnects (ms). */
export class Backoff {
  constructor (options?: BackoffOptions)
  base: number
  factor: number
  maxDelay: number
  jitter: number
  maxAttempts: number
  /** Milliseconds to wait before attempt `attempt` (0-based). */
  delay (attempt: number): number
}

/** A WebSocket class: the browser's, or in Node the `ws` package's default export. */
export type WebSocketClass = new (url: string) => {
  readyState: number
  send (data: string): void
  close (code?: number, reason?: string): void
  onopen: ((...args: any[]) => any) | null
  onmessage: ((...args: any[]) => any) | null
  onclose: ((...args: any[]) => any) | null
  onerror: ((...args: any[]) => any) | null
}

export interface ClientOptions {
  /** A WebSocket class (default `globalThis.WebSocket`; in Node < 22: the `ws` package). */
  WebSocketPolyfill?: WebSocketClass
  /** Resend and reconnect timing (ms). */
  backoff?: Backoff | BackoffOptions
  /** A session id to resume. */
  session?: string | null
  /** Connect at once (true). */
  connect?: boolean
  /** ms of silence before a ping (15000). */
  pingInterval?: number
  /** ms without any frame before the socket is taken for dead (45000). */
  idleTimeout?: number
  tickInterval?: number
  /** Keep the session and unacked updates in IndexedDB: a database name, or true for "yrelay". */
  persist?: boolean | string
  /** The credential sent in `hello` (docs/security.md); a function is asked again before every connect. */
  token?: string | null | (() => string | Promise<string>)
}

export interface ClientEvents {
  status: (event: { status: ConnectionStatus }) => void
  error: (frame: ErrorFrame) => void
  session: (event: { session: string, resumed: boolean }) => void
}

/** One websocket to a yrelay server, shared by every document bound through it. */
export class YrelayClient extends ObservableV2<ClientEvents> {
  constructor (url: string, options?: ClientOptions)
  /** One client per URL, so every document of a page shares one socket. */
  static shared (url: string, options?: ClientOptions): YrelayClient
  readonly url: string
  status: ConnectionStatus
  session: string | null
  limits: ServerLimits | null
  /** Additive protocol features the server announced (docs/protocol.md#features). */
  features: Set<string>
  /** The providers bound to this client, by document name. */
  readonly providers: Map<string, YrelayProvider>
  backoff: Backoff
  /** Resolves once the persisted session and updates are restored (at once without persistence). */
  readonly ready: Promise<void>
  /** Updates not yet acked by the server, all documents. */
  readonly pending: number
  /** Start (or resume) connecting; reconnects by itself until `disconnect()`. */
  connect (): void
  /** Close the socket and stay offline; edits keep collecting in the send buffer. */
  disconnect (): void
  /** Close for good: providers are released (not unsubscribed, so the session stays resumable). */
  destroy (): void
}

/** Updates that cannot succeed when resent (`invalid_update`, `forbidden`, ...). */
export const FATAL_UPDATE_ERRORS: ReadonlySet<string>

export interface ProviderOptions {
  /** A y-protocols Awareness to relay; a new one by default (`provider.awareness`); null: no presence. */
  awareness?: Awareness | null
  /** ms to collect local changes while earlier ones await their ack (50). */
  batchDelay?: number
  /** Keep the document, its place and unacked updates in IndexedDB: a database name, or true for "yrelay". */
  persist?: boolean | string
  /** ms to gather changes before the document record is saved (250). */
  persistDelay?: number
  /** Options of the shared YrelayClient made for a URL. */
  clientOptions?: ClientOptions
}

export interface AppendedEvent {
  clock: number
  /** The stream entry the update became; null for a sync push none of which could be stored yet. */
  id: string | null
  update: Uint8Array
  sync: boolean
  dropped?: DroppedRanges
}

export interface ProviderEvents {
  status: (event: { status: ConnectionStatus }) => void
  /** The document holds the server's state (false while disconnected or resyncing). */
  synced: (synced: boolean) => void
  /** Local updates not yet in the server's stream. */
  pending: (count: number) => void
  /** The last stream id the document holds (acked to the server). */
  offset: (offset: string) => void
  appended: (event: AppendedEvent) => void
  dropped: (event: { clock: number, ranges: DroppedRanges }) => void
  resync: (event: { reason: string }) => void
  drift: (event: { server: { count: number, hash: string } }) => void
  error: (frame: ErrorFrame) => void
  /** An operator deleted the document (`error document_deleted`): the provider is unbound. */
  deleted: () => void
}

/** Binds one Y.Doc to one document of a yrelay server. */
export class YrelayProvider extends ObservableV2<ProviderEvents> {
  /**
   * @param server a websocket URL (one shared client per URL) or a client
   * @param name the document id (1-200 of A-Z a-z 0-9 . _ - : / @ and %XX escapes: docs/protocol.md)
   */
  constructor (server: string | YrelayClient, name: string, doc: Y.Doc, options?: ProviderOptions)
  readonly client: YrelayClient
  readonly name: string
  readonly doc: Y.Doc
  readonly awareness: Awareness | null
  batchDelay: number
  persistDelay: number
  /** The last stream id this document holds (and acked); null before the first answer. */
  offset: string | null
  held: HeldEntries
  synced: boolean
  /** Resubscribes where the drift digests differed. */
  drifts: number
  /** The document was deleted by an operator (the `deleted` event). */
  deleted?: boolean
  resyncs: number
  /** Local changes not yet in the server's stream. */
  readonly pending: number
  readonly status: ConnectionStatus
  /** Resolves once persisted state (if any) is loaded and the document is bound to the client. */
  readonly whenReady: Promise<void>
  /** Stop syncing this document: unsubscribe and release the doc. */
  destroy (): void
}

/** The stream ids a document holds, for its drift digest. */
export class HeldEntries {
  constructor (since?: string, maxIds?: number)
  since: string
  maxIds: number
  readonly size: number
  /** The highest id held (`since` when none is). */
  readonly last: string
  /** Count `id` once; false when it was already held or is at or below `since`. */
  add (id: string): boolean
  /** Forget ids at or below `since`. */
  rebase (since: string): void
  /** After a resync to `since`. */
  reset (since: string): void
  /** The held ids in order. */
  ids (): string[]
  /** Count and XOR of xxh3_128 of the held ids in (since, through]. */
  digest (through: string): { count: number, hash: bigint }
}

/** Resolves once `itemHash` can be called (hash-wasm loads its WebAssembly). */
export function hashReady (): Promise<void>
/** xxh3_128 of the UTF-8 bytes of `item`. */
export function itemHash (item: string): bigint
/** The wire form of a 128-bit hash: 32 lowercase hex digits. */
export function hashHex (value: bigint): string

export interface PendingRecord {
  clock: number
  doc: string
  update: Uint8Array
  sync: boolean
}

export interface DocumentRecord {
  state: Uint8Array
  offset: string | null
  since: string
  held: string[]
  [field: string]: unknown
}

/** The IndexedDB store behind `persist` (browsers only). */
export class BrowserStore {
  constructor (db: IDBDatabase)
  readonly db: IDBDatabase
  /** Open (or create) the database `name` in this origin. */
  static open (name?: string): Promise<BrowserStore>
  loadSession (url: string): Promise<{ session: string | null, clock: number, pending: PendingRecord[] }>
  saveSession (url: string, session: string | null, clock: number): Promise<unknown>
  putPending (url: string, session: string | null, item: { clock: number, doc: string, update: Uint8Array, sync?: boolean }, clock?: number): Promise<unknown>
  deletePending (url: string, clock: number): Promise<unknown>
  loadDocument (url: string, doc: string): Promise<DocumentRecord | undefined>
  saveDocument (url: string, doc: string, record: DocumentRecord): Promise<unknown>
  deleteDocument (url: string, doc: string): Promise<unknown>
  close (): void
}
