// A TypeScript app using @yrelay/client's public API: tests/test_web_package.py
// runs `tsc --noEmit` on it against the packed package (strict, two module
// resolutions). Each @ts-expect-error is a misuse the declarations must refuse.
import * as Y from 'yjs'
import { Awareness } from 'y-protocols/awareness'
import {
  Backoff, FATAL_UPDATE_ERRORS, YrelayClient, YrelayProvider,
  type AppendedEvent, type ConnectionStatus, type ErrorFrame
} from '@yrelay/client'

const doc = new Y.Doc()
const provider = new YrelayProvider('wss://sync.example.com/ws', 'notes', doc, { batchDelay: 20, persist: 'my-app' })
provider.on('synced', (synced: boolean) => { if (synced && doc.getText('text').length === 0) doc.getText('text').insert(0, 'hi') })
provider.on('error', (frame: ErrorFrame) => { if (FATAL_UPDATE_ERRORS.has(frame.code)) console.warn(frame.message, frame.doc) })
provider.on('appended', (event: AppendedEvent) => console.log(event.id ?? 'pending', event.clock))
provider.on('status', ({ status }) => { const now: ConnectionStatus = status; console.log(now) })
provider.awareness?.setLocalStateField('user', { name: 'Ada', color: '#30bced' })
const pending: number = provider.pending
const offset: string | null = provider.offset
const sameDoc: Y.Doc = provider.doc
void provider.whenReady.then(() => provider.destroy())

const client = new YrelayClient('wss://sync.example.com/ws', {
  backoff: new Backoff({ base: 100, maxAttempts: 5 }),
  token: async () => 'a token',
})
client.on('session', ({ session, resumed }) => console.log(session, resumed))
const other = new YrelayProvider(client, 'other', new Y.Doc(), { awareness: new Awareness(doc) })
const none = new YrelayProvider(YrelayClient.shared('wss://sync.example.com/ws'), 'quiet', new Y.Doc(), { awareness: null })
console.log(pending, offset, sameDoc.guid, other.name, none.awareness, client.pending)

// @ts-expect-error a provider binds a Y.Doc, not a string
new YrelayProvider(client, 'wrong', 'not a doc')
// @ts-expect-error no such event
provider.on('no-such-event', () => {})
// @ts-expect-error `synced` hands a boolean
provider.on('synced', (synced: string) => console.log(synced))
// @ts-expect-error batchDelay is a number of milliseconds
new YrelayProvider(client, 'wrong', doc, { batchDelay: 'soon' })
