/**
 * Set digests: count + XOR of xxh3_128 over a set of string ids, exactly as
 * the server computes them (yrelay/reconciliation/digest.py): the hash of an
 * id is xxh3_128 of its UTF-8 bytes read as a 128-bit big-endian number,
 * sent as 32 lowercase hex digits.
 *
 * xxh3_128 comes from hash-wasm (WebAssembly, works in browsers and Node);
 * its hasher is created asynchronously once, then hashes synchronously, so
 * call `hashReady()` before the first digest.
 */
import { createXXHash128 } from 'hash-wasm'

let hasher = null
let loading = null

/** Resolves once `itemHash` can be called. */
export function hashReady () {
  if (loading === null) {
    loading = createXXHash128().then((created) => { hasher = created })
  }
  return loading
}

/** xxh3_128 of the UTF-8 bytes of `item`, as a BigInt. */
export function itemHash (item) {
  if (hasher === null) throw new Error('call hashReady() before hashing')
  hasher.init()
  hasher.update(item)
  return BigInt('0x' + hasher.digest('hex'))
}

/** The wire form of a 128-bit hash. */
export function hashHex (value) {
  return value.toString(16).padStart(32, '0')
}

/** `{count, hash}` as the protocol sends it. */
export function toWire (count, hash) {
  return { count, hash: hashHex(hash) }
}
