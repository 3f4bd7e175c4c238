/**
 * The yrelay browser client. Three lines bind a Y.Doc to a document:
 *
 *   import { YrelayProvider } from '@yrelay/client'
 *   const doc = new Y.Doc()
 *   const provider = new YrelayProvider('wss://example.com/ws', 'my-document', doc)
 */
export { YrelayProvider } from './provider.js'
export { YrelayClient, FATAL_UPDATE_ERRORS } from './client.js'
export { Backoff } from './backoff.js'
export { HeldEntries } from './held-entries.js'
export { hashReady, itemHash, hashHex } from './digest.js'
export { BrowserStore } from './persistence.js'
