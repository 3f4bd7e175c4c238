/**
 * Builds what `yrelay serve` serves under /static (into yrelay/app/static):
 * the demo editor (demo.js, index.html, demo.css) and the provider as one ES
 * module for apps without a bundler (yrelay-client.js, which also exports
 * its Yjs as `Y`, so a page never loads two copies of Yjs).
 */
import { build } from 'esbuild'
import { copyFile, mkdir } from 'node:fs/promises'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

const here = dirname(fileURLToPath(import.meta.url))
const out = join(here, '..', 'yrelay', 'app', 'static')
await mkdir(out, { recursive: true })

const common = { bundle: true, format: 'esm', target: 'es2020', sourcemap: true, minify: true, logLevel: 'warning' }
await build({ ...common, entryPoints: [join(here, 'demo', 'main.js')], outfile: join(out, 'demo.js') })
await build({ ...common, entryPoints: [join(here, 'src', 'bundle.js')], outfile: join(out, 'yrelay-client.js') })
for (const file of ['index.html', 'demo.css']) await copyFile(join(here, 'demo', file), join(out, file))
console.log(`built the web client into ${out}`)
