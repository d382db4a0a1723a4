"use strict";
/**
 * The replies of `Client.request`: one reply inbox per client and sender, and the
 * requests waiting on it (the same convention as the Python SDK's sdk/replies.py).
 *
 * The inbox is `_INBOX.<sender>.<nonce>`, registered by the client on its first request
 * as that sender and consumed by it alone: two processes of one sender each have their
 * own, so neither takes the other's replies. A reply is matched to its request by
 * `parentId`. One that no request waits for (its request gave up, or it answers
 * nothing) is refused: the client nacks it with code `late_reply`, a dead letter, never
 * handed to a later request. No I/O here.
 *
 * A reply can arrive before the publish of its request has been answered (a quick
 * consumer); while a publish is in flight, such a reply is kept for it.
 */

const LATE_REPLY = "late_reply";
const GAVE_UP_KEPT = 10_000; // requests that timed out, remembered to refuse their replies

class ReplyInbox {
  constructor(subject) {
    this.subject = subject;
    /** request id -> resolve(envelope) */
    this._waiting = new Map();
    /** request id -> envelope: replies that came before their publish was answered */
    this._early = new Map();
    this._publishing = 0;
    /** the latest requests that timed out (insertion order: oldest first) */
    this._gaveUp = new Set();
  }

  publishing() {
    this._publishing += 1;
  }

  /**
   * The publish of a request was answered (`requestId` null: it failed or reached no
   * endpoint). Returns a promise of its reply's envelope (never settles for null).
   */
  published(requestId) {
    this._publishing -= 1;
    let reply = new Promise(() => {});
    if (requestId !== null) {
      const early = this._early.get(requestId);
      this._early.delete(requestId);
      reply = early ? Promise.resolve(early) : new Promise((resolve) => this._waiting.set(requestId, resolve));
    }
    if (this._publishing === 0) this._early.clear(); // kept for a request that never claimed them
    return reply;
  }

  /** The request timed out: a reply that comes now is late. */
  giveUp(requestId) {
    this._waiting.delete(requestId);
    this._gaveUp.add(requestId);
    if (this._gaveUp.size > GAVE_UP_KEPT) this._gaveUp.delete(this._gaveUp.values().next().value);
  }

  /**
   * A message in the inbox: true when it is handed to its request (or kept for one
   * whose publish is in flight), false when it is late and must be refused.
   * @param {object} envelope
   */
  arrived(envelope) {
    const parent = envelope.parentId;
    const waiting = parent ? this._waiting.get(parent) : undefined;
    if (waiting) {
      this._waiting.delete(parent);
      waiting(envelope);
      return true;
    }
    if (parent && this._publishing > 0 && !this._gaveUp.has(parent)) {
      this._early.set(parent, envelope);
      return true;
    }
    return false;
  }
}

module.exports = { ReplyInbox, LATE_REPLY };
