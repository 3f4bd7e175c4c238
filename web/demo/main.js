/**
 * The demo page served at `/`: a CodeMirror editor bound to the Y.Text
 * "text" of the document named in the URL (?doc=...), with remote cursors
 * from presence, and a status bar showing what the provider knows.
 * URL parameters: doc, user, server (a ws:// URL; default: this host's /ws),
 * persist=0 (do not keep the document in IndexedDB); and #token=<jwt> in the fragment.
 * provider=y-websocket: the same editor on the stock y-websocket provider over
 * /yws (an existing app's provider, unchanged), to edit one document side by side.
 */
import * as Y from 'yjs'
import { EditorView, basicSetup } from 'codemirror'
import { yCollab } from 'y-codemirror.next'
import { WebsocketProvider } from 'y-websocket'
import { YrelayProvider } from '../src/index.js'

const COLORS = ['#30bced', '#6eeb83', '#ffbc42', '#ee6352', '#9ac2c9', '#8acb88', '#1be7ff', '#e84855']

const params = new URLSearchParams(window.location.search)
const docName = params.get('doc') || 'demo'
const stock = params.get('provider') === 'y-websocket'
const serverUrl = params.get('server') ||
  `${window.location.protocol === 'https:' ? 'wss' : 'ws'}://${window.location.host}/${stock ? 'yws' : 'ws'}`
const userName = params.get('user') || `guest-${Math.floor(Math.random() * 1000)}`
const color = COLORS[Math.floor(Math.random() * COLORS.length)]

const doc = new Y.Doc()
const text = doc.getText('text')
// A token (servers with authentication on) comes in the URL fragment, #token=...:
// fragments never reach a server, so it stays out of access logs.
const token = new URLSearchParams(window.location.hash.slice(1)).get('token')
// Persisted in IndexedDB: a reload keeps the document and every edit not yet acked (?persist=0: off).
const provider = stock
  ? new WebsocketProvider(serverUrl, docName, doc, { protocols: token ? ['yrelay.yws', 'yrelay.auth.' + token] : [] })
  : new YrelayProvider(serverUrl, docName, doc, { persist: params.get('persist') !== '0', clientOptions: { token } })
provider.awareness.setLocalStateField('user', { name: userName, color, colorLight: color + '33' })

new EditorView({ // eslint-disable-line no-new
  parent: document.querySelector('#editor'),
  extensions: [basicSetup, EditorView.lineWrapping, yCollab(text, provider.awareness)]
})

const show = (id, value) => { document.getElementById(id).textContent = value }
const statusLabel = document.getElementById('status')
const showStatus = (status) => { statusLabel.textContent = status; statusLabel.dataset.status = status }
showStatus(provider.status || (provider.wsconnected ? 'connected' : 'connecting'))
provider.on('status', ({ status }) => showStatus(status))
provider.on('synced', (synced) => show('synced', synced ? 'yes' : 'no'))
provider.on('pending', (count) => show('pending', String(count)))
provider.on('offset', (offset) => show('offset', offset))
if (stock) { // y-websocket has no acks: the server stores each edit, the provider is never told
  document.querySelectorAll('.acked-only').forEach((element) => { element.hidden = true })
  show('footer', 'The stock y-websocket provider: the server stores every edit before anyone sees it, but ' +
    'this provider is never told; what a lost connection held is sent again by the sync on reconnect.')
}
provider.on('error', (frame) => console.warn('yrelay:', frame.code, frame.message))

const peers = document.getElementById('peers')
provider.awareness.on('change', () => {
  peers.replaceChildren(...[...provider.awareness.getStates().values()]
    .filter((state) => state.user)
    .map((state) => Object.assign(document.createElement('span'), {
      textContent: state.user.name, style: `background: ${state.user.color}`
    })))
})
provider.awareness.emit('change', [{ added: [], updated: [], removed: [] }, 'local'])

const docInput = document.getElementById('doc-name')
docInput.value = docName
docInput.addEventListener('change', () => {
  params.set('doc', docInput.value)
  window.location.search = params.toString()
})
const userInput = document.getElementById('user-name')
userInput.value = userName
userInput.addEventListener('change', () => {
  provider.awareness.setLocalStateField('user', { name: userInput.value, color, colorLight: color + '33' })
})

// For tests and the curious: the page's live objects.
window.yrelay = { doc, text, provider, awareness: provider.awareness }
