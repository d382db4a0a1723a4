"""`relay bridge`: one host's link to the others over NATS JetStream (docs/federation.md).

A client of the local router (the SDK, its identity in auth.json) and of the NATS
cluster (nats-py), deciding nothing: the router plans every copy and checks every
right; JetStream keeps and replicates. Four tasks on one asyncio loop:

- advertise: the local endpoints registered shared (or matched by the router's
  ``federation.shared`` config or the bridge's ``--share`` patterns), into the KV bucket
  (``<node>.<hash>`` -> subject, node, registeredAt, depth, advertisedAt), every
  ADVERTISE_S;
- directory: reads the bucket and hands each other node's full list to the router;
- outbound: takes the router's remote parts (held ``relay_take``), publishes each to the
  far node's stream (no ``Nats-Msg-Id``: the far router de-duplicates by origin node
  and id), and confirms (``relayed``) with the PubAck's outcome;
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
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import nats
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


def _where(url: str) -> str:
    """host:port of a server URL, without the user and password it may carry (a URL is
    logged and shown in `relay status`; a secret never is)."""
    parts = urlsplit(url if "://" in url else f"nats://{url}")
    return f"{parts.hostname}:{parts.port or 4222}"


class CredentialsError(ValueError):
    """A credentials file the bridge cannot use: missing, unreadable or malformed."""


@dataclass(frozen=True, slots=True)
class Credentials:
    """How the bridge proves to NATS which node it is (docs/federation.md,
    "Identities"): a .creds file (JWT and nkey seed, for servers in operator mode), or a
    file holding an nkey seed, or neither (the URLs' ``user:password@``, or nothing);
    and the CA that signs the servers' TLS certificates. nats-py reads the files again
    at each (re)connection, so they are checked once here to fail at start, clearly."""

    creds: Path | None = None
    nkey: Path | None = None
    tls_ca: Path | None = None

    def check(self) -> None:
        """Raise CredentialsError naming the option and the file, never its content."""
        if self.creds is not None:
            text = _read(self.creds, "--creds")
            if b"BEGIN NATS USER JWT" not in text or b"BEGIN USER NKEY SEED" not in text:
                raise CredentialsError(f"--creds {self.creds}: not a NATS .creds file")
        if self.nkey is not None:
            import nkeys  # nats-py's nkeys extra (the federation extra installs it)

            seed = bytearray(_read(self.nkey, "--nkey").strip())
            try:
                nkeys.from_seed(seed).wipe()
            except Exception:  # nkeys raises its own errors and binascii's
                raise CredentialsError(f"--nkey {self.nkey}: not an nkey seed") from None
        if self.tls_ca is not None:
            _read(self.tls_ca, "--tls-ca")
            self._tls()

    def _tls(self) -> ssl.SSLContext:
        try:
            return ssl.create_default_context(cafile=str(self.tls_ca))
        except (ssl.SSLError, OSError, ValueError):
            raise CredentialsError(f"--tls-ca {self.tls_ca}: no certificate in it") from None

    def connect_options(self) -> dict[str, Any]:
        """nats.connect keywords."""
        options: dict[str, Any] = {}
        if self.creds is not None:
            options["user_credentials"] = str(self.creds)
        if self.nkey is not None:
            options["nkeys_seed"] = str(self.nkey)
        if self.tls_ca is not None:
            options["tls"] = self._tls()
        return options


def _read(path: Path, option: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise CredentialsError(f"{option} {path}: {exc.strerror or exc}") from None


class _Reporter:
    """nats-py's error callback for a bridge. What the server refuses is said at ERROR
    level: a bridge whose credentials are turned down must not look like one waiting
    for its cluster, and a permissions violation means this node's NATS user lacks a
    right the bridge needs (names.permissions; the request that met it times out).
    nats-py tries again every RECONNECT_S per server, so each message is said once,
    then again at most every REPEAT_S while it lasts."""

    REPEAT_S = 30.0

    def __init__(self, node: str, servers: Sequence[str]) -> None:
        self.node = node
        self.where = ", ".join(_where(url) for url in servers)
        self.said: dict[str, float] = {}  # message -> when last logged

    async def report(self, exc: Exception) -> None:
        text = str(exc).lower()  # nats-py lowercases some of the server's messages
        level = logging.ERROR
        if isinstance(exc, nats.errors.AuthorizationError) or "authorization violation" in text:
            message = (
                f"NATS refused this node's credentials (authorization violation) at "
                f"{self.where}: check --creds, --nkey or the URLs' user; trying again"
            )
        elif "permissions violation" in text:
            message = f"NATS refused: {exc}"
        else:  # a server gone or not up yet: nats-py keeps trying
            level, message = logging.WARNING, f"NATS: {exc!r:.300}"
        now = time.monotonic()
        if now - self.said.get(message, -self.REPEAT_S) >= self.REPEAT_S:
            if len(self.said) > 100:  # bounded: messages name servers and subjects
                self.said.clear()
            self.said[message] = now
            log.log(level, "bridge %s: %s", self.node, message)


RECONNECT_S = 0.2


async def connect(
    servers: Sequence[str], node: str, credentials: Credentials, *, once: bool = False
) -> Any:
    """A NATS connection for node's bridge, once a server takes it.

    nats-py keeps trying the servers until one does: a bridge started before its
    cluster (or during an election) waits for it rather than exit, since it is a
    Procfile line and the messages wait in JetStream. Refused credentials are retried
    too (a server's configuration may be reloaded, a file replaced), and reported
    (_Reporter). ``once``: try each server and raise (`--setup`, run by hand)."""
    while True:
        try:
            return await nats.connect(
                servers=list(servers),
                max_reconnect_attempts=1 if once else -1,
                reconnect_time_wait=RECONNECT_S,
                inbox_prefix=names.inbox_prefix(node),
                error_cb=_Reporter(node, servers).report,
                **credentials.connect_options(),
            )
        except Exception as exc:  # a credentials file gone since the start, say
            if once:
                raise
            log.warning("bridge %s: cannot connect to NATS (%r); trying again", node, exc)
            await asyncio.sleep(1.0)


async def ensure(js: Any, node: str, replicas: int) -> tuple[Any, Any]:
    """The bucket, node's stream and its durable consumer, each created if missing:
    (the bucket, the pull subscription). A node's least-privilege NATS user may look
    them up but not create them (edges/bridge_names.permissions): `relay bridge
    --setup` runs this once with a user that may."""
    try:
        kv = await js.key_value(names.BUCKET)
    except BucketNotFoundError:
        kv = await js.create_key_value(
            # direct: a key is read from any replica (names.permissions grants that way)
            KeyValueConfig(bucket=names.BUCKET, history=1, replicas=replicas, direct=True)
        )
    stream = StreamConfig(
        name=names.stream_of(node),
        subjects=[names.inbound(node)],
        storage=StorageType.FILE,
        num_replicas=replicas,
        max_bytes=names.STREAM_MAX_BYTES,
        max_age=names.STREAM_MAX_AGE_S,
        duplicate_window=120.0,
    )
    try:
        await js.stream_info(stream.name)
    except NotFoundError:
        await js.add_stream(stream)
    sub = await js.pull_subscribe(
        names.inbound(node),
        durable=names.consumer_of(node),
        stream=stream.name,
        config=ConsumerConfig(ack_wait=names.ACK_WAIT_S, max_ack_pending=names.MAX_ACK_PENDING),
    )
    return kv, sub


async def read_adverts(js: Any, kv: Any, subjects: str) -> dict[str, names.Advert | None]:
    """The directory's keys under ``subjects`` and what each says (None: deleted, or not
    an advert): one stream info lists them, one direct get per key reads them. Not
    `KeyValue.keys`: its watcher is a push consumer, which a node's user may not create
    (names.permissions), and it may end its listing early on a busy cluster."""
    info = await js.stream_info(names.KV_STREAM, subjects_filter=subjects)
    keys = sorted(names.key_of_subject(s) for s in info.state.subjects or {})
    return dict(zip(keys, await asyncio.gather(*(_advert(kv, k) for k in keys)), strict=True))


async def _advert(kv: Any, key: str) -> names.Advert | None:
    try:
        entry = await kv.get(key)
    except NotFoundError:  # deleted since the stream info (a key's delete marker)
        return None
    return names.Advert.decode(entry.value or b"")


def replicas_for(nc: Any, replicas: int | None) -> int:
    """R3 when the client sees three servers (or more), fewer with fewer."""
    return replicas or min(3, max(1, len(nc.servers)))


async def setup(
    servers: Sequence[str], node: str, credentials: Credentials, replicas: int | None
) -> None:
    """`relay bridge --setup`: make node's NATS objects, then stop."""
    nc = await connect(servers, node, credentials, once=True)
    try:
        js = nc.jetstream(timeout=10)
        count = replicas_for(nc, replicas)
        _, sub = await ensure(js, node, count)
        await sub.unsubscribe()
        log.info("bridge %s: bucket, stream and consumer in place, R%d", node, count)
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(nc.close(), 2)


class Bridge:
    def __init__(
        self,
        client: Client,
        servers: Sequence[str],
        node: str,
        *,
        share: Sequence[str] = (),
        replicas: int | None = None,
        credentials: Credentials = Credentials(),
    ) -> None:
        self.client = client
        self.servers = list(servers)
        self.node = names.check_node(node)
        self.share = tuple(share)
        self.replicas = replicas
        self.credentials = credentials
        self.stopping = asyncio.Event()
        self.remote: dict[str, dict[str, str]] = {}  # node -> key -> subject
        self.lags: dict[str, int] = {}  # node -> messages its consumer has not acked
        self.where: dict[str, str] = {}  # remote endpoint subject -> its node

    async def run(self) -> None:
        self.nc = await connect(self.servers, self.node, self.credentials)
        self.js = self.nc.jetstream(timeout=10)
        replicas = replicas_for(self.nc, self.replicas)
        while True:
            try:
                self.kv, self.sub = await ensure(self.js, self.node, replicas)
                break
            except Exception as exc:  # no JetStream yet: no leader, a peer still starting
                log.warning(
                    "bridge %s: JetStream not ready (%r); trying again (a user that may not "
                    "create them needs the bucket, stream and consumer made by `relay "
                    "bridge --setup`)",
                    self.node,
                    exc,
                )
                await asyncio.sleep(1.0)
        log.info("bridge %s: connected to %s, R%d", self.node, self._server(), replicas)
        tasks = [
            asyncio.create_task(self._keep(loop))
            for loop in (
                self._advertise,
                self._directory,
                self._outbound,
                self._inbound,
                self._lag,
                self._signals_out,
                self._signals_in,
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

    async def _keep(self, loop: Callable[[], Awaitable[None]]) -> None:
        """Run one of the bridge's loops for as long as the bridge runs: one that raises
        is logged with its traceback and started again. Otherwise the bridge would run
        on half dead and quiet (an inbound loop gone leaves its node's messages waiting
        in JetStream, with nothing said; nats-py's fetch can raise asyncio's
        TimeoutError as well as its own)."""
        while True:
            try:
                await loop()
            except Exception:
                log.exception("bridge %s: %s failed; starting it again", self.node, loop.__name__)
                await asyncio.sleep(1.0)

    # ------------------------------------------------------------------ directory

    async def _advertise(self) -> None:
        mine: set[str] = set()
        while True:
            try:
                # a future, not a thread: a thread waiting on a router that is gone would
                # hold up the bridge's exit by the client's timeout
                status = await _result(self.client.send_request("status"))
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
        """The other nodes' endpoints, read from the bucket every ADVERTISE_S and handed
        to the router, each node's full list every time (a router that restarted or
        missed a call is repaired by the next). Read, not watched: a watch is a push
        consumer, which a node's NATS user may not create (names.permissions); a read
        costs one stream info and one direct get per key of another node."""
        while True:
            try:
                remote = await self._read_directory()
            except nats.errors.Error as exc:  # JetStream's API errors are nats errors too
                log.warning("bridge %s: reading the directory failed: %s", self.node, exc)
            else:
                gone = set(self.remote) - set(remote)  # told once, with no endpoint
                for node in gone:  # no endpoint left (or the node forgotten): no lag to show
                    self.lags.pop(node, None)
                self.remote = remote
                self.where = {s: n for n, ks in remote.items() for s in ks.values()}
                for node in sorted(gone | set(remote)):
                    await self._tell_router(node)
            await asyncio.sleep(names.ADVERTISE_S)

    async def _read_directory(self) -> dict[str, dict[str, str]]:
        remote: dict[str, dict[str, str]] = {}
        for key, advert in (await read_adverts(self.js, self.kv, names.KV_SUBJECTS)).items():
            node = key.split(".", 1)[0]
            if advert is not None and node != self.node:
                remote.setdefault(node, {})[key] = advert.subject
        return remote

    async def _tell_router(self, node: str) -> None:
        subjects = sorted(set(self.remote.get(node, {}).values()))
        try:
            await _result(
                self.client.send_request("remote_endpoints", node=node, subjects=subjects)
            )
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
                    body = json.dumps({"signal": signal.to_wire()}).encode()
                    await self.nc.publish(names.signal_subject(node, self.node, subject), body)
        finally:
            stop()

    async def _signals_in(self) -> None:
        """Signals other nodes sent for this host's endpoints, emitted here, marked so
        that they are never forwarded again."""
        queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=10_000)

        async def received(message: Any) -> None:
            _offer(queue, message)

        await self.nc.subscribe(names.signals_for(self.node), cb=received)
        while True:
            message = await queue.get()
            origin, subject = names.split_signal(message.subject)
            try:
                body = json.loads(message.data)
                signal = Signal.from_wire(body["signal"])
                data = {**(signal.data or {}), names.RELAYED_MARK: origin}
                # Not waiting for room: this is the event loop (a full queue drops it).
                self.client.signal(subject, replace(signal, data=data), wait=False, block=False)
            except (RelayError, ValueError, KeyError, TypeError) as exc:
                log.info("bridge %s: signal on %s dropped: %s", self.node, subject, exc)

    # ------------------------------------------------------------------ status

    def _server(self) -> str:
        url = self.nc.connected_url
        return _where(url.geturl()) if url else ""

    def _seen(self) -> dict[str, Any]:
        """What `relay status` shows of the cluster, sent with each relay_take."""
        return {
            "server": self._server(),
            "servers": sorted(_where(u.geturl()) for u in self.nc.servers),
            # a node forgotten meanwhile is not shown, whatever a lag query left behind
            "lag": {n: lag for n, lag in self.lags.items() if n == self.node or n in self.remote},
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
        """Take, publish, confirm, overlapped: the next ``relay_take`` is asked as soon
        as the last one's parts are handed to JetStream, and `_confirm` tells the router
        which parts have their PubAck, whatever take they came from. At most
        OUTBOUND_WINDOW parts are between take and confirmation."""
        window = _Window(names.OUTBOUND_WINDOW)
        acked: list[list[Any]] = []  # [token, node, error] of the parts JetStream answered
        answered = asyncio.Event()

        def landed(part: dict[str, Any], outcome: asyncio.Future) -> None:
            acked.append([part["token"], part["node"], _refusal(part, outcome)])
            answered.set()

        confirming = asyncio.create_task(self._confirm(acked, answered, window))
        try:
            while True:
                room = await window.room()
                try:
                    answer = await _result(
                        self.client.send_request(
                            "relay_take", node=self.node, limit=room, cluster=self._seen()
                        )
                    )
                except RelayError as exc:
                    log.warning("bridge %s: relay_take failed: %s", self.node, exc)
                    await asyncio.sleep(0.2)
                    continue
                parts = answer["parts"]
                if not parts:  # held a while, nothing came
                    continue
                window.take(len(parts))
                outcomes = [await self._publish(part) for part in parts]
                # one timer per take: a PubAck lost with its server is never answered
                asyncio.get_running_loop().call_later(
                    names.PUBLISH_TIMEOUT_S, _cancel_all, outcomes
                )
                for part, outcome in zip(parts, outcomes, strict=True):
                    outcome.add_done_callback(lambda done, part=part: landed(part, done))
        finally:
            confirming.cancel()

    async def _confirm(
        self, acked: list[list[Any]], answered: asyncio.Event, window: _Window
    ) -> None:
        """Answer the router with ``relayed`` for every part JetStream has answered, one
        request in flight: those answered meanwhile go together in the next."""
        while True:
            await answered.wait()
            answered.clear()
            confirmations = acked[:]
            acked.clear()
            try:
                await _result(self.client.send_request("relayed", parts=confirmations))
            except RelayError as exc:  # the publishes get `unavailable` at their deadline
                log.warning("bridge %s: relayed failed: %s", self.node, exc)
            window.give(len(confirmations))

    async def _publish(self, part: dict[str, Any]) -> asyncio.Future:
        """Hand one part to JetStream without waiting for it: the future holds its PubAck.
        Without a Nats-Msg-Id: JetStream drops a message whose id an earlier one in the
        stream named, and the far node's stream takes every node's parts, so another
        node could have this one dropped by naming its id first. A part is published
        once; the far router catches a second copy by (origin node, id)."""
        subject = names.outbound(part["node"], self.node)
        try:
            return await self.js.publish_async(subject, names.encode_part(part))
        except Exception as exc:  # not sent (disconnected, buffer full): not confirmed
            failed = asyncio.get_running_loop().create_future()
            failed.set_exception(exc)
            return failed

    # ------------------------------------------------------------------ inbound

    async def _inbound(self) -> None:
        """Fetch, ingest, settle, overlapped: the next fetch is asked while the last
        one's messages wait for their ingest answers, at most INBOUND_WINDOW (what
        JetStream lets the consumer hold) fetched and not yet settled."""
        window = _Window(names.INBOUND_WINDOW)
        delivering: set[asyncio.Task] = set()

        def settled(task: asyncio.Task) -> None:
            delivering.discard(task)
            window.give(1)

        try:
            while True:
                room = await window.room()
                try:
                    messages = await self.sub.fetch(min(room, FETCH_BATCH), timeout=FETCH_WAIT_S)
                except TimeoutError:  # nothing came: nats-py raises its own or,
                    continue  # when the server's answer comes at the deadline, asyncio's
                except nats.errors.Error as exc:
                    log.warning("bridge %s: fetch failed: %s", self.node, exc)
                    await asyncio.sleep(0.2)
                    continue
                window.take(len(messages))
                for message in messages:
                    task = asyncio.create_task(self._deliver(message))
                    delivering.add(task)
                    task.add_done_callback(settled)
        finally:
            for task in delivering:  # not acked: JetStream redelivers them
                task.cancel()

    async def _deliver(self, message: Any) -> None:
        """Ingest one stream message; ack it only on the router's answer (the copy is
        durable), nak what may pass later, term what never will."""
        origin = names.origin_of(message.subject)
        try:
            subjects, envelope = names.decode_part(message.data)
            result = await _result(self.client.ingest_async(envelope, subjects, node=origin))
            settle = names.settle_result(result)
            reasons = [reason for _, reason in result.rejected]
            if settle is not names.Settle.ACK or names.ID_CONFLICT in reasons:
                why = ", ".join(f"{reason} on {key}" for key, reason in result.rejected)
                level = logging.WARNING if names.ID_CONFLICT in reasons else logging.INFO
                log.log(
                    level,
                    "bridge %s: ingest of %s from %s: %s (%s)",
                    self.node,
                    envelope.id,
                    origin,
                    settle.value,
                    why,
                )
        except RelayError as exc:
            settle, reasons = names.settle_error(exc), [exc.code]
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
                await message.nak(delay=names.nak_delay(reasons))
            else:
                await message.term()
        except nats.errors.Error as exc:  # JetStream redelivers; ingest is idempotent
            log.warning("bridge %s: ack failed: %s", self.node, exc)


class _Window:
    """How many parts (or messages) a stage has in flight, at most ``size``."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.busy = 0
        self._room = asyncio.Event()
        self._room.set()

    async def room(self) -> int:
        """How many more may start, once at least one may."""
        await self._room.wait()
        return self.size - self.busy

    def take(self, n: int) -> None:
        self.busy += n
        if self.busy >= self.size:
            self._room.clear()

    def give(self, n: int) -> None:
        self.busy -= n
        if self.busy < self.size:
            self._room.set()


def _refusal(part: dict[str, Any], outcome: asyncio.Future) -> str | None:
    """None when JetStream has the part (its PubAck came), else why not."""
    if outcome.cancelled():
        why = f"no PubAck within {names.PUBLISH_TIMEOUT_S:g} s"
    elif (error := outcome.exception()) is not None:
        why = f"{error!r:.200}"
    else:
        return None
    return f"JetStream did not take it for node {part['node']}: {why}"


def _cancel_all(futures: list[asyncio.Future]) -> None:
    for future in futures:
        future.cancel()  # a no-op on one already answered


def serve(bridge: Bridge) -> None:
    """Run the bridge until SIGTERM or SIGINT."""
    import signal

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, bridge.stopping.set)
        await bridge.run()

    asyncio.run(main())
