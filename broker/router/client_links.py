"""The router's two public sockets: a ROUTER for clients (requests in; replies and pushed
messages out) and an XPUB for signals. Both are secured (broker/zap.py): an ipc://
socket file is the owner's only, unless auth.json admits other uids."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator

import zmq
from zmq.utils.monitor import parse_monitor_message

from broker.zap import message_user, secure
from sdk.paths import Home
from sdk.sockets import NOBLOCK, poll_item, recv_frames, send_parts, waiting

log = logging.getLogger("relay.router")

CLIENT_HWM = 100_000


class ClientLinks:
    def __init__(self, ctx: zmq.Context, home: Home, address: str, signals_address: str):
        self.address = address
        self.signals_address = signals_address
        self.clients = ctx.socket(zmq.ROUTER)
        self.clients.setsockopt(zmq.ROUTER_MANDATORY, 1)  # EHOSTUNREACH, never a silent drop
        self.clients.setsockopt(zmq.SNDHWM, CLIENT_HWM)
        self._clients_item = poll_item(self.clients)
        # A client whose ipc:// connection closes (its process killed, say) is gone at
        # once, not at its session timeout: the monitor names the closed descriptor, and
        # each client's first frame told which descriptor it came on. On tcp:// a
        # closed connection may be a blip the client reconnects through with its
        # session token: the session timeout decides there.
        self._watch_fds = address.startswith("ipc://")
        self.monitor = self.clients.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._fd_of: dict[bytes, int] = {}
        self._on_fd: dict[int, set[bytes]] = {}
        # XPUB: the router sees the topics subscribed to (broker/router/signal_out.py).
        self.signals = ctx.socket(zmq.XPUB)
        for sock, where in ((self.clients, address), (self.signals, signals_address)):
            sock.setsockopt(zmq.LINGER, 0)
            secure(sock, where, home.keys)

    def bind(self) -> list[str]:
        self.clients.bind(self.address)
        self.signals.bind(self.signals_address)
        return [self.address, self.signals_address]

    def requests(self, limit: int) -> Iterator[tuple[list[bytes], str | None]]:
        """What clients sent, frame lists with the ZAP user their connection was admitted
        as, until none waits or ``limit`` were read (called when the poll said one
        waits)."""
        for _ in range(limit):
            try:
                frames = recv_frames(self.clients)
            except zmq.Again:
                return
            identity = frames[0].bytes
            if self._watch_fds and identity not in self._fd_of and len(frames) > 1:
                self._remember_fd(identity, frames[1])
            yield [identity, *(f.bytes for f in frames[1:])], message_user(frames[0])
            if not waiting(self._clients_item):  # cheaper than a receive finding none
                return

    def _remember_fd(self, identity: bytes, frame: zmq.Frame) -> None:
        with contextlib.suppress(zmq.ZMQError):
            fd = frame.get(zmq.SRCFD)
            self._fd_of[identity] = fd
            self._on_fd.setdefault(fd, set()).add(identity)

    def gone(self) -> list[bytes]:
        """The clients whose connection just closed (read one monitor event)."""
        event = parse_monitor_message(self.monitor.recv_multipart())
        identities = self._on_fd.pop(event["value"], set())
        for identity in identities:
            self._fd_of.pop(identity, None)
        return sorted(identities)

    def send(self, identity: bytes, frames: list[bytes], *, copy: bool = True) -> bool | None:
        """True when sent; False when the client is not reading (EAGAIN: its queue is
        full; a slow client, not a gone one); None when it is gone (EHOSTUNREACH)."""
        # Zero-copy only for pushes, whose file bytes may be a megabyte; small frames
        # are cheaper copied.
        try:
            send_parts(self.clients, [identity, *frames], NOBLOCK, copy)
            return True
        except zmq.Again:
            log.info("client %s is not reading (its queue is full): not sent", identity.hex())
            return False
        except zmq.ZMQError as exc:
            log.info("client %s unreachable (%s): session ended", identity.hex(), exc)
            return None

    def rebind_signals(self) -> None:
        """Requests are checked one by one, but a SUB connection only at its handshake:
        drop every signal subscriber so each reconnects (libzmq does, by itself) through
        ZAP again. Signals are ephemeral; the others miss a few milliseconds of them."""
        self.signals.unbind(self.signals_address)
        old = os.umask(0o077)
        try:
            # libzmq closes the listener on its I/O thread: the address frees up within
            # milliseconds, not at once.
            for _ in range(200):
                try:
                    self.signals.bind(self.signals_address)
                    break
                except zmq.ZMQError as exc:
                    if exc.errno != zmq.EADDRINUSE:
                        raise
                    time.sleep(0.005)
            else:
                log.error("could not rebind %s: signals are down", self.signals_address)
                return
        finally:
            os.umask(old)
        log.info("signal subscribers dropped to re-check their credentials")

    def admit_other_uids(self, admitted: bool) -> None:
        """Other uids admitted: their connect(2) must reach ZAP, which is then the gate."""
        mode = 0o666 if admitted else 0o600
        for address in (self.address, self.signals_address):
            if address.startswith("ipc://"):
                with contextlib.suppress(OSError):
                    os.chmod(address[len("ipc://") :], mode)

    def close(self) -> None:
        self.clients.disable_monitor()
        self.monitor.close(0)
        self.clients.close(0)
        self.signals.close(0)
