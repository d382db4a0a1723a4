"use strict";
/**
 * The shared protocol vectors (clients/vectors.json) against a fresh broker.
 *
 * Each vector's frames go out on a raw DEALER socket and the reply is matched against
 * the vector; error replies are decoded by the client's own `wire.decodeIncoming`, which
 * must give the typed error for the code. Error vectors that are well-formed requests
 * are sent a second time through `Client.request`, which must reject with that error.
 */
const test = require("node:test");
const assert = require("node:assert/strict");
const zmq = require("zeromq");

const relay = require("..");
const { brokerHome, loadVectors, framesOf, mismatch } = require("./helpers");

async function readReply(socket, timeoutMs = 15_000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    socket.receiveTimeout = Math.max(1, deadline - Date.now());
    const frames = await socket.receive();
    assert.equal(Buffer.from(frames[0]).toString(), "RLY1");
    const body = relay.wire.unpack(frames[1]);
    if ("push" in body) continue; // a message for the observing subscription
    assert.equal(frames.length, 2);
    return { frames, body };
  }
}

test("the shared vectors pass against the broker", async (t) => {
  const home = brokerHome();
  const socket = new zmq.Dealer({ linger: 0 });
  socket.connect(relay.routerAddress(home));
  const client = await relay.connect({ home, timeout: 15_000 });
  try {
    for (const vector of loadVectors().vectors) {
      await t.test(vector.name, async () => {
        await socket.send(framesOf(vector));
        const { frames, body } = await readReply(socket);
        const problem = mismatch(vector.reply, body);
        assert.equal(problem, null, problem);
        if (vector.reply.ok) return;

        const code = vector.reply.error.code;
        const decoded = relay.wire.decodeIncoming(frames);
        assert.equal(decoded.ok, false);
        assert.ok(decoded.error instanceof relay.ERROR_CLASSES[code], `${decoded.error.name} for ${code}`);
        assert.equal(decoded.error.code, code);

        const request = vector.request;
        if (request && typeof request.op === "string" && Number.isInteger(request.rid) && request.rid >= 0) {
          const { op, rid, ...fields } = request;
          await assert.rejects(client.sendRequest(op, fields), (err) => {
            assert.ok(err instanceof relay.ERROR_CLASSES[code], `${err.name} for ${code}`);
            assert.equal(err.code, code);
            return true;
          });
        }
      });
    }
  } finally {
    socket.close();
    await client.close();
  }
});
