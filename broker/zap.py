"""The ZAP handler: libzmq asks it whether each new client connection may come in.

ZAP (ZeroMQ RFC 27) is a request/reply exchange over ``inproc://zeromq.zap.01``, inside
the router's own context. A socket with a ZAP domain sends one request per handshake:
for ipc:// the NULL mechanism with the peer's address, to which libzmq appends the
peer's ``:uid:gid:pid`` (SO_PEERCRED); for tcp:// the CURVE mechanism with the client's
long-term public key. The reply's user id ("uid:1000", "key:<z85>") is then attached by
libzmq to every message of that connection, which is how the router knows, per request,
whose credentials it came with (`message_user`).

The decision is `decide`, pure; `ZapHandler` is the thin socket edge around it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import zmq
from zmq.utils import z85

from broker.auth import AuthPolicy
from sdk.curve import server_certificate

log = logging.getLogger("relay.zap")

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
# One ZAP domain per transport, so a handshake is judged by where it came from: NULL
# (uid check) only on ipc://, CURVE only on tcp://.
IPC_DOMAIN, TCP_DOMAIN = b"relay-ipc", b"relay-tcp"
OK, REFUSED = b"200", b"400"


def secure(sock: zmq.Socket, address: str, keys: Path) -> None:
    """Put a client-facing socket under ZAP; on tcp:// also make it a CURVE server
    (its certificate is made in ``keys`` on first use). Call before bind."""
    if not address.startswith("tcp://"):
        sock.zap_domain = IPC_DOMAIN
    else:
        sock.zap_domain = TCP_DOMAIN
        public, secret = server_certificate(keys)
        sock.curve_server = True
        sock.curve_publickey = public
        sock.curve_secretkey = secret


def peer_uid(address: bytes) -> int | None:
    """The uid libzmq appended to an ipc peer's address (``host:uid:gid:pid``)."""
    parts = address.split(b":")
    if len(parts) < 4 or not parts[-3].isdigit():
        return None
    return int(parts[-3])


def decide(
    domain: bytes, mechanism: bytes, address: bytes, credentials: list[bytes], policy: AuthPolicy
) -> tuple[bytes, str, str]:
    """(status code, status text, user id) for one handshake."""
    if domain == TCP_DOMAIN and mechanism == b"CURVE" and credentials and len(credentials[0]) == 32:
        key = z85.encode(credentials[0]).decode()
        user = policy.admit_key(key)
        if user is None:
            return REFUSED, f"unknown CURVE key {key}", ""
        return OK, "OK", user
    if domain == IPC_DOMAIN and mechanism == b"NULL":
        uid = peer_uid(address)
        if uid is None:
            return REFUSED, "no peer credentials (only ipc:// peers may connect without a key)", ""
        user = policy.admit_uid(uid)
        if user is None:
            return REFUSED, f"uid {uid} is not in the allow-list", ""
        return OK, "OK", user
    mechanism_name, domain_name = (
        mechanism.decode(errors="replace"),
        domain.decode(errors="replace"),
    )
    return REFUSED, f"mechanism {mechanism_name} is not accepted in domain {domain_name}", ""


def message_user(frame: zmq.Frame) -> str | None:
    """The ZAP user id a connection was admitted with; None on sockets without ZAP."""
    try:
        return frame.get("User-Id")
    except zmq.ZMQError:
        return None


class ZapHandler:
    def __init__(self, ctx: zmq.Context, policy: Callable[[], AuthPolicy]) -> None:
        self.policy = policy
        self.socket = ctx.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(ZAP_ENDPOINT)

    def handle(self) -> None:
        """Answer every waiting request (non-blocking)."""
        while True:
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            # [routing id, b"", version, request id, domain, address, identity,
            #  mechanism, credentials...]
            if len(frames) < 8 or frames[1] != b"" or frames[2] != b"1.0":
                log.warning("malformed ZAP request dropped")
                continue
            domain, address, mechanism = frames[4], frames[5], frames[7]
            status, text, user = decide(domain, mechanism, address, frames[8:], self.policy())
            if status != OK:
                peer = address.decode(errors="replace")
                log.warning("connection from %s refused: %s", peer, text)
            self.socket.send_multipart(
                [frames[0], b"", b"1.0", frames[3], status, text.encode(), user.encode(), b""]
            )

    def close(self) -> None:
        self.socket.close(0)
