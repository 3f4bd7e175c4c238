/**
 * One update as `update` frames (docs/protocol.md#large-updates): one frame
 * when it fits in the server's `limits.max_frame_bytes`, else `parts`
 * consecutive frames with the same doc and clock, each carrying the base64
 * of one slice, when the server announced `update_parts`. An update the
 * server could never take (over `limits.max_update_bytes`, or larger than a
 * frame for a server without parts) is refused here, before anything is
 * sent: a frame over the server's websocket limit would close the socket
 * and poison every other document on it.
 */
import { toBase64 } from 'lib0/buffer'

/** Slack for what JSON.stringify might add beyond the measured envelope. */
const ENVELOPE_SLACK = 32

/** The characters of a frame around its base64 payload (doc ids are ASCII, so characters are bytes). */
function envelope (item, parts) {
  const frame = { op: 'update', doc: item.doc, clock: item.clock, update: '' }
  if (item.sync) frame.sync = true
  if (parts > 1) Object.assign(frame, { part: parts - 1, parts })
  return JSON.stringify(frame).length + ENVELOPE_SLACK
}

function base64Length (bytes) { return 4 * Math.ceil(bytes / 3) }

/**
 * Plan the frames of `item` under `limits` ({max_frame_bytes, max_update_bytes};
 * null: no limits known) and `features` (a Set). Returns {frames} or
 * {refused: {size, limit, message}}.
 */
export function updateFrames (item, limits, features) {
  const size = item.update.length
  const maxUpdate = limits?.max_update_bytes
  if (Number.isInteger(maxUpdate) && size > maxUpdate) {
    const message = `the update is ${size} bytes, over the server's max_update_bytes (${maxUpdate}); not sent`
    return { refused: { size, limit: maxUpdate, message } }
  }
  const maxFrame = limits?.max_frame_bytes
  if (!Number.isInteger(maxFrame) || envelope(item, 1) + base64Length(size) <= maxFrame) {
    return { frames: [frame(item, item.update)] }
  }
  if (!features.has('update_parts')) {
    const message = `the update is ${size} bytes, larger than a frame (max_frame_bytes ${maxFrame}), ` +
      'and the server does not take updates in parts; not sent'
    return { refused: { size, limit: maxFrame, message } }
  }
  const slice = sliceBytes(item, maxFrame, size)
  const parts = Math.ceil(size / slice)
  const frames = []
  for (let part = 0; part < parts; part++) {
    frames.push({ ...frame(item, item.update.subarray(part * slice, (part + 1) * slice)), part, parts })
  }
  return { frames }
}

/** Bytes per part: a multiple of 3 (no base64 padding inside), the envelope measured with the largest part numbers. */
function sliceBytes (item, maxFrame, size) {
  let parts = 2
  for (;;) {
    const slice = Math.floor((maxFrame - envelope(item, parts)) / 4) * 3
    if (slice <= 0) throw new Error(`max_frame_bytes ${maxFrame} leaves no room for an update of ${item.doc}`)
    const needed = Math.ceil(size / slice)
    if (needed <= parts) return slice
    parts = needed
  }
}

function frame (item, bytes) {
  const out = { op: 'update', doc: item.doc, clock: item.clock, update: toBase64(bytes) }
  if (item.sync) out.sync = true
  return out
}
