"""Pull and ask on Relay's broker: ``fetch`` with confirmed acks beside push
consumption, and ``request`` -> ``reply`` beside a plain publish, each with the router's
CPU per message (see `PullAndAsk`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from bench.common import Figures, cpu_us, p50_p99, percentile, rate
from bench.relay_broker import RelayBroker, check_delivered
from bench.workload import (
    DRAIN_N,
    FETCH_BATCH,
    FETCH_RT_N,
    PAYLOAD,
    REQUEST_N,
    REQUEST_THREADED_N,
    REQUEST_THREADS,
    SENDER,
    SUBJECT,
    WARMUP,
)
from sdk.paths import shard_of
from sdk.subjects import endpoint_hash
from workers.index import MessageIndex
from workers.records import State


class PullAndAsk:
    """The consumer's half on one broker, with its own clients and endpoints (the rows
    of `RelayBroker` see the broker they always did):

    - a backlog of DRAIN_N messages on one endpoint (published 100 in flight, not
      timed), drained by a push subscription with the default credit (its acks leave
      together, sdk/subscription.py) and by ``fetch`` with confirmed acks: ``ack()`` one
      at a time, or ``ack_async()`` for the whole batch and then waiting for them all.
      Every drain is timed until its last ack is applied and durable, so the push
      figure includes its batched acks (`drain_push` says how it sees them);
    - one publish -> ``fetch(wait)`` -> ``ack()`` at a time: the fetch is asked first,
      on the client that then publishes (one connection's requests are handled in
      order, so the fetch is parked at the router when the message is stored);
    - ``request`` -> ``reply`` -> the reply in the asker's hands, one at a time, and
      from REQUEST_THREADS threads of one client beside plain publishes from as many.
      The replier is a push subscription in this process whose handler answers with
      ``reply_async`` (a blocking ``reply`` would make its one handler thread the bound:
      one durable publish at a time); a reply that failed fails the row.
    """

    def __init__(self, relay: RelayBroker) -> None:
        self.relay = relay
        self.router = relay.broker.procs["router"].pid
        self.consumer = relay.broker.client(timeout=30)  # subscribes, fetches, acks
        self.asker = relay.broker.client(timeout=30)  # requests, and the publishes beside
        self.replier = relay.broker.client(timeout=30)
        self.backlog = f"{SUBJECT}.backlog"
        self.pull = f"{SUBJECT}.pull"
        self.ask = f"{SUBJECT}.ask"
        self.told = f"{SUBJECT}.told"  # plain publishes beside the requests
        self.backlog_hash = endpoint_hash(self.backlog)
        home = relay.broker.home
        self.index_path = home.index_db(shard_of(self.backlog_hash, relay.shards))
        for subject in (self.backlog, self.pull, self.ask, self.told):
            self.consumer.register_endpoint(subject)
        self.reply_errors: list[BaseException] = []
        self.replier.subscribe(self.ask, self._answer)
        # Every path once before measuring (the first request also makes the asker's
        # reply inbox: a register and a subscribe).
        self.drain_push(WARMUP)
        self.drain_fetch(FETCH_BATCH, together=False, count=WARMUP)
        self.drain_fetch(FETCH_BATCH, together=True, count=WARMUP)
        self.fetch_round_trip(20)
        self.request_single(20)
        self.request_threaded(REQUEST_THREADS * 5)
        self.publish_threaded(REQUEST_THREADS * 5)

    def _answer(self, envelope: Any) -> None:
        reply = self.replier.reply_async(envelope, PAYLOAD, sender=self.ask)
        reply.add_done_callback(self._replied)

    def _replied(self, future: Any) -> None:
        try:
            check_delivered(future.result())
        except BaseException as exc:
            self.reply_errors.append(exc)

    def _fill(self, count: int) -> None:
        """``count`` messages waiting on the backlog endpoint (not timed)."""
        self.relay.in_flight(count, [self.backlog], 1)

    def drain_push(self, count: int = DRAIN_N) -> Figures:
        """The backlog drained by subscribe(): msg/s until the last ack is durable.

        A subscription's acks are not confirmed to its client (the SDK drops their
        answers), so the end is read where the writer records it: the endpoint's shard
        index, polled read-only from this process (no work for the router) from the
        moment the handler saw the last message until no row is claimed. The writer
        commits a row done after the rename and its flush, as it answers a fetch's ack.
        """
        self._fill(count)
        seen = [0]
        all_seen = threading.Event()

        def handler(_envelope: Any) -> None:  # one handler thread: no lock needed
            seen[0] += 1
            if seen[0] == count:
                all_seen.set()

        index = MessageIndex(self.index_path, readonly=True)
        try:
            before = cpu_us(self.router)
            start = time.perf_counter()
            unsubscribe = self.consumer.subscribe(self.backlog, handler)
            try:
                if not all_seen.wait(60):
                    raise RuntimeError(f"subscription saw {seen[0]}/{count} waiting messages")
            finally:
                unsubscribe()  # its last acks leave now
            deadline = time.monotonic() + 30
            while index.count(endpoint=self.backlog_hash, state=State.CLAIMED):
                if time.monotonic() > deadline:
                    raise RuntimeError("the subscription's acks were not applied within 30 s")
                time.sleep(0.001)
            elapsed = time.perf_counter() - start
        finally:
            index.close()
        return {"rate": rate(count, elapsed), "router_cpu": (cpu_us(self.router) - before) / count}

    def drain_fetch(self, batch: int, *, together: bool, count: int = DRAIN_N) -> Figures:
        """The backlog drained by fetch(batch) and confirmed acks: one ``ack()`` at a
        time, or (``together``) every ``ack_async()`` of a batch, then waiting for them."""
        self._fill(count)
        fetch, wait = self.consumer.fetch, self.consumer.wait
        drained = 0
        before = cpu_us(self.router)
        start = time.perf_counter()
        while drained < count:
            messages = fetch(self.backlog, batch=batch, wait=5.0)
            if not messages:
                raise RuntimeError(f"fetch found {drained}/{count} waiting messages")
            if together:
                for future in [message.ack_async() for message in messages]:
                    wait(future, "ack")
            else:
                for message in messages:
                    message.ack()
            drained += len(messages)
        elapsed = time.perf_counter() - start
        if drained != count:
            raise RuntimeError(f"fetch drained {drained} messages, {count} were waiting")
        return {"rate": rate(count, elapsed), "router_cpu": (cpu_us(self.router) - before) / count}

    def fetch_round_trip(self, count: int = FETCH_RT_N) -> Figures:
        """publish -> the fetch(wait) in the caller's hands (µs) -> ack() returned (µs),
        one at a time."""
        client, to_fetch, to_ack = self.consumer, [], []
        for _ in range(count):
            fetching = client.fetch_async(self.pull, batch=1, wait=10.0)
            t0 = time.perf_counter_ns()
            published = client.publish_async(self.pull, PAYLOAD, sender=SENDER)
            (message,) = client.wait(fetching, "fetch")
            to_fetch.append((time.perf_counter_ns() - t0) / 1000)
            message.ack()
            to_ack.append((time.perf_counter_ns() - t0) / 1000)
            check_delivered(client.wait(published, "publish"))
        return {
            "fetch_p50": percentile(to_fetch, 50),
            **p50_p99(to_ack),
        }

    def request_single(self, count: int = REQUEST_N) -> Figures:
        """request() -> reply in hand, one at a time (µs)."""
        request, latencies = self.asker.request, []
        for _ in range(count):
            t0 = time.perf_counter_ns()
            request(self.ask, PAYLOAD, sender=SENDER, timeout=30)
            latencies.append((time.perf_counter_ns() - t0) / 1000)
        if self.reply_errors:
            raise self.reply_errors[0]
        return p50_p99(latencies)

    def request_threaded(self, count: int = REQUEST_THREADED_N) -> Figures:
        """Requests/s from REQUEST_THREADS threads of one client; router CPU µs each."""
        request = self.asker.request
        result = self._threaded(
            lambda: request(self.ask, PAYLOAD, sender=SENDER, timeout=30), count
        )
        if self.reply_errors:
            raise self.reply_errors[0]
        return result

    def publish_threaded(self, count: int = REQUEST_THREADED_N) -> Figures:
        """Durable publishes/s from as many threads of the same client, to an endpoint
        nobody consumes; router CPU µs each."""
        publish = self.asker.publish
        return self._threaded(
            lambda: check_delivered(publish(self.told, PAYLOAD, sender=SENDER)), count
        )

    def _threaded(self, call: Callable[[], Any], count: int) -> Figures:
        per_thread = count // REQUEST_THREADS
        errors: list[BaseException] = []

        def loop() -> None:
            try:
                for _ in range(per_thread):
                    call()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=loop) for _ in range(REQUEST_THREADS)]
        before = cpu_us(self.router)
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        elapsed = time.perf_counter() - start
        if errors:
            raise errors[0]
        if any(thread.is_alive() for thread in threads):
            raise RuntimeError(f"{count} calls from {REQUEST_THREADS} threads not done in 120 s")
        done = per_thread * REQUEST_THREADS
        return {"rate": rate(done, elapsed), "router_cpu": (cpu_us(self.router) - before) / done}
