"use strict";
/**
 * The Node.js Relay client: `connect()` returns a `Client` speaking docs/protocol.md.
 *
 * One DEALER socket carries requests, replies and pushed messages; replies are matched
 * to requests by `rid`, so any number of requests can be in flight. A SUB socket for
 * signals is opened on the first `onSignal`. While the client holds subscriptions or
 * unacknowledged messages it pings once a second, or four times per session timeout
 * when that is shorter (the router ends a session silent for 5 s by default, and hands
 * out again what it held).
 *
 * Messages come pushed to a subscription (`subscribe`, `consume`) or pulled (`fetch`);
 * either way each says `deliveries` and answers itself with a confirmed `ack()`,
 * `nack(reason)` or `inProgress()`. `request()` asks and waits for the reply
 * (lib/replies.js); `sendRequest()` is the protocol's own request, any operation.
 */
const crypto = require("node:crypto");
const fs = require("node:fs");
const os = require("node:os");
const path = require("node:path");
const zmq = require("zeromq");

const subjects = require("./subjects");
const wire = require("./wire");
const { ReplyInbox, LATE_REPLY } = require("./replies");
const {
  InvalidMessageError,
  InvalidStateError,
  RelayError,
  TimeoutError,
  UnavailableError,
  errorFromWire,
} = require("./errors");

const DEFAULT_TIMEOUT_MS = 10_000;
const DEFAULT_REQUEST_TIMEOUT_MS = 30_000;
const HEARTBEAT_MS = 1_000; // the longest gap between pings

/** Ms between pings: at most a second, four within a shorter session timeout. */
function pingInterval(sessionTimeoutMs) {
  if (!Number.isInteger(sessionTimeoutMs) || sessionTimeoutMs <= 0) return HEARTBEAT_MS;
  return Math.min(HEARTBEAT_MS, Math.max(50, Math.floor(sessionTimeoutMs / 4)));
}

/** The requests address of a data directory: ipc://$HOME/run/router.sock. */
function routerAddress(home) {
  let root = home || process.env.RELAY_HOME || "~/.dork/relay";
  if (root === "~" || root.startsWith("~/")) root = path.join(os.homedir(), root.slice(1));
  return `ipc://${path.resolve(root, "run", "router.sock")}`;
}

/**
 * Connect to a broker and say hello.
 *
 * @param {object} [options]
 * @param {string} [options.address] requests address (ipc:// or tcp://); default from `home`
 * @param {string} [options.home] data directory (default $RELAY_HOME or ~/.dork/relay)
 * @param {number} [options.timeout] deadline of each request, in ms (default 10 s)
 * @param {string} [options.name] a name for the broker's logs
 * @param {string} [options.from] default sender subject of publish()
 * @param {string} [options.keyFile] tcp:// only: this client's CURVE `.key_secret`
 *   certificate (default $RELAY_KEY_FILE); see docs/security.md
 * @param {string} [options.serverKey] tcp:// only: the broker's public key, as Z85 text
 *   or the path of its `server.key` (default $RELAY_SERVER_KEY)
 * @param {string} [options.actingFor] the user id (`key:<z85>`) of the identity every
 *   request of this client acts for (its `actingFor`): the router judges them by that
 *   identity's rights; this connection's identity needs the delegation right
 *   (docs/protocol.md, "Acting for an identity")
 * @returns {Promise<Client>} rejects with UnavailableError when no broker answers in time
 */
async function connect(options = {}) {
  const client = new Client(options.address || routerAddress(options.home), options);
  try {
    client.server = await client.sendRequest("hello", { client: client.name });
    client.session = client.server.session ?? null;
    client._pingEvery = pingInterval(client.server.sessionTimeoutMs);
  } catch (err) {
    await client.close({ bye: false });
    if (err instanceof TimeoutError) {
      throw new UnavailableError(
        `broker unavailable at ${client.address}: no answer within ${client.timeout / 1000} s ` +
          "(is `relay up` running for this home?)",
      );
    }
    throw err;
  }
  return client;
}

/** The Z85 keys in a ZeroMQ certificate file (`NAME.key` or `NAME.key_secret`). */
function readCertificate(file) {
  const text = fs.readFileSync(file, "utf8");
  const key = (name) => (text.match(new RegExp(`${name}\\s*=\\s*"([^"]{40})"`)) || [])[1];
  return { publicKey: key("public-key"), secretKey: key("secret-key") };
}

function curveOptions(address, keyFile, serverKey) {
  keyFile = keyFile || process.env.RELAY_KEY_FILE;
  serverKey = serverKey || process.env.RELAY_SERVER_KEY;
  if (!address.startsWith("tcp://") || !keyFile) return {}; // ipc:// checks the uid instead
  const own = readCertificate(keyFile);
  if (!own.secretKey) throw new InvalidMessageError(`${keyFile} holds no secret key (use the .key_secret file)`);
  if (!serverKey) throw new InvalidMessageError("a CURVE key file needs serverKey (the broker's public key)");
  const server = serverKey.length === 40 && !fs.existsSync(serverKey) ? serverKey : readCertificate(serverKey).publicKey;
  return { curveServerKey: server, curvePublicKey: own.publicKey, curveSecretKey: own.secretKey };
}

class Client {
  /** Use `connect()`, which also says hello. */
  constructor(address, { timeout = DEFAULT_TIMEOUT_MS, from, keyFile, serverKey, name, actingFor } = {}) {
    this.address = address;
    /** The user id every request acts for (`actingFor`), or null: this connection's own. */
    this.actingFor = actingFor || null;
    this._acting = this.actingFor ? { actingFor: this.actingFor } : {};
    /** This client's name in the broker's logs (hello's `client`). */
    this.name = name || `relay-node/${process.pid}`;
    /** CURVE socket options on tcp:// (both sockets), {} elsewhere. */
    this._curve = curveOptions(address, keyFile, serverKey);
    this.timeout = timeout;
    this.defaultFrom = from;
    /** The hello result: {session, server, version, signals, shards, limits}. */
    this.server = null;
    /**
     * This client's session token (docs/protocol.md, hello). A ping that shows another
     * token means the router forgot us: we say hello again with it and what we hold.
     */
    this.session = null;
    this._resuming = false;
    this.closed = false;
    this._rid = 0;
    /** rid -> {resolve, reject, timer, subscription?} */
    this._pending = new Map();
    /** subscription id -> Subscription */
    this._subs = new Map();
    /** "id endpoint" -> {id, endpoint, deliveries, ackWait, since}: handed to us, unsettled */
    this._held = new Map();
    /** sender -> Promise<ReplyInbox>: the reply inboxes of request() */
    this._inboxes = new Map();
    this._sendChain = Promise.resolve();
    this._heartbeat = null;
    this._pingEvery = HEARTBEAT_MS; // the hello's and pings' sessionTimeoutMs set it
    this._signals = null; // {socket, handlers: Map<key, {pattern, prefix, handler}>}
    this._signalKeys = 0;
    this._dealer = new zmq.Dealer({ linger: 0, ...this._curve });
    this._dealer.connect(address);
    this._receiving = this._receiveLoop();
  }

  // ---------------------------------------------------------------- plumbing

  _send(frames) {
    // zeromq allows one send in progress per socket: queue them, in order.
    const sent = this._sendChain.then(() => this._dealer.send(frames));
    this._sendChain = sent.catch(() => {});
    return sent;
  }

  async _receiveLoop() {
    while (!this.closed) {
      let frames;
      try {
        frames = await this._dealer.receive();
      } catch (err) {
        if (this.closed) return;
        this._failAll(new UnavailableError(`receive failed: ${err.message}`));
        return;
      }
      let incoming;
      try {
        incoming = wire.decodeIncoming(frames);
      } catch {
        continue; // undecodable frames from the broker: dropped
      }
      if (incoming.kind === "push") this._onPush(incoming);
      else this._onReply(incoming);
    }
  }

  _onReply(reply) {
    if (reply.rid === 0) {
      // The heartbeat's reply (rid 0) lists the subscriptions the router holds for us.
      if (reply.ok) this._checkSubscriptions(reply.result);
      return;
    }
    const waiting = this._pending.get(reply.rid);
    if (!waiting) return; // one whose caller gave up
    this._pending.delete(reply.rid);
    clearTimeout(waiting.timer);
    if (reply.ok && waiting.subscription) {
      // Bound here, before the pushes that follow the reply are read.
      const subscription = waiting.subscription;
      subscription.id = reply.result.sub;
      if (subscription._unsubscribing || subscription._ended) {
        // Renewed while it was being stopped: stop the new one too.
        this._send(wire.encodeRequest("unsubscribe", 0, { ...this._acting, sub: subscription.id })).catch(() => {});
      } else {
        this._subs.set(subscription.id, subscription);
        this._updateHeartbeat();
      }
    }
    if (reply.ok) waiting.resolve(reply.result);
    else waiting.reject(reply.error);
  }

  /**
   * One of ours missing from a ping's `subs` means the router restarted or ended our
   * session (silent for 5 s): subscribe again, under a new id. Replies come in order,
   * so a subscription bound before this reply was sent to the router is in the list.
   */
  _checkSubscriptions(pong) {
    const held = pong && Array.isArray(pong.subs) ? new Set(pong.subs) : null;
    if (!held) return;
    const every = pingInterval(pong.sessionTimeoutMs);
    if (every !== this._pingEvery) {
      this._pingEvery = every;
      this._updateHeartbeat(true);
    }
    if (pong.session && this.session && pong.session !== this.session) this._resume();
    for (const [id, subscription] of this._subs) {
      if (held.has(id) || subscription._unsubscribing) continue;
      this._subs.delete(id);
      subscription.id = null;
      subscription.renewals += 1;
      const { pattern, mode, credit, ackWait } = subscription;
      this.sendRequest("subscribe", { pattern, mode, credit, ackWait }, { subscription }).catch((err) => {
        subscription._end(false, err);
      });
    }
  }

  _onPush(push) {
    const subscription = this._subs.get(push.sub);
    if (!subscription) return; // its subscription ended; the message stays claimed
    const message = new Message(this, push, subscription);
    if (subscription.mode === "consume" && !this._hold(message, subscription.ackWait)) return;
    subscription._push(message);
  }

  /**
   * Say hello again to a router that forgot us (it restarted, or ended our session),
   * naming our session and the messages we hold, so that it hands them to nobody else.
   */
  async _resume() {
    if (this._resuming) return;
    this._resuming = true;
    try {
      const now = Date.now();
      const holding = [];
      for (const h of this._held.values()) {
        // Past its deadline the router may have taken it back: not ours to name.
        if (h.ackWait == null || now < h.since + h.ackWait) {
          holding.push([h.id, h.endpoint, h.deliveries, h.ackWait ?? null]);
        }
      }
      const hello = await this.sendRequest("hello", { client: this.name, session: this.session, holding });
      this.session = hello.session ?? this.session;
    } catch {
      // The next ping that still shows another token tries again.
    } finally {
      this._resuming = false;
    }
  }

  /** A message claimed for us: ours until answered. False when it is unreadable (nacked). */
  _hold(message, ackWait) {
    this._held.set(message._key, {
      id: message.id,
      endpoint: message.endpoint,
      deliveries: message.deliveries,
      ackWait,
      since: Date.now(),
    });
    this._updateHeartbeat();
    if (message.envelope !== null) return true;
    message.nack(`unreadable message: ${message.parseError}`).catch(() => {});
    return false;
  }

  _failAll(error) {
    for (const [rid, waiting] of this._pending) {
      clearTimeout(waiting.timer);
      waiting.reject(error);
      this._pending.delete(rid);
    }
  }

  /** Ping while needed, every `_pingEvery` ms; `restart`: the interval changed. */
  _updateHeartbeat(restart = false) {
    const needed = !this.closed && (this._subs.size > 0 || this._held.size > 0);
    if (restart && this._heartbeat) {
      clearInterval(this._heartbeat);
      this._heartbeat = null;
    }
    if (needed && !this._heartbeat) {
      this._heartbeat = setInterval(() => {
        this._send(wire.encodeRequest("ping", 0)).catch(() => {});
      }, this._pingEvery);
    } else if (!needed && this._heartbeat) {
      clearInterval(this._heartbeat);
      this._heartbeat = null;
    }
  }

  /**
   * Send one protocol request (any operation of docs/protocol.md); resolves with its
   * `result`, rejects with the typed error. It carries the client's `actingFor`, unless
   * `fields` names another.
   * @param {string} op @param {Record<string, unknown>} [fields]
   * @param {{timeout?: number}} [options]
   */
  sendRequest(op, fields = {}, { timeout, subscription } = {}) {
    if (this.closed) return Promise.reject(new UnavailableError("client is closed"));
    this._rid = this._rid >= 2 ** 31 ? 1 : this._rid + 1;
    const rid = this._rid;
    const limit = timeout ?? this.timeout;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this._pending.delete(rid);
        reject(
          new TimeoutError(`no reply to '${op}' from the broker at ${this.address} within ${limit / 1000} s`),
        );
      }, limit);
      this._pending.set(rid, { resolve, reject, timer, subscription });
      this._send(wire.encodeRequest(op, rid, { ...this._acting, ...fields })).catch((err) => {
        if (this._pending.delete(rid)) {
          clearTimeout(timer);
          reject(new UnavailableError(`could not send '${op}': ${err.message}`));
        }
      });
    });
  }

  // ---------------------------------------------------------------- endpoints

  async ping() {
    return this.sendRequest("ping");
  }

  /** Create the endpoint's mailbox (idempotent): {subject, hash, maildirPath, registeredAt}. */
  async register(subject) {
    return this.sendRequest("register", { subject: subjects.validate(subject) });
  }

  /** Remove the registration; its mailbox stays on disk. Resolves to whether it existed. */
  async unregister(subject) {
    return (await this.sendRequest("unregister", { subject: subjects.validate(subject) })).removed;
  }

  /** Registered endpoints, each with `depth` (messages waiting in new/). */
  async endpoints() {
    return (await this.sendRequest("endpoints")).endpoints;
  }

  // ---------------------------------------------------------------- publishing

  /**
   * Publish `payload` (anything JSON can hold) to a subject, or to every endpoint a
   * pattern matches. Resolves when every copy is durable:
   * {messageId, deliveredTo, rejected: [[hash, reason]], mailboxPressure, details}.
   *
   * @param {string} subject
   * @param {unknown} payload
   * @param {{from?: string, replyTo?: string, budget?: object, parentId?: string, timeout?: number}} [options]
   */
  async publish(subject, payload, { from, replyTo, budget, parentId, timeout } = {}) {
    const sender = from ?? this.defaultFrom;
    if (sender === undefined) throw new InvalidMessageError("publish needs a sender: options.from");
    if (payload === undefined) throw new InvalidMessageError("publish needs a payload");
    subjects.validate(subject, { wildcards: true });
    subjects.validate(sender);
    if (replyTo != null) subjects.validate(replyTo);
    return this.sendRequest(
      "publish",
      { subject, from: sender, payload, replyTo: replyTo ?? undefined, budget, parentId },
      { timeout },
    );
  }

  /**
   * Answer a message on its replyTo, carrying its budget forward (loops get caught).
   * @param {Message} message @param {unknown} payload @param {{from?: string, replyTo?: string}} [options]
   */
  async reply(message, payload, { from, replyTo } = {}) {
    const envelope = message.envelope || {};
    if (!envelope.replyTo) throw new InvalidMessageError(`message ${message.id} has no replyTo to answer`);
    const sender = from ?? this.defaultFrom;
    return this.publish(envelope.replyTo, payload, {
      from: sender,
      replyTo: replyTo ?? sender,
      budget: envelope.budget,
      parentId: envelope.id,
    });
  }

  /**
   * Publish a request and resolve with its reply's envelope: the message whose
   * `parentId` is the request's id (the replier calls `reply`). Replies come to this
   * client's reply inbox for the sender, `_INBOX.<sender>.<nonce>`, registered and
   * consumed on first use. A request that reaches no endpoint rejects at once with its
   * rejection's code (`no_match`, `access_denied`, ...); no reply within `timeout` ms
   * (default 30 s): TimeoutError, and a reply that comes later is nacked with code
   * `late_reply` (a dead letter).
   *
   * @param {string} subject @param {unknown} payload
   * @param {{from?: string, timeout?: number, budget?: object}} [options]
   * @returns {Promise<object>} the reply's envelope
   */
  async request(subject, payload, { from, timeout = DEFAULT_REQUEST_TIMEOUT_MS, budget } = {}) {
    const sender = from ?? this.defaultFrom;
    if (sender === undefined) throw new InvalidMessageError("request needs a sender: options.from");
    const deadline = Date.now() + timeout;
    const inbox = await this._replyInbox(subjects.validate(sender));
    inbox.publishing();
    let result;
    try {
      result = await this.publish(subject, payload, { from: sender, replyTo: inbox.subject, budget, timeout });
    } catch (err) {
      inbox.published(null);
      throw err;
    }
    const reply = inbox.published(result.deliveredTo ? result.messageId : null);
    if (!result.deliveredTo) throw refusal(subject, result);
    let timer;
    const expired = new Promise((resolve, reject) => {
      timer = setTimeout(() => {
        inbox.giveUp(result.messageId);
        reject(new TimeoutError(`no reply to request ${result.messageId} on ${subject} within ${timeout / 1000} s`));
      }, Math.max(0, deadline - Date.now()));
    });
    try {
      return await Promise.race([reply, expired]);
    } finally {
      clearTimeout(timer);
    }
  }

  /** This client's reply inbox for `sender`: registered and consumed on first use. */
  _replyInbox(sender) {
    let made = this._inboxes.get(sender);
    if (!made) {
      made = (async () => {
        const inbox = new ReplyInbox(subjects.replyInbox(sender, crypto.randomBytes(6).toString("hex")));
        await this.register(inbox.subject);
        await this.consume(inbox.subject, async (message) => {
          if (inbox.arrived(message.envelope)) return; // acked by consume
          const reason = `no request waits for a reply to ${message.parentId}: it gave up, or never asked`;
          await message.nack(reason, { code: LATE_REPLY });
        });
        return inbox;
      })();
      made.catch(() => this._inboxes.delete(sender));
      this._inboxes.set(sender, made);
    }
    return made;
  }

  // ---------------------------------------------------------------- consuming

  /**
   * Consume the messages of every endpoint matching `pattern`. Iterate the result with
   * `for await`; each message must be answered with `ack()` or `nack(reason)`.
   * Leaving the loop (break, return, throw) ends the subscription; messages it had
   * received and not yet yielded stay claimed (see `pending`), at most `credit` of them.
   *
   * `ackWait` (ms): a message not answered (nor `inProgress()`) by then is taken back
   * and handed out again; default: never, while this client lives.
   *
   * @param {string} pattern @param {{credit?: number, ackWait?: number}} [options]
   * @returns {Promise<Subscription>}
   */
  async subscribe(pattern, { credit, ackWait } = {}) {
    return this._subscribe(pattern, "consume", credit, ackWait);
  }

  /** Watch every message stored from now on whose endpoint matches: no claim, no ack. */
  async observe(pattern) {
    return this._subscribe(pattern, "observe", undefined, undefined);
  }

  /**
   * Consume with a handler: a handler that returns (or resolves) acks the message,
   * one that throws nacks it with the error as the reason, unless it settled the
   * message itself. Messages are handled one at a time, in order.
   *
   * @param {string} pattern
   * @param {(message: Message) => unknown} handler
   * @param {{credit?: number, ackWait?: number, onError?: (err: Error) => void}} [options]
   * @returns {Promise<Subscription>}
   */
  async consume(pattern, handler, { credit, ackWait, onError } = {}) {
    const subscription = await this.subscribe(pattern, { credit, ackWait });
    (async () => {
      for await (const message of subscription) {
        try {
          await handler(message);
          if (!message.settled) await message.ack();
        } catch (err) {
          if (!message.settled) {
            const reason = `handler error: ${err && err.message ? err.message : err}`.slice(0, 1000);
            await message.nack(reason).catch((e) => onError && onError(e));
          } else if (onError) {
            onError(err);
          }
        }
      }
    })().catch((err) => onError && onError(err));
    return subscription;
  }

  async _subscribe(pattern, mode, credit, ackWait) {
    subjects.validate(pattern, { wildcards: true });
    const subscription = new Subscription(this, pattern, mode, credit, ackWait);
    await this.sendRequest("subscribe", { pattern, mode, credit, ackWait }, { subscription });
    return subscription;
  }

  /**
   * Pull: claim up to `batch` messages waiting for the endpoints `pattern` matches,
   * oldest first per endpoint, endpoints taking turns. Resolves as soon as one is
   * claimed, or with [] after `wait` ms. Each message is held by this client until it
   * calls `ack()` or `nack(reason)` (both confirmed by the router), or `ackWait` ms
   * pass without an answer or `inProgress()`; if the client dies first, it is handed
   * out again.
   *
   * @param {string} pattern
   * @param {{batch?: number, wait?: number, ackWait?: number}} [options]
   * @returns {Promise<Message[]>}
   */
  async fetch(pattern, { batch = 10, wait = 0, ackWait } = {}) {
    subjects.validate(pattern, { wildcards: true });
    const result = await this.sendRequest(
      "fetch",
      { pattern, batch, wait, ackWait },
      { timeout: this.timeout + wait },
    );
    const messages = result.messages.map((item) => {
      const data = typeof item.data === "string" ? Buffer.from(item.data, "utf8") : Buffer.from(item.data);
      return new Message(this, { ...item, data }, null);
    });
    return messages.filter((message) => this._hold(message, ackWait));
  }

  /** Claimed, never acknowledged messages of an endpoint (their consumer went away). */
  async pending(subject, { limit } = {}) {
    return (await this.sendRequest("pending", { subject: subjects.validate(subject), limit })).items;
  }

  /** An operator finishes a pending message as done. */
  async complete(id, endpoint) {
    return this.sendRequest("complete", { id, endpoint });
  }

  /** An operator finishes a pending message as failed (a dead letter). */
  async fail(id, endpoint, reason = "failed by operator") {
    return this.sendRequest("fail", { id, endpoint, reason });
  }

  // ---------------------------------------------------------------- signals

  /**
   * Send an ephemeral signal on a concrete subject (nothing is stored).
   * `signal` is {type, state, endpointSubject?, timestamp?, data?}; endpointSubject
   * defaults to `subject` and timestamp to now. With `wait: false` it is fire and
   * forget: no reply comes, so a refusal (access rule, sender not allowed) is not
   * reported (docs/protocol.md, "signal").
   * @param {string} subject @param {object} signal
   * @param {{from?: string, wait?: boolean}} [options]
   */
  async signal(subject, signal, { from, wait = true } = {}) {
    subjects.validate(subject);
    const body = {
      type: signal.type,
      state: signal.state,
      endpointSubject: signal.endpointSubject ?? subject,
      timestamp: signal.timestamp ?? Date.now(),
      data: signal.data,
    };
    if (wait) {
      await this.sendRequest("signal", { subject, signal: body, from });
      return;
    }
    if (this.closed) throw new UnavailableError("client is closed");
    const request = wire.encodeRequest("signal", 0, { ...this._acting, subject, signal: body, from, reply: false });
    try {
      await this._send(request);
    } catch (err) {
      throw new UnavailableError(`could not send 'signal': ${err.message}`);
    }
  }

  /**
   * Call `handler(subject, signal)` for each signal whose subject matches `pattern`.
   * Resolves to a function that stops it. Like any ZeroMQ subscription it takes effect
   * a moment later: signals sent before that are not seen.
   *
   * @param {string} pattern
   * @param {(subject: string, signal: object) => void} handler
   * @returns {Promise<() => void>}
   */
  async onSignal(pattern, handler) {
    subjects.validate(pattern, { wildcards: true });
    if (this.closed) throw new UnavailableError("client is closed");
    if (!this._signals) {
      const socket = new zmq.Subscriber({ linger: 0, ...this._curve });
      socket.connect(this.server.signals);
      this._signals = { socket, handlers: new Map() };
      this._signalLoop(this._signals);
    }
    const key = ++this._signalKeys;
    // Runs of signals (one message for many) from a broker that offers them.
    const runs = this.server.signalRuns === true ? wire.SIGNAL_RUN : "";
    const prefix = runs + subjects.literalPrefix(pattern);
    this._signals.handlers.set(key, { pattern, prefix, handler });
    this._signals.socket.subscribe(prefix);
    return () => {
      const signals = this._signals;
      if (signals && signals.handlers.delete(key) && !this.closed) signals.socket.unsubscribe(prefix);
    };
  }

  async _signalLoop(signals) {
    while (!this.closed) {
      let frames;
      try {
        frames = await signals.socket.receive();
      } catch {
        return; // closed
      }
      let subject, received;
      try {
        [subject, received] = wire.decodeSignals(frames);
      } catch {
        continue;
      }
      if (!subjects.isValid(subject)) continue;
      const matched = [...signals.handlers].filter(([, { pattern }]) => subjects.matches(subject, pattern));
      for (const signal of received) {
        for (const [key, { handler }] of matched) {
          if (!signals.handlers.has(key)) continue; // unsubscribed during this run
          try {
            handler(subject, signal);
          } catch (err) {
            process.emitWarning(`relay signal handler failed: ${err && err.stack ? err.stack : err}`);
          }
        }
      }
    }
  }

  // ---------------------------------------------------------------- administration

  /** Dead letters, optionally of one endpoint (hash, subject or "_unroutable"). */
  async deadLetters({ endpoint, limit } = {}) {
    return (await this.sendRequest("dead_letters", { endpoint, limit })).items;
  }

  /**
   * Operators: put dead letters back in their endpoints' new/ under their own ids, to be
   * handed out again (deliveries counted afresh). With `id`: that message's (in
   * `endpoint` if given); when its one dead letter may not be requeued, rejects with the
   * refusal (`TtlExpiredError` past its TTL, `InvalidStateError`, ...). Else up to
   * `limit` (1-200, default 100) of one endpoint's (hash or subject), oldest first, after
   * the id `after`. Resolves to `{requeued: [{id, endpoint}], refused: [{id, endpoint,
   * code, message}], more, after}`: with `more`, pass `after` to go on
   * (docs/protocol.md, "requeue_dead_letters").
   * @param {{id?: string, endpoint?: string, limit?: number, after?: string}} [options]
   */
  async requeueDeadLetters({ id, endpoint, limit, after } = {}) {
    return this.sendRequest("requeue_dead_letters", { id, endpoint, limit, after });
  }

  /** Delete dead letters (of one endpoint, or all); resolves to how many. */
  async purgeDeadLetters({ endpoint } = {}) {
    return (await this.sendRequest("purge_dead_letters", { endpoint })).purged;
  }

  async addRule(rule) {
    return this.sendRequest("add_rule", { rule });
  }

  async removeRule(from, to) {
    return (await this.sendRequest("remove_rule", { from, to })).removed;
  }

  async listRules() {
    return (await this.sendRequest("list_rules")).rules;
  }

  async getConfig() {
    return this.sendRequest("get_config");
  }

  async setConfig(partial) {
    return this.sendRequest("set_config", { config: partial });
  }

  async status() {
    return this.sendRequest("status");
  }

  async trace(id) {
    return this.sendRequest("trace", { id });
  }

  async rebuildIndex() {
    return (await this.sendRequest("rebuild_index", {}, { timeout: Math.max(this.timeout, 120_000) })).messages;
  }

  // ---------------------------------------------------------------- lifecycle

  /**
   * Say bye and close the sockets. Messages received and not acknowledged stay claimed
   * (listed by `pending`).
   */
  async close({ bye = true } = {}) {
    if (this.closed) return;
    for (const made of bye && this.server ? this._inboxes.values() : []) {
      // Its endpoint goes (its mailbox stays on disk), so that the inboxes of clients
      // long gone do not pile up in the endpoint list.
      const inbox = await made.catch(() => null);
      if (inbox) await this.sendRequest("unregister", { subject: inbox.subject }, { timeout: 1000 }).catch(() => {});
    }
    if (bye && this.server) {
      await this.sendRequest("bye", {}, { timeout: 1000 }).catch(() => {});
    }
    this.closed = true;
    this._updateHeartbeat();
    for (const subscription of this._subs.values()) subscription._end(true);
    this._subs.clear();
    this._failAll(new UnavailableError("client closed"));
    this._dealer.close();
    if (this._signals) this._signals.socket.close();
    await this._receiving;
  }
}

/** A subscription: an async iterable of Messages. */
class Subscription {
  constructor(client, pattern, mode, credit, ackWait) {
    this.client = client;
    this.pattern = pattern;
    this.mode = mode;
    this.credit = credit;
    this.ackWait = ackWait;
    /** The router's subscription id: set when subscribe is answered, new when renewed. */
    this.id = null;
    /** How often the router lost it (restart, session timeout) and it was renewed. */
    this.renewals = 0;
    /** Why it ended, when it ended on an error (a renewal that failed). */
    this.error = null;
    this._queue = [];
    this._waiters = [];
    this._ended = false;
    this._unsubscribing = null;
  }

  _push(message) {
    const waiter = this._waiters.shift();
    if (waiter) waiter.resolve({ value: message, done: false });
    else this._queue.push(message);
  }

  _end(discard = false, error = null) {
    this._ended = true;
    if (error) this.error = error;
    if (this.id !== null) this.client._subs.delete(this.id);
    if (discard) this._queue.length = 0;
    for (const waiter of this._waiters.splice(0)) {
      if (this.error) waiter.reject(this.error);
      else waiter.resolve({ value: undefined, done: true });
    }
  }

  /**
   * The next message; `{done: true}` once the subscription has ended; rejects when it
   * ended on an error (the router lost it and subscribing again failed).
   */
  next() {
    if (this._queue.length) return Promise.resolve({ value: this._queue.shift(), done: false });
    if (this._ended && this.error) return Promise.reject(this.error);
    if (this._ended) return Promise.resolve({ value: undefined, done: true });
    return new Promise((resolve, reject) => this._waiters.push({ resolve, reject }));
  }

  /** Called when a `for await` loop is left early: ends the subscription. */
  async return() {
    await this.unsubscribe({ discard: true });
    return { value: undefined, done: true };
  }

  [Symbol.asyncIterator]() {
    return this;
  }

  /**
   * Stop: the router pushes no more. Messages already received are still yielded
   * (unless `discard`), then iteration ends.
   */
  unsubscribe({ discard = false } = {}) {
    if (!this._unsubscribing) {
      this._unsubscribing = (async () => {
        if (!this.client.closed && this.id !== null) {
          await this.client.sendRequest("unsubscribe", { sub: this.id }).catch(() => {});
        }
        this._end(discard);
        this.client._updateHeartbeat();
      })();
    } else if (discard) {
      this._queue.length = 0;
    }
    return this._unsubscribing;
  }
}

/** A message handed to this client: pushed to a subscription, or fetched. */
class Message {
  /**
   * @param {Client} client
   * @param {{sub?: number, id: string, endpoint: string, deliveries?: number | null, data: Buffer}} handed
   * @param {Subscription | null} subscription null for a fetched message
   */
  constructor(client, handed, subscription) {
    this._client = client;
    this.subscription = subscription;
    /** subscription id (none when fetched), message id, endpoint hash: what answers name */
    this.sub = handed.sub;
    this.id = handed.id;
    this.endpoint = handed.endpoint;
    /** how many times it has been handed out, this time included (1 the first) */
    this.deliveries = Number.isInteger(handed.deliveries) ? handed.deliveries : null;
    /** the message file's bytes (UTF-8 JSON) */
    this.data = handed.data;
    /** claimed for this client (consumed or fetched), so it must be answered */
    this.claimed = subscription === null || subscription.mode === "consume";
    this.settled = !this.claimed;
    this.parseError = null;
    try {
      const envelope = JSON.parse(handed.data.toString("utf8"));
      this.envelope = envelope && typeof envelope === "object" && !Array.isArray(envelope) ? envelope : null;
      if (this.envelope === null) this.parseError = "the envelope is not a JSON object";
    } catch (err) {
      this.envelope = null;
      this.parseError = err.message;
    }
  }

  get _key() {
    return `${this.id} ${this.endpoint}`;
  }

  /** The endpoint subject this copy was delivered to. */
  get subject() {
    return this.envelope && this.envelope.subject;
  }

  get from() {
    return this.envelope && this.envelope.from;
  }

  get replyTo() {
    return this.envelope ? this.envelope.replyTo ?? null : null;
  }

  get payload() {
    return this.envelope ? this.envelope.payload : undefined;
  }

  get budget() {
    return this.envelope && this.envelope.budget;
  }

  get createdAt() {
    return this.envelope && this.envelope.createdAt;
  }

  /** A reply's parentId: the id of the message it answers; null on any other message. */
  get parentId() {
    return this.envelope ? this.envelope.parentId ?? null : null;
  }

  /**
   * Mark the message done (sends a delivery_receipt signal to its sender). Resolves
   * with `{state: "done"}` once the router has applied it, durably; rejects with
   * InvalidStateError when this hand-out is no longer this client's.
   */
  ack() {
    return this._settle("ack", {});
  }

  /**
   * Move the message to failed/: a dead letter with `reason` and code `nack` (or
   * `options.code`). Resolves with `{state: "failed"}` once it is.
   * @param {string} reason @param {{code?: string}} [options]
   */
  nack(reason, { code } = {}) {
    return this._settle("nack", { reason, code });
  }

  /** Still working on it: its ack deadline starts again. Resolves with `{deliveries}`. */
  async inProgress() {
    this._answerable("in_progress");
    const result = await this._client.sendRequest("in_progress", this._handOut());
    const held = this._heldHere();
    if (held) held.since = Date.now(); // its deadline starts again here too
    return result;
  }

  /** What the client records of this hand-out, if it still holds this one. */
  _heldHere() {
    const held = this._client._held.get(this._key);
    return held && held.deliveries === this.deliveries ? held : null;
  }

  _answerable(op) {
    if (!this.claimed) throw new InvalidStateError(`an observed message is not claimed: nothing to ${op}`);
    if (this.settled) throw new InvalidStateError(`message ${this.id} was already settled`);
  }

  /** What every answer names: the message, its endpoint, and which hand-out it is. */
  _handOut() {
    return { sub: this.sub, id: this.id, endpoint: this.endpoint, deliveries: this.deliveries ?? undefined };
  }

  async _settle(op, fields) {
    this._answerable(op);
    this.settled = true;
    try {
      return await this._client.sendRequest(op, { ...this._handOut(), ...fields });
    } catch (err) {
      if (!(err instanceof RelayError) || err instanceof TimeoutError) this.settled = false;
      throw err;
    } finally {
      // An answer to an earlier hand-out keeps a later one held.
      if (this.settled && this._heldHere()) {
        this._client._held.delete(this._key);
        this._client._updateHeartbeat();
      }
    }
  }
}

/** The typed error of a request that reached no endpoint. */
function refusal(subject, result) {
  if (!result.rejected || !result.rejected.length) {
    return errorFromWire({ code: "no_match", message: `no endpoint for ${subject}` });
  }
  const [key, reason] = result.rejected[0];
  const detail = (result.details && result.details[key]) || `${reason} for ${subject}`;
  return errorFromWire({ code: reason, message: `request to ${subject} refused: ${detail}` });
}

module.exports = { connect, routerAddress, Client, Subscription, Message, DEFAULT_TIMEOUT_MS };
