"use strict";
/**
 * Protocol frames (docs/protocol.md, "Frames"): encode and decode only, no I/O.
 *
 * request: [RLY1, msgpack {op, rid, ...fields}]
 * reply:   [RLY1, msgpack {rid, ok, result | error}]
 * push:    [RLY1, msgpack {push: "message", sub, id, endpoint, deliveries}, envelope JSON bytes]
 * signal (SUB socket): [subject, msgpack signal map]
 */
const msgpack = require("@msgpack/msgpack");
const { MalformedFrameError, UnsupportedVersionError, errorFromWire } = require("./errors");

const PROTOCOL_VERSION = 1;
const MAGIC = Buffer.from("RLY1");
const MAGIC_PREFIX = Buffer.from("RLY");

// `undefined` fields are left out, so optional arguments can be passed through as is.
const ENCODE_OPTIONS = { ignoreUndefined: true };

/** @param {unknown} value @returns {Buffer} */
function pack(value) {
  const bytes = msgpack.encode(value, ENCODE_OPTIONS);
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
}

/** @param {Uint8Array} bytes */
function unpack(bytes) {
  return msgpack.decode(bytes);
}

/**
 * The two frames of a request.
 * @param {string} op @param {number} rid @param {Record<string, unknown>} [fields]
 */
function encodeRequest(op, rid, fields = {}) {
  return [MAGIC, pack({ op, rid, ...fields })];
}

function checkMagic(frame) {
  const bytes = Buffer.from(frame);
  if (bytes.equals(MAGIC)) return;
  if (bytes.subarray(0, 3).equals(MAGIC_PREFIX)) {
    throw new UnsupportedVersionError(`protocol ${bytes.toString("latin1")} is not supported`);
  }
  throw new MalformedFrameError("first frame must be RLY1");
}

/**
 * What the router sent on the DEALER socket:
 *   {kind: "reply", rid, ok, result, error: RelayError | null}
 *   {kind: "push", sub, id, endpoint, deliveries, data: Buffer}  (deliveries: the hand-out,
 *     1 the first time; null from a router that does not say)
 * Throws MalformedFrameError for frames that are neither.
 * @param {Uint8Array[]} frames
 */
function decodeIncoming(frames) {
  if (frames.length !== 2 && frames.length !== 3) {
    throw new MalformedFrameError(`expected 2 or 3 frames from the broker, got ${frames.length}`);
  }
  checkMagic(frames[0]);
  let header;
  try {
    header = unpack(frames[1]);
  } catch (err) {
    throw new MalformedFrameError(`broker frame is not valid msgpack: ${err.message}`);
  }
  if (header === null || typeof header !== "object" || Array.isArray(header)) {
    throw new MalformedFrameError("broker frame must be a map");
  }
  if ("push" in header) {
    if (header.push !== "message" || frames.length !== 3) {
      throw new MalformedFrameError(`unknown push ${JSON.stringify(header.push)}`);
    }
    return {
      kind: "push",
      sub: header.sub,
      id: header.id,
      endpoint: header.endpoint,
      deliveries: Number.isInteger(header.deliveries) ? header.deliveries : null,
      data: Buffer.from(frames[2]),
    };
  }
  const rid = typeof header.rid === "number" ? header.rid : 0;
  if (header.ok === true) {
    return { kind: "reply", rid, ok: true, result: header.result, error: null, raw: header };
  }
  return { kind: "reply", rid, ok: false, result: undefined, error: errorFromWire(header.error), raw: header };
}

/** Topic prefix of a run of signals (docs/protocol.md, "signal"); no subject starts with it. */
const SIGNAL_RUN = "+";

/**
 * A run of signals on one subject: `+` and the subject, then an array of signal maps.
 * @param {string} subject @param {Record<string, unknown>[]} signals
 */
function encodeSignalRun(subject, signals) {
  return [Buffer.from(SIGNAL_RUN + subject, "utf8"), pack(signals)];
}

/**
 * The subject and the signal maps of a signal message in either form (one signal, or
 * a run), oldest first; an item that is not a map is left out (it costs only itself).
 * @param {Uint8Array[]} frames @returns {[string, Record<string, unknown>[]]}
 */
function decodeSignals(frames) {
  if (frames.length !== 2) throw new MalformedFrameError(`a signal message has 2 frames, got ${frames.length}`);
  const topic = Buffer.from(frames[0]).toString("utf8");
  const body = unpack(frames[1]);
  const isMap = (x) => x !== null && typeof x === "object" && !Array.isArray(x);
  if (!topic.startsWith(SIGNAL_RUN)) {
    if (!isMap(body)) throw new MalformedFrameError("a signal body must be a map");
    return [topic, [body]];
  }
  if (!Array.isArray(body)) throw new MalformedFrameError("a run of signals must be an array");
  return [topic.slice(SIGNAL_RUN.length), body.filter(isMap)];
}

module.exports = {
  PROTOCOL_VERSION, MAGIC, pack, unpack, encodeRequest, decodeIncoming, SIGNAL_RUN, encodeSignalRun, decodeSignals,
};
