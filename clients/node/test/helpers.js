"use strict";
/** Test helpers: the broker under test, the shared vectors, and shape matching. */
const fs = require("node:fs");
const path = require("node:path");
const { pack } = require("../lib/wire");

const VECTORS_FILE = path.resolve(__dirname, "..", "..", "vectors.json");

/**
 * The data directory of the broker under test. tests/test_clients_node.py starts a
 * broker and sets RELAY_HOME; run by hand, start one (`relay up`) and set it.
 */
function brokerHome() {
  const home = process.env.RELAY_TEST_HOME || process.env.RELAY_HOME;
  if (!home) {
    throw new Error(
      "these tests need a running broker: set RELAY_TEST_HOME (or RELAY_HOME) to its data " +
        "directory; `pytest tests/test_clients_node.py` starts one and does this",
    );
  }
  return home;
}

function loadVectors() {
  return JSON.parse(fs.readFileSync(VECTORS_FILE, "utf8"));
}

/** The frames a vector sends (see the `format` key of vectors.json). */
function framesOf(vector) {
  if (vector.request) return [Buffer.from("RLY1"), pack(vector.request)];
  return vector.frames.map((frame) => {
    const [[kind, value]] = Object.entries(frame);
    if (kind === "text") return Buffer.from(value, "utf8");
    if (kind === "hex") return Buffer.from(value, "hex");
    if (kind === "msgpack") return pack(value);
    throw new Error(`unknown frame kind ${kind}`);
  });
}

const TYPES = {
  // msgpack ints and floats both decode to JS numbers: $int means an integral number here.
  $str: (v) => typeof v === "string",
  $int: (v) => Number.isInteger(v) || typeof v === "bigint",
  $num: (v) => typeof v === "number" || typeof v === "bigint",
  $bool: (v) => typeof v === "boolean",
  $map: (v) => v !== null && typeof v === "object" && !Array.isArray(v) && !(v instanceof Uint8Array),
  $list: (v) => Array.isArray(v),
  $nil: (v) => v === null,
  $any: () => true,
};

const show = (v) => {
  const text = JSON.stringify(v);
  return text === undefined ? String(v) : text.slice(0, 200);
};

/** null when `actual` has the shape `expected` describes, else where it differs. */
function mismatch(expected, actual, where = "reply") {
  if (typeof expected === "string" && expected.startsWith("$")) {
    const check = TYPES[expected];
    if (!check) throw new Error(`unknown type ${expected} at ${where}`);
    return check(actual) ? null : `${where}: expected ${expected}, got ${show(actual)}`;
  }
  if (Array.isArray(expected)) {
    if (!Array.isArray(actual) || actual.length !== expected.length) {
      return `${where}: expected a list of ${expected.length}, got ${show(actual)}`;
    }
    for (let i = 0; i < expected.length; i++) {
      const problem = mismatch(expected[i], actual[i], `${where}[${i}]`);
      if (problem) return problem;
    }
    return null;
  }
  if (expected !== null && typeof expected === "object") {
    if (!TYPES.$map(actual)) return `${where}: expected a map, got ${show(actual)}`;
    for (const [key, value] of Object.entries(expected)) {
      if (!(key in actual)) return `${where}: key ${key} missing from ${show(actual)}`;
      const problem = mismatch(value, actual[key], `${where}.${key}`);
      if (problem) return problem;
    }
    return null;
  }
  return expected === actual ? null : `${where}: expected ${show(expected)}, got ${show(actual)}`;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Poll `predicate` until truthy; throw after `timeout` ms. */
async function waitFor(predicate, { timeout = 10_000, interval = 20, what = "condition" } = {}) {
  const deadline = Date.now() + timeout;
  for (;;) {
    const value = await predicate();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeout} ms waiting for ${what}`);
    await sleep(interval);
  }
}

/**
 * Resolve once signals on `subject` reach this client: a ZeroMQ subscription takes
 * effect a moment after onSignal, so send probe signals until one comes back. Call it
 * after installing the handlers that must not miss anything (they match `subject` too:
 * ignore `presence`/`probe` signals there).
 */
async function signalsFlowing(client, subject, { timeout = 10_000 } = {}) {
  let seen = false;
  const off = await client.onSignal(subject, (s, signal) => {
    if (signal.state === "probe") seen = true;
  });
  try {
    await waitFor(
      async () => {
        if (!seen) await client.signal(subject, { type: "presence", state: "probe" });
        return seen;
      },
      { timeout, interval: 50, what: `signals on ${subject}` },
    );
  } finally {
    off();
  }
}

module.exports = { brokerHome, loadVectors, framesOf, mismatch, sleep, waitFor, signalsFlowing };
