/**
 * Exponential backoff with jitter and a maximum, shared by resends and
 * reconnects (the twin of yrelay/backoff.py): delay(n) =
 * min(base * factor^n, maxDelay), scaled by a random factor in
 * [1 - jitter, 1] so that clients cut off together do not come back together.
 */
export class Backoff {
  constructor ({ base = 250, factor = 2, maxDelay = 10000, jitter = 0.5, maxAttempts = 8 } = {}) {
    this.base = base
    this.factor = factor
    this.maxDelay = maxDelay
    this.jitter = jitter
    /** Sends of one update before the client gives up and resyncs in full. */
    this.maxAttempts = maxAttempts
  }

  /** Milliseconds to wait before attempt `attempt` (0-based). */
  delay (attempt) {
    const raw = Math.min(this.base * this.factor ** Math.max(attempt, 0), this.maxDelay)
    return raw * (1 - this.jitter * Math.random())
  }
}
