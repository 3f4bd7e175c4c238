/**
 * `node --import <this file>` with YRELAY_Y_WEBSOCKET=y-websocket-1 (or -3):
 * web/test-stock's suite, written against `import ... from 'y-websocket'`
 * (web's 2.1.0), runs with that stock version from this directory's lockfile
 * instead (tests/test_yws_stock.py). See version-hooks.mjs.
 */
import { register } from 'node:module'

if (process.env.YRELAY_Y_WEBSOCKET) register('./version-hooks.mjs', import.meta.url)
