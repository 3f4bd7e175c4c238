/**
 * Module resolution hooks (registered by version.mjs): `y-websocket` is the
 * version named by YRELAY_Y_WEBSOCKET (an alias of this directory's
 * package.json), and the bare imports of that package (yjs, lib0,
 * y-protocols) resolve from the working directory (the suite's package, as
 * its own imports do). One copy of yjs is loaded: two copies break Yjs's
 * constructor checks, and the suite's Y.Doc must be the one the provider syncs.
 */
import { pathToFileURL } from 'node:url'

const VERSION = process.env.YRELAY_Y_WEBSOCKET
const HERE = new URL('./package.json', import.meta.url).href
const ALIASED = new URL(`./node_modules/${VERSION}/`, import.meta.url).href
const SUITE = pathToFileURL(`${process.cwd()}/package.json`).href

const bare = (specifier) => !/^(\.|\/|[a-z]+:)/.test(specifier)

export async function resolve (specifier, context, next) {
  if (specifier === 'y-websocket') return next(VERSION, { ...context, parentURL: HERE })
  if (context.parentURL?.startsWith(ALIASED) && bare(specifier)) {
    return next(specifier, { ...context, parentURL: SUITE })
  }
  return next(specifier, context)
}
