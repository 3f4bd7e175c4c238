/** Entry of the standalone bundle served at /static/yrelay-client.js: the provider plus the Yjs it uses. */
export * from './index.js'
export * as Y from 'yjs'
export { Awareness } from 'y-protocols/awareness'
