"use strict";
/** Tests that need no broker: subjects, errors, frames. */
const test = require("node:test");
const assert = require("node:assert/strict");

const relay = require("..");
const { subjects, wire } = relay;
const { loadVectors, framesOf, mismatch } = require("./helpers");

test("subjects: validation follows the grammar", () => {
  for (const ok of ["a", "relay.agent.demo.backend", "a-b_c.D9", "x.".repeat(15) + "y"]) {
    assert.equal(subjects.validate(ok), ok);
  }
  for (const bad of ["", ".a", "a.", "a..b", "a b", "a.*", "a.>", "a*b", "é", "x.".repeat(16) + "y",
    "a".repeat(257), 5]) {
    assert.throws(() => subjects.validate(bad), relay.InvalidSubjectError, String(bad));
  }
  assert.equal(subjects.validate("a.*.>", { wildcards: true }), "a.*.>");
  for (const bad of ["a.>.b", "a.b*", ">a"]) {
    assert.throws(() => subjects.validate(bad, { wildcards: true }), { code: "invalid_subject" });
  }
});

test("subjects: NATS matching and literal prefixes", () => {
  assert.ok(subjects.matches("a.b.c", "a.*.c"));
  assert.ok(subjects.matches("a.b.c", "a.>"));
  assert.ok(!subjects.matches("a", "a.>"));
  assert.ok(!subjects.matches("a.b", "a.*.c"));
  assert.ok(subjects.matches("a.b", "a.b"));
  assert.ok(!subjects.matches("a.bc", "a.b"));
  assert.equal(subjects.literalPrefix("relay.agent.*.x"), "relay.agent.");
  assert.equal(subjects.literalPrefix("foo.>"), "foo.");
  assert.equal(subjects.literalPrefix("*"), "");
  assert.equal(subjects.literalPrefix("foo.bar"), "foo.bar");
});

test("subjects: the endpoint hash is the one the broker uses", () => {
  assert.equal(subjects.endpointHash("relay.vectors.backend"), "dc1101848775");
});

test("errors: every code of the vectors has its own class", () => {
  const codes = new Set(
    loadVectors().vectors.filter((v) => !v.reply.ok).map((v) => v.reply.error.code),
  );
  for (const code of [...codes, ...Object.keys(loadVectors().not_covered)]) {
    const err = relay.errorFromWire({ code, message: `a ${code}` });
    assert.ok(err instanceof relay.RelayError);
    assert.notEqual(err.constructor, relay.RelayError, `no class for ${code}`);
    assert.equal(err.code, code);
    assert.equal(err.message, `a ${code}`);
  }
  const unknown = relay.errorFromWire({ code: "brand_new", message: "m" });
  assert.equal(unknown.constructor, relay.RelayError);
  assert.equal(unknown.code, "brand_new");
  assert.ok(relay.errorFromWire({ code: "endpoint_not_found" }) instanceof relay.NotFoundError);
  assert.ok(new relay.TimeoutError("t") instanceof relay.UnavailableError);
  assert.equal(new relay.TimeoutError("t").code, "timeout");
});

test("wire: requests, replies and pushes", () => {
  const [magic, body] = wire.encodeRequest("publish", 7, { subject: "a.b", replyTo: undefined });
  assert.equal(magic.toString(), "RLY1");
  assert.deepEqual(wire.unpack(body), { op: "publish", rid: 7, subject: "a.b" });

  const reply = wire.decodeIncoming([Buffer.from("RLY1"), wire.pack({ rid: 3, ok: true, result: { x: 1 } })]);
  assert.deepEqual([reply.kind, reply.rid, reply.ok, reply.result], ["reply", 3, true, { x: 1 }]);

  const error = wire.decodeIncoming([
    Buffer.from("RLY1"),
    wire.pack({ rid: 4, ok: false, error: { code: "invalid_subject", message: "no" } }),
  ]);
  assert.ok(error.error instanceof relay.InvalidSubjectError);

  const push = wire.decodeIncoming([
    Buffer.from("RLY1"),
    wire.pack({ push: "message", sub: 1, id: "01JDQ3ZV9R6Q4W1T3M5N7P8K2A", endpoint: "3f0c5bd2a1e4" }),
    Buffer.from("{}"),
  ]);
  assert.deepEqual([push.kind, push.sub, push.deliveries, push.data.toString()], ["push", 1, null, "{}"]);
  const again = wire.decodeIncoming([
    Buffer.from("RLY1"),
    wire.pack({ push: "message", sub: 1, id: "01JDQ3ZV9R6Q4W1T3M5N7P8K2A", endpoint: "3f0c5bd2a1e4", deliveries: 2 }),
    Buffer.from("{}"),
  ]);
  assert.equal(again.deliveries, 2); // the hand-out its answers name

  assert.throws(() => wire.decodeIncoming([Buffer.from("RLY1")]), relay.MalformedFrameError);
  assert.throws(() => wire.decodeIncoming([Buffer.from("RLY2"), wire.pack({})]), relay.UnsupportedVersionError);
  assert.throws(() => wire.decodeIncoming([Buffer.from("RLY1"), Buffer.from([0xc1])]), relay.MalformedFrameError);
  assert.throws(() => wire.decodeIncoming([Buffer.from("RLY1"), wire.pack([1])]), relay.MalformedFrameError);

  const [subject, signals] = wire.decodeSignals([Buffer.from("a.b"), wire.pack({ type: "typing" })]);
  assert.equal(subject, "a.b");
  assert.deepEqual(signals, [{ type: "typing" }]);
  const run = [{ type: "typing" }, { type: "progress" }];
  assert.deepEqual(wire.decodeSignals(wire.encodeSignalRun("a.b", run)), ["a.b", run]);
  const oneBad = [Buffer.from("+a.b"), wire.pack([{ type: "typing" }, 7])];
  assert.deepEqual(wire.decodeSignals(oneBad)[1], [{ type: "typing" }]);
  assert.throws(() => wire.decodeSignals([Buffer.from("a.b"), wire.pack([{}])]), relay.MalformedFrameError);
  assert.throws(() => wire.decodeSignals([Buffer.from("+a.b"), wire.pack({})]), relay.MalformedFrameError);
});

test("vectors: every vector encodes, and the matcher is strict", () => {
  for (const vector of loadVectors().vectors) {
    assert.ok(framesOf(vector).length >= 1, vector.name);
  }
  assert.equal(mismatch({ a: "$int", b: [1] }, { a: 1, b: [1], c: 2 }), null);
  assert.ok(mismatch({ a: "$int" }, { a: "1" }));
  assert.ok(mismatch({ a: [1] }, { a: [1, 2] }));
  assert.ok(mismatch({ a: 1 }, {}));
  assert.ok(mismatch("x", "y"));
});

test("connect: no broker gives UnavailableError within the timeout", async () => {
  // The message names the deadline that fired (0.3 s): no stopwatch needed.
  await assert.rejects(
    relay.connect({ home: `/tmp/relay-nobody-${process.pid}`, timeout: 300 }),
    (err) => {
      assert.ok(err instanceof relay.UnavailableError);
      assert.equal(err.code, "unavailable");
      assert.match(err.message, /broker unavailable at ipc:\/\/\/tmp\/relay-nobody-\d+\/run\/router\.sock/);
      assert.match(err.message, /no answer within 0\.3 s/);
      return true;
    },
  );
});

/** A ROUTER that answers hello and nothing else: a broker that stopped answering. */
async function silentBroker(t) {
  const zmq = require("zeromq");
  const path = `/tmp/relay-node-silent-${process.pid}-${Math.random().toString(16).slice(2)}.sock`;
  const address = `ipc://${path}`;
  const router = new zmq.Router({ linger: 0 });
  await router.bind(address);
  (async () => {
    for await (const [identity, magic, body] of router) {
      const request = wire.unpack(body);
      if (request.op === "hello") {
        await router.send([identity, magic, wire.pack({ rid: request.rid, ok: true, result: { signals: "" } })]);
      }
    }
  })().catch(() => {});
  t.after(() => {
    router.close();
    require("node:fs").rmSync(path, { force: true }); // libzmq leaves the socket file
  });
  return address;
}

test("a request with no reply gives TimeoutError after the client's deadline", async (t) => {
  const client = await relay.connect({ address: await silentBroker(t), timeout: 200 });
  await assert.rejects(client.ping(), (err) => {
    assert.ok(err instanceof relay.TimeoutError && err instanceof relay.UnavailableError);
    assert.equal(err.code, "timeout");
    assert.match(err.message, /no reply to 'ping' .* within 0\.2 s/);
    return true;
  });
  await assert.rejects(client.sendRequest("status", {}, { timeout: 50 }), { code: "timeout" });
  await client.close({ bye: false });
});

test("closing rejects the requests in flight with UnavailableError", async (t) => {
  const client = await relay.connect({ address: await silentBroker(t), timeout: 5000 });
  const inflight = client.status();
  await client.close({ bye: false });
  await assert.rejects(inflight, (err) => err instanceof relay.UnavailableError && err.code === "unavailable");
});

test("replies: matched by parentId; early ones kept while a publish is in flight; late ones refused", async () => {
  const { ReplyInbox } = require("../lib/replies");
  const inbox = new ReplyInbox("_INBOX.relay.a.0123456789ab");
  assert.equal(relay.subjects.replyInbox("relay.a", "0123456789ab"), inbox.subject);

  inbox.publishing();
  const reply = inbox.published("R1");
  assert.equal(inbox.arrived({ parentId: "R1", payload: 4 }), true);
  assert.deepEqual(await reply, { parentId: "R1", payload: 4 });

  inbox.publishing(); // a quick replier: the reply comes before the publish is answered
  assert.equal(inbox.arrived({ parentId: "R2", payload: "early" }), true);
  assert.equal((await inbox.published("R2")).payload, "early");

  inbox.publishing();
  inbox.published("R3");
  inbox.giveUp("R3"); // timed out
  assert.equal(inbox.arrived({ parentId: "R3" }), false);
  assert.equal(inbox.arrived({ payload: "answers nothing" }), false);
  assert.equal(inbox.arrived({ parentId: "R1" }), false); // answered already
});
