/**
 * Stream ids ("<ms>-<seq>") as the server issues them.
 *
 * The protocol promises seq <= 999, so an id maps to one exact JavaScript
 * number, ms * 1000 + seq (below 2^53 for any ms this millennium): ids then
 * compare, sort and key maps as plain numbers.
 */

export const ZERO = '0-0'

const ID = /^(\d{1,16})-(\d{1,3})$/

/** The sortable number of a stream id; throws on anything the server could not have issued. */
export function idKey (id) {
  const match = ID.exec(id)
  if (match === null) throw new Error(`not a stream id: ${String(id).slice(0, 40)}`)
  return Number(match[1]) * 1000 + Number(match[2])
}

/** The larger of two ids; `current` may be null (nothing held yet). */
export function maxId (current, candidate) {
  if (current === null || idKey(candidate) > idKey(current)) return candidate
  return current
}
