"use strict";
/** The client against a running broker (RELAY_TEST_HOME); each test uses its own subjects. */
const test = require("node:test");
const assert = require("node:assert/strict");
const crypto = require("node:crypto");

const relay = require("..");
const { brokerHome, signalsFlowing, sleep, waitFor } = require("./helpers");

const home = brokerHome();
const unique = () => `t${crypto.randomBytes(4).toString("hex")}`;

async function withClient(fn, options = {}) {
  const client = await relay.connect({ home, name: "node-tests", ...options });
  try {
    return await fn(client);
  } finally {
    await client.close();
  }
}

test("hello, register, endpoints, unregister", () =>
  withClient(async (client) => {
    assert.equal(client.server.server, "relay");
    assert.equal(client.server.version, 1);
    assert.match(client.server.signals, /^(ipc|tcp):\/\//);
    const subject = `relay.node.${unique()}.backend`;
    const info = await client.register(subject);
    assert.equal(info.subject, subject);
    assert.equal(info.hash, relay.subjects.endpointHash(subject));
    const again = await client.register(subject); // a known endpoint: created false
    assert.equal(info.created, true);
    assert.deepEqual(again, { ...info, created: false });
    const listed = (await client.endpoints()).find((e) => e.subject === subject);
    assert.equal(listed.hash, info.hash);
    assert.equal(listed.depth, 0);
    assert.equal(await client.unregister(subject), true);
    assert.equal(await client.unregister(subject), false);
    assert.ok(!(await client.endpoints()).some((e) => e.subject === subject));
  }));

test("publish, then for-await over the messages and ack them; the sender gets receipts", () =>
  withClient(async (client) => {
    const ns = `relay.node.${unique()}`;
    const backend = `${ns}.backend`;
    const frontend = `${ns}.frontend`;
    const info = await client.register(backend);
    const receipts = [];
    const off = await client.onSignal(frontend, (subject, signal) => {
      if (signal.type === "delivery_receipt") receipts.push([subject, signal]);
    });
    await signalsFlowing(client, frontend);
    const first = await client.publish(backend, { content: "one" }, { from: frontend, replyTo: frontend });
    assert.equal(first.deliveredTo, 1);
    assert.deepEqual(first.rejected, []);
    assert.ok(info.hash in first.mailboxPressure);

    const subscription = await client.subscribe(`${ns}.*`);
    const second = await client.publish(backend, { content: "two" }, { from: frontend });
    const seen = [];
    for await (const message of subscription) {
      assert.equal(message.endpoint, info.hash);
      assert.equal(message.subject, backend);
      assert.equal(message.from, frontend);
      assert.equal(typeof message.createdAt, "number");
      assert.equal(message.budget.maxHops, 5);
      seen.push(message.id);
      assert.deepEqual(await message.ack(), { state: "done" });
      await assert.rejects(message.ack(), relay.InvalidStateError);
      if (seen.length === 2) break;
    }
    assert.deepEqual(seen, [first.messageId, second.messageId]); // backlog first, in order
    assert.equal(subscription.id > 0, true);
    const trace = await client.trace(first.messageId);
    assert.equal(trace.copies[0].state, "done");
    await waitFor(() => receipts.length === 2, { what: "two delivery receipts" });
    for (const [subject, signal] of receipts) {
      assert.equal(subject, frontend);
      assert.equal(signal.type, "delivery_receipt");
      assert.equal(signal.endpointSubject, backend);
    }
    assert.deepEqual(receipts.map(([, s]) => s.data.messageId).sort(), seen.slice().sort());
    off();
  }));

test("nack makes a dead letter with code nack; dead letters can be listed and purged", () =>
  withClient(async (client) => {
    const subject = `relay.node.${unique()}.backend`;
    const info = await client.register(subject);
    const published = await client.publish(subject, { content: "bad" }, { from: "relay.node.sender" });
    const subscription = await client.subscribe(subject, { credit: 1 });
    for await (const message of subscription) {
      await message.nack("could not parse it");
      break;
    }
    const letters = await client.deadLetters({ endpoint: info.hash });
    assert.equal(letters.length, 1);
    assert.equal(letters[0].id, published.messageId);
    assert.equal(letters[0].code, "nack");
    assert.equal(letters[0].reason, "could not parse it");
    assert.equal(letters[0].envelope.payload.content, "bad");
    assert.equal((await client.deadLetters({ endpoint: subject })).length, 1); // by subject too
    assert.equal(await client.purgeDeadLetters({ endpoint: info.hash }), 1);
    assert.deepEqual(await client.deadLetters({ endpoint: info.hash }), []);
  }));

test("requeueDeadLetters() puts dead letters back under their ids; past its TTL one is refused", () =>
  withClient(async (client) => {
    const subject = `relay.node.${unique()}.backend`;
    const info = await client.register(subject);
    const from = "relay.node.sender";
    const ttl = Date.now() + 1500;
    const budget = { hopCount: 0, maxHops: 5, ancestorChain: [], ttl, callBudgetRemaining: 10 };
    const lasting = (await client.publish(subject, { n: 1 }, { from })).messageId;
    const brief = (await client.publish(subject, { n: 2 }, { from, budget })).messageId;
    for (const message of await client.fetch(subject, { batch: 2, wait: 5000 })) {
      await message.nack("not now");
    }
    await waitFor(() => Date.now() > ttl + 50, { what: "the short TTL to pass" });

    // Given one id past its TTL: its refusal is the typed error, and it stays.
    await assert.rejects(client.requeueDeadLetters({ id: brief }), (err) => {
      assert.ok(err instanceof relay.TtlExpiredError && err instanceof relay.InvalidStateError);
      assert.equal(err.code, "ttl_expired");
      return true;
    });
    // A page of the endpoint's: one back, one refused with its code, none left after.
    const page = await client.requeueDeadLetters({ endpoint: info.hash, limit: 10 });
    assert.deepEqual(page.requeued, [{ id: lasting, endpoint: info.hash }]);
    assert.deepEqual(page.refused.map((r) => [r.id, r.code]), [[brief, "ttl_expired"]]);
    assert.equal(page.more, false);
    assert.deepEqual((await client.deadLetters({ endpoint: info.hash })).map((d) => d.id), [brief]);
    const [again] = await client.fetch(subject, { wait: 5000 });
    assert.equal(again.id, lasting);
    assert.equal(again.deliveries, 1);
    await again.ack();
  }));

test("consume(): a handler that returns acks, one that throws nacks", () =>
  withClient(async (client) => {
    const subject = `relay.node.${unique()}.worker`;
    const info = await client.register(subject);
    const handled = [];
    const subscription = await client.consume(subject, async (message) => {
      handled.push(message.payload.n);
      if (message.payload.n === 2) throw new Error("two is wrong");
    });
    const ids = [];
    for (const n of [1, 2, 3]) {
      ids.push((await client.publish(subject, { n }, { from: "relay.node.sender" })).messageId);
    }
    await waitFor(async () => {
      const states = await Promise.all(ids.map(async (id) => (await client.trace(id)).copies[0].state));
      return states.join() === "done,failed,done";
    }, { what: "done, failed, done" });
    assert.deepEqual(handled, [1, 2, 3]);
    const [letter] = await client.deadLetters({ endpoint: info.hash });
    assert.equal(letter.code, "nack");
    assert.match(letter.reason, /two is wrong/);
    await subscription.unsubscribe();
  }));

test("observe: every new message, no claim, nothing to ack", () =>
  withClient(async (client) => {
    const subject = `relay.node.${unique()}.watched`;
    await client.register(subject);
    const observer = await client.observe(subject);
    const published = await client.publish(subject, "seen", { from: "relay.node.sender" });
    const { value: message } = await observer.next();
    assert.equal(message.id, published.messageId);
    assert.equal(message.payload, "seen");
    await assert.rejects(message.ack(), relay.InvalidStateError);
    await observer.unsubscribe();
    assert.deepEqual(await observer.next(), { value: undefined, done: true });
    // Not claimed: it still waits in new/.
    assert.equal((await client.endpoints()).find((e) => e.subject === subject).depth, 1);
  }));

test("leaving the loop ends the subscription; the message in hand can still be acked", () =>
  withClient(async (client) => {
    const subject = `relay.node.${unique()}.backend`;
    await client.register(subject);
    for (const n of [1, 2, 3]) await client.publish(subject, { n }, { from: "relay.node.sender" });
    const subscription = await client.subscribe(subject, { credit: 1 });
    let held;
    for await (const message of subscription) {
      held = message;
      break;
    }
    assert.equal(held.payload.n, 1);
    assert.equal((await client.pending(subject)).length, 1);
    await held.ack();
    assert.equal((await client.pending(subject)).length, 0);
    const again = await client.subscribe(subject);
    const rest = [];
    for await (const message of again) {
      rest.push(message.payload.n);
      await message.ack();
      if (rest.length === 2) break;
    }
    assert.deepEqual(rest, [2, 3]);
  }));

test("reply(): answers on replyTo with the budget carried forward", () =>
  withClient(async (client) => {
    const ns = `relay.node.${unique()}`;
    await client.register(`${ns}.backend`);
    await client.register(`${ns}.frontend`);
    await client.publish(`${ns}.backend`, "question?", { from: `${ns}.frontend`, replyTo: `${ns}.frontend` });
    const backend = await client.subscribe(`${ns}.backend`);
    const { value: question } = await backend.next();
    const answered = await client.reply(question, "answer!", { from: `${ns}.backend` });
    assert.equal(answered.deliveredTo, 1);
    await question.ack();
    const frontend = await client.subscribe(`${ns}.frontend`);
    const { value: answer } = await frontend.next();
    assert.equal(answer.payload, "answer!");
    assert.equal(answer.replyTo, `${ns}.backend`);
    assert.equal(answer.budget.hopCount, 2);
    assert.equal(answer.parentId, question.id);
    assert.equal(answer.envelope.parentId, question.id);
    assert.equal(question.parentId, null);
    await answer.ack();
    await backend.unsubscribe();
    await frontend.unsubscribe();
  }));

test("a subscription outlives 6 s of silence: the client pings", { timeout: 30_000 }, () =>
  withClient(async (client) => {
    const subject = `relay.node.${unique()}.idle`;
    await client.register(subject);
    const subscription = await client.subscribe(subject);
    await sleep(6_000);
    await withClient((other) => other.publish(subject, "late", { from: "relay.node.sender" }));
    const { value } = await subscription.next();
    assert.equal(value.payload, "late");
    await value.ack();
  }));

test("a subscription the router lost (the session timed out) is renewed", { timeout: 30_000 }, () =>
  withClient(async (client) => {
    const subject = `relay.node.${unique()}.renewed`;
    await client.register(subject);
    const subscription = await client.subscribe(subject);
    const first = subscription.id;
    // Block this thread for 6 s: no pings, so the router ends the session.
    Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 6_000);
    await withClient((other) => other.publish(subject, "after", { from: "relay.node.sender" }));
    const { value } = await subscription.next();
    assert.equal(value.payload, "after");
    assert.equal(subscription.renewals, 1);
    assert.notEqual(subscription.id, first);
    assert.equal(value.sub, subscription.id);
    await value.ack();
    await subscription.unsubscribe();
  }));

test("a signal sent with wait: false arrives without a reply; a refused one is dropped", () =>
  withClient(async (client) => {
    const subject = `relay.node.${unique()}.status`;
    const spammer = `relay.node.${unique()}.spammer`;
    await client.addRule({ from: spammer, to: subject, action: "deny", priority: 1 });
    const states = []; // progress signals only: probes of signalsFlowing may still arrive
    await client.onSignal(subject, (s, signal) => signal.type === "progress" && states.push(signal.state));
    await signalsFlowing(client, subject);
    await client.signal(subject, { type: "progress", state: "denied" }, { from: spammer, wait: false });
    await client.signal(subject, { type: "progress", state: "50%" }, { wait: false });
    await waitFor(() => states.includes("50%"), { what: "the signal sent without waiting" });
    assert.deepEqual(states, ["50%"]);
  }));

test("fetch claims what waits, says deliveries, and its answers are confirmed", () =>
  withClient(async (client) => {
    const ns = `relay.node.${unique()}`;
    const backend = `${ns}.backend`;
    const info = await client.register(backend);
    const ids = [];
    for (const n of [1, 2, 3]) ids.push((await client.publish(backend, n, { from: `${ns}.front` })).messageId);

    const two = await client.fetch(`${ns}.*`, { batch: 2, ackWait: 60_000 });
    assert.deepEqual(two.map((m) => [m.id, m.endpoint, m.deliveries, m.payload]), [
      [ids[0], info.hash, 1, 1],
      [ids[1], info.hash, 1, 2],
    ]);
    assert.deepEqual(await two[0].ack(), { state: "done" });
    assert.equal((await client.trace(ids[0])).copies[0].state, "done"); // no waiting
    await assert.rejects(two[0].ack(), relay.InvalidStateError);
    assert.deepEqual(await two[1].nack("cannot parse"), { state: "failed" });
    const [letter] = await client.deadLetters({ endpoint: info.hash });
    assert.deepEqual([letter.id, letter.code, letter.reason], [ids[1], "nack", "cannot parse"]);

    const [third] = await client.fetch(backend, { wait: 5000 });
    assert.equal(third.id, ids[2]);
    assert.deepEqual(await third.inProgress(), { deliveries: 1 });
    assert.deepEqual(await third.ack(), { state: "done" });
    assert.deepEqual(await client.fetch(backend, { wait: 100 }), []); // nothing waits
  }));

test("an answer names its hand-out: an ack meant for an earlier one is refused", () =>
  withClient(async (client) => {
    const backend = `relay.node.${unique()}.backend`;
    await client.register(backend);
    const { messageId } = await client.publish(backend, "slow", { from: "relay.node.front" });
    const subscription = await client.subscribe(backend, { credit: 1, ackWait: 300 });
    const iterator = subscription[Symbol.asyncIterator]();
    const first = (await iterator.next()).value;
    assert.deepEqual([first.id, first.deliveries], [messageId, 1]);
    // Not answered within ackWait: taken back, and pushed to us again.
    const second = (await iterator.next()).value;
    assert.deepEqual([second.id, second.deliveries], [messageId, 2]);
    await assert.rejects(first.ack(), relay.InvalidStateError); // hand-out 1 is gone
    assert.deepEqual(await second.ack(), { state: "done" });
    await subscription.unsubscribe();
  }));

test("request resolves with the reply whose parentId is the request's id", () =>
  withClient(async (client) => {
    const ns = `relay.node.${unique()}`;
    const backend = `${ns}.backend`;
    await client.register(backend);
    const asked = [];
    await client.consume(backend, async (message) => {
      asked.push(message.envelope);
      await client.reply(message, { answer: message.payload.q * 2 }, { from: backend });
    });
    const reply = await client.request(backend, { q: 21 }, { from: `${ns}.front`, timeout: 10_000 });
    assert.equal(reply.payload.answer, 42);
    assert.equal(reply.parentId, asked[0].id);
    assert.match(asked[0].replyTo, new RegExp(`^_INBOX\\.${ns}\\.front\\.[0-9a-f]{12}$`));
  }));

test("request is refused at once without an endpoint, and times out without a reply", () =>
  withClient(async (client) => {
    const ns = `relay.node.${unique()}`;
    const started = Date.now();
    await assert.rejects(
      client.request(`${ns}.nobody`, 1, { from: `${ns}.front`, timeout: 20_000 }),
      (err) => err.code === "no_match",
    );
    assert.ok(Date.now() - started < 10_000, "refused without waiting for the timeout");

    const silent = `${ns}.silent`;
    await client.register(silent);
    await assert.rejects(
      client.request(silent, "anyone?", { from: `${ns}.front`, timeout: 300 }),
      (err) => err instanceof relay.TimeoutError && /no reply to request/.test(err.message),
    );
    // A reply after the request gave up is a dead letter, never a later answer.
    const [asked] = await client.fetch(silent, { wait: 5000 });
    await client.reply(asked, "too late", { from: silent });
    await asked.ack();
    const letters = await waitFor(
      async () => {
        const late = (await client.deadLetters({ endpoint: asked.replyTo })).filter((d) => d.code === "late_reply");
        return late.length ? late : null;
      },
      { what: "the late reply's dead letter" },
    );
    assert.equal(letters[0].parentId, asked.id);
  }));

test("every error reply is a typed error with its code", () =>
  withClient(async (client) => {
    const registered = await client.register(`relay.node.${unique()}.errors`);
    const cases = [
      [() => client.sendRequest("teleport"), relay.UnknownOperationError, "unknown_operation"],
      [() => client.sendRequest("publish", { subject: "a..b", from: "a.b", payload: 1 }), relay.InvalidSubjectError, "invalid_subject"],
      [() => client.sendRequest("publish", { subject: "a.b", from: "a.b" }), relay.InvalidMessageError, "invalid_message"],
      [() => client.pending(`relay.node.${unique()}.nobody`), relay.EndpointNotFoundError, "endpoint_not_found"],
      [() => client.subscribe("relay.node.>", { credit: 5000 }), relay.LimitExceededError, "limit_exceeded"],
      [() => client.sendRequest("unsubscribe", { sub: 987654 }), relay.InvalidStateError, "invalid_state"],
      [() => client.setConfig({ limits: { maxCredit: "lots" } }), relay.InvalidConfigError, "invalid_config"],
      [() => client.complete("01JDQ3ZV9R6Q4W1T3M5N7P8K2A", registered.hash), relay.MessageNotFoundError, "message_not_found"],
      // checked locally, before anything is sent
      [() => client.register("relay.*"), relay.InvalidSubjectError, "invalid_subject"],
      [() => client.publish("relay.x", 1), relay.InvalidMessageError, "invalid_message"],
    ];
    for (const [call, cls, code] of cases) {
      await assert.rejects(call(), (err) => {
        assert.ok(err instanceof cls, `${err.name} is not a ${cls.name}`);
        assert.equal(err.code, code);
        assert.ok(err.message.length > 0);
        return true;
      });
    }
    const big = "x".repeat(1024 * 1024 + 1);
    await assert.rejects(client.publish("relay.node.big", big, { from: "relay.node.sender" }), relay.PayloadTooLargeError);
    assert.ok((await client.ping()).now > 0); // still usable
  }));

test("a closed client rejects requests; closing twice is fine", async () => {
  const client = await relay.connect({ home });
  await client.close();
  await client.close();
  await assert.rejects(client.ping(), (err) => err instanceof relay.UnavailableError && err.code === "unavailable");
});
