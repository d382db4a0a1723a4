#!/usr/bin/env node
"use strict";
/**
 * The Node side of tests/test_clients_node.py: one command per run, JSON lines out.
 *
 *   peer.js publish SUBJECT FROM PAYLOAD_JSON [--receipt]   publish; with --receipt, wait
 *       for the delivery_receipt signal on FROM and print it too
 *   peer.js consume PATTERN COUNT          print {"ready":true}, then for each message
 *       {"id","endpoint","envelope"}; ack it, or nack it when its payload has "nack": true
 *   peer.js signals PATTERN COUNT          print {"ready":true}, then COUNT signals received
 *   peer.js signal SUBJECT TYPE STATE TIMES  send a signal TIMES times, 100 ms apart
 *   peer.js request SUBJECT FROM PAYLOAD_JSON   request() and print {"reply": envelope}
 *   peer.js replier SUBJECT COUNT          print {"ready":true}, then answer COUNT requests with
 *       reply() ({"echo": payload}), printing {"id","deliveries"} of each
 *   peer.js hold PATTERN                   fetch one message, print {"id","deliveries"}, then
 *       ack it when a line comes on stdin, printing {"settled"}
 *
 * The broker is the one of $RELAY_TEST_HOME (or $RELAY_HOME). A failure prints
 * {"error": {"name", "code", "message"}} and exits 1.
 */
const relay = require("..");
const { brokerHome, signalsFlowing, sleep } = require("./helpers");

const out = (obj) => process.stdout.write(`${JSON.stringify(obj)}\n`);

/** `promise`'s value, or `fallback` after `ms` (the timer does not outlive it). */
function within(promise, ms, fallback) {
  let timer;
  const timeout = new Promise((resolve) => (timer = setTimeout(() => resolve(fallback), ms)));
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

async function main([command, ...args]) {
  const client = await relay.connect({ home: brokerHome(), name: `node-peer/${command}` });
  try {
    if (command === "publish") {
      const [subject, from, payload, flag] = args;
      let receipt;
      if (flag === "--receipt") {
        receipt = new Promise((resolve) => {
          client.onSignal(from, (s, signal) => signal.type === "delivery_receipt" && resolve(signal));
        });
        await signalsFlowing(client, from);
      }
      const result = await client.publish(subject, JSON.parse(payload), { from, replyTo: from });
      out({ result });
      if (receipt) {
        out({ receipt: await within(receipt, 10_000, { timeout: true }) });
      }
    } else if (command === "consume") {
      const [pattern, count] = args;
      const subscription = await client.subscribe(pattern);
      out({ ready: true, sub: subscription.id });
      let seen = 0;
      for await (const message of subscription) {
        const payload = message.payload;
        const settled = payload && payload.nack ? await message.nack("asked to nack") : await message.ack();
        out({ id: message.id, endpoint: message.endpoint, envelope: message.envelope, settled });
        if (++seen >= Number(count)) break;
      }
    } else if (command === "signals") {
      const [pattern, count] = args;
      const received = [];
      let done;
      const finished = new Promise((resolve) => (done = resolve));
      await client.onSignal(pattern, (subject, signal) => {
        received.push({ subject, signal });
        out({ subject, signal });
        if (received.length >= Number(count)) done();
      });
      out({ ready: true });
      await within(finished, 20_000);
    } else if (command === "signal") {
      const [subject, type, state, times] = args;
      for (let i = 0; i < Number(times); i++) {
        await client.signal(subject, { type, state, data: { n: i } });
        await sleep(100);
      }
      out({ sent: Number(times) });
    } else if (command === "request") {
      const [subject, from, payload] = args;
      out({ reply: await client.request(subject, JSON.parse(payload), { from, timeout: 15_000 }) });
    } else if (command === "replier") {
      const [subject, count] = args;
      const subscription = await client.subscribe(subject);
      out({ ready: true });
      let seen = 0;
      for await (const message of subscription) {
        await client.reply(message, { echo: message.payload }, { from: subject });
        await message.ack();
        out({ id: message.id, deliveries: message.deliveries });
        if (++seen >= Number(count)) break;
      }
    } else if (command === "hold") {
      const [pattern] = args;
      const [message] = await client.fetch(pattern, { wait: 10_000 });
      out({ id: message.id, deliveries: message.deliveries });
      await new Promise((resolve) => process.stdin.once("data", resolve));
      process.stdin.destroy(); // else the open stdin keeps the process alive
      out({ settled: await message.ack() });
    } else {
      throw new Error(`unknown command ${command}`);
    }
  } finally {
    await client.close();
  }
}

main(process.argv.slice(2)).catch((err) => {
  out({ error: { name: err.name, code: err.code, message: err.message } });
  process.exit(1);
});
