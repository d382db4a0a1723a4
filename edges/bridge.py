"""`relay bridge`: one host's link to the others over NATS JetStream (docs/federation.md).

A client of the local router (the SDK, its identity in auth.json) and of the NATS
cluster (nats-py), deciding nothing: the router plans every copy and checks every
right; JetStream keeps and replicates. Four tasks on one asyncio loop:

- advertise: the local endpoints registered shared (or matched by the router's
  ``federation.shared`` config or the bridge's ``--share`` patterns), into the KV bucket
  (``<node>.<hash>`` -> subject, node, registeredAt, depth, advertisedAt), every
  ADVERTISE_S;
- directory: watches the bucket and hands each other node's full list to the router;
- outbound: takes the router's remote parts (held ``relay_take``), publishes each to the
  far node's stream with ``Nats-Msg-Id`` = the message id, and confirms (``relayed``)
  with the PubAck's outcome;
- inbound: pulls this node's stream (durable consumer), ingests each message, and acks
  JetStream only on the router's answer (the copy durable), naks what may pass later;
- signals: those for other nodes' endpoints go out on core NATS
  (``relay.signal.<node>.<subject>``), those for this node's come in and are emitted
  here; lag: each node's consumer backlog, for `relay status`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

import nats
from nats.errors import TimeoutError as NatsTimeout
from nats.js.api import ConsumerConfig, KeyValueConfig, StorageType, StreamConfig
from nats.js.errors import BucketNotFoundError, NotFoundError

from edges import bridge_names as names
from sdk.client import Client
from sdk.errors import RelayError
from sdk.subjects import matches
from sdk.types import Signal

log = logging.getLogger("relay.bridge")

FETCH_BATCH = 100
FETCH_WAIT_S = 1.0


def _offer(queue: asyncio.Queue, item: Any) -> None:
    """Queue a signal; a full queue drops it (signals are at most once)."""
    with contextlib.suppress(asyncio.QueueFull):
        queue.put_nowait(item)


async def _result(future: Future) -> Any:
    return await asyncio.wrap_future(future)


class Bridge:
    def __init__(
        self,
        client: Client,
        servers: Sequence[str],
        node: str,
        *,
        share: Sequence[str] = (),
        replicas: int | None = None,
    ) -> None:
        self.client = client
        self.servers = list(servers)
        self.node = names.check_node(node)
        self.share = tuple(share)
        self.replicas = replicas
        self.stopping = asyncio.Event()
        self.remote: dict[str, dict[str, str]] = {}  # node -> key -> subject
        self.lags: dict[str, int] = {}  # node -> messages its consumer has not acked
        self.where: dict[str, str] = {}  # remote endpoint subject -> its node

    async def run(self) -> None:
        # A bridge started before its cluster (or during an election) waits for it
        # rather than exit: it is a Procfile line, and the messages wait in JetStream.
        while True:
            try:
                self.nc = await nats.connect(
                    servers=self.servers, max_reconnect_attempts=-1, reconnect_time_wait=0.2
                )
                break
            except Exception as exc:  # no server answers yet
                log.warning("bridge %s: NATS not reachable (%r); trying again", self.node, exc)
                await asyncio.sleep(1.0)
        self.js = self.nc.jetstream(timeout=10)
        replicas = self.replicas or min(3, max(1, len(self.nc.servers)))
        while True:
            try:
                await self._ensure(replicas)
                break
            except Exception as exc:  # no JetStream yet: no leader, a peer still starting
                log.warning("bridge %s: JetStream not ready (%r); trying again", self.node, exc)
                await asyncio.sleep(1.0)
        log.info("bridge %s: connected to %s, R%d", self.node, self.nc.connected_url, replicas)
        tasks = [
            asyncio.create_task(coroutine)
            for coroutine in (
                self._advertise(),
                self._directory(),
                self._outbound(),
                self._inbound(),
                self._lag(),
                self._signals_out(),
                self._signals_in(),
            )
        ]
        try:
            await self.stopping.wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            # close, not drain: what this bridge took and did not ack is redelivered by
            # JetStream anyway, and a drain waits for the pull subscription (30 s)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.nc.close(), 2)

    async def _ensure(self, replicas: int) -> None:
        try:
            self.kv = await self.js.key_value(names.BUCKET)
        except BucketNotFoundError:
            self.kv = await self.js.create_key_value(
                KeyValueConfig(bucket=names.BUCKET, history=1, replicas=replicas)
            )
        stream = StreamConfig(
            name=names.stream_of(self.node),
            subjects=[names.inbound(self.node)],
            storage=StorageType.FILE,
            num_replicas=replicas,
            max_bytes=names.STREAM_MAX_BYTES,
            max_age=names.STREAM_MAX_AGE_S,
            duplicate_window=120.0,
        )
        try:
            await self.js.stream_info(stream.name)
        except NotFoundError:
            await self.js.add_stream(stream)
        self.sub = await self.js.pull_subscribe(
            names.inbound(self.node),
            durable=names.consumer_of(self.node),
            stream=stream.name,
            config=ConsumerConfig(ack_wait=names.ACK_WAIT_S, max_ack_pending=names.MAX_ACK_PENDING),
        )

    # ------------------------------------------------------------------ directory

    async def _advertise(self) -> None:
        mine: set[str] = set()
        while True:
            try:
                # a future, not a thread: a thread waiting on a router that is gone would
                # hold up the bridge's exit by the client's timeout
                status = await _result(self.client.request("status"))
                now: set[str] = set()
                for endpoint in status["endpoints"]:
                    subject = endpoint["subject"]
                    if not (endpoint["shared"] or any(matches(subject, p) for p in self.share)):
                        continue
                    key = names.key_of(self.node, endpoint["hash"])
                    advert = names.Advert(
                        subject,
                        self.node,
                        endpoint.get("registeredAt", 0),
                        endpoint["depth"],
                        int(time.time() * 1000),
                    )
                    await self.kv.put(key, advert.encode())
                    now.add(key)
                for key in mine - now:
                    await self.kv.delete(key)
                mine = now
            except (RelayError, nats.errors.Error) as exc:
                log.warning("bridge %s: advertising failed: %s", self.node, exc)
            await asyncio.sleep(names.ADVERTISE_S)

    async def _directory(self) -> None:
        watcher = await self.kv.watchall()
        async for entry in watcher:
            if entry is None:  # the initial values are all in
                for node in list(self.remote):
                    await self._tell_router(node)
                continue
            node = entry.key.split(".", 1)[0]
            if node == self.node:
                continue
            keys = self.remote.setdefault(node, {})
            advert = names.Advert.decode(entry.value or b"")
            if entry.operation in ("DEL", "PURGE") or advert is None:
                keys.pop(entry.key, None)
            else:
                keys[entry.key] = advert.subject
            if not keys:  # no endpoint left (or the node forgotten): no lag to show
                self.remote.pop(node, None)
                self.lags.pop(node, None)
            self.where = {s: n for n, ks in self.remote.items() for s in ks.values()}
            await self._tell_router(node)

    async def _tell_router(self, node: str) -> None:
        subjects = sorted(set(self.remote.get(node, {}).values()))
        try:
            await _result(self.client.request("remote_endpoints", node=node, subjects=subjects))
        except RelayError as exc:
            log.warning("bridge %s: router refused endpoints of %s: %s", self.node, node, exc)

    # ------------------------------------------------------------------ signals

    async def _signals_out(self) -> None:
        """Signals on this host for endpoints of other nodes, to those nodes over core
        NATS (at most once, like signals on one host)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue(maxsize=10_000)

        def seen(subject: str, signal: Any) -> None:  # the SDK's signal thread
            if subject in self.where and names.forwardable(signal.data):
                loop.call_soon_threadsafe(_offer, queue, (subject, signal))

        stop = self.client.on_signal(">", seen)
        try:
            while True:
                subject, signal = await queue.get()
                node = self.where.get(subject)
                if node is not None:
                    body = json.dumps({"node": self.node, "signal": signal.to_wire()}).encode()
                    await self.nc.publish(names.signal_subject(node, subject), body)
        finally:
            stop()

    async def _signals_in(self) -> None:
        """Signals other nodes sent for this host's endpoints, emitted here, marked so
        that they are never forwarded again."""
        queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=10_000)

        async def received(message: Any) -> None:
            _offer(queue, message)

        await self.nc.subscribe(names.signal_subject(self.node, ">"), cb=received)
        while True:
            message = await queue.get()
            subject = message.subject.split(".", names.SIGNAL_PREFIX_TOKENS)[-1]
            try:
                body = json.loads(message.data)
                signal = Signal.from_wire(body["signal"])
                origin = names.check_node(body["node"])
                data = {**(signal.data or {}), names.RELAYED_MARK: origin}
                self.client.signal(subject, replace(signal, data=data), wait=False)
            except (RelayError, ValueError, KeyError, TypeError) as exc:
                log.info("bridge %s: signal on %s dropped: %s", self.node, subject, exc)

    # ------------------------------------------------------------------ status

    def _seen(self) -> dict[str, Any]:
        """What `relay status` shows of the cluster, sent with each relay_take."""
        return {
            "server": str(self.nc.connected_url.netloc if self.nc.connected_url else ""),
            "servers": sorted(str(u.netloc) for u in self.nc.servers),
            "lag": dict(self.lags),
        }

    async def _lag(self) -> None:
        """Each node's lag: messages in its stream its bridge has not acked yet (a node
        that is down shows what waits for it)."""
        while True:
            for node in sorted({self.node, *self.remote}):
                try:
                    info = await self.js.consumer_info(
                        names.stream_of(node), names.consumer_of(node)
                    )
                    self.lags[node] = info.num_pending + info.num_ack_pending
                except Exception:  # not created yet, or the cluster busy: keep the last
                    continue
            await asyncio.sleep(names.ADVERTISE_S)

    # ------------------------------------------------------------------ outbound

    async def _outbound(self) -> None:
        while True:
            try:
                answer = await _result(
                    self.client.request(
                        "relay_take", node=self.node, limit=FETCH_BATCH, cluster=self._seen()
                    )
                )
            except RelayError as exc:
                log.warning("bridge %s: relay_take failed: %s", self.node, exc)
                await asyncio.sleep(0.2)
                continue
            parts = answer["parts"]
            if not parts:
                continue
            outcomes = await asyncio.gather(*(self._publish(p) for p in parts))
            confirmations = [
                [p["token"], p["node"], err] for p, err in zip(parts, outcomes, strict=True)
            ]
            try:
                await _result(self.client.request("relayed", parts=confirmations))
            except RelayError as exc:  # the publishes get `unavailable` at their deadline
                log.warning("bridge %s: relayed failed: %s", self.node, exc)

    async def _publish(self, part: dict[str, Any]) -> str | None:
        """None once JetStream has the part (PubAck), else why not."""
        subject = names.outbound(part["node"], self.node)
        headers = {"Nats-Msg-Id": part["envelope"]["id"]}
        try:
            await self.js.publish(subject, names.encode_part(part), headers=headers)
            return None
        except Exception as exc:  # every failure is the same answer: not confirmed
            return f"JetStream did not take it for node {part['node']}: {exc!r:.200}"

    # ------------------------------------------------------------------ inbound

    async def _inbound(self) -> None:
        while True:
            try:
                messages = await self.sub.fetch(FETCH_BATCH, timeout=FETCH_WAIT_S)
            except NatsTimeout:
                continue
            except nats.errors.Error as exc:
                log.warning("bridge %s: fetch failed: %s", self.node, exc)
                await asyncio.sleep(0.2)
                continue
            await asyncio.gather(*(self._deliver(m) for m in messages))

    async def _deliver(self, message: Any) -> None:
        origin = names.origin_of(message.subject)
        try:
            subjects, envelope = names.decode_part(message.data)
            result = await _result(self.client.ingest_async(envelope, subjects, node=origin))
            settle = names.settle_result(result)
        except RelayError as exc:
            settle = names.settle_error(exc)
            log.log(
                logging.INFO if settle is names.Settle.NAK else logging.WARNING,
                "bridge %s: ingest from %s: %s",
                self.node,
                origin,
                exc,
            )
        try:
            if settle is names.Settle.ACK:
                await message.ack()
            elif settle is names.Settle.NAK:
                await message.nak(delay=names.RETRY_DELAY_S)
            else:
                await message.term()
        except nats.errors.Error as exc:  # JetStream redelivers; ingest is idempotent
            log.warning("bridge %s: ack failed: %s", self.node, exc)


def serve(bridge: Bridge) -> None:
    """Run the bridge until SIGTERM or SIGINT."""
    import signal

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, bridge.stopping.set)
        await bridge.run()

    asyncio.run(main())
