"""Who is asking without a token: the uid behind a loopback connection (bearer tokens
are edges/tokens.py). Pure except `connection_owner` and `read_socket_tables`.

With no token configured (edges/tokens.py, `AuthFile.admit`), a request without one is
served only when it comes over loopback from the data directory's owner: the kernel
names the uid that owns the client's end of the connection. It is asked with one
sock_diag netlink request for that exact socket (about 25 us; what `ss` uses), else
read from /proc/net/tcp and tcp6 (about 17 ms a read on this machine:
bench/bench_http.py fell to 82 publishes/s with it on every request).
"""

from __future__ import annotations

import ipaddress
import socket
import struct
import sys
from collections.abc import Iterable, Mapping

# ---------------------------------------------------------------------- loopback peers


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def kernel_address(host: str, port: int) -> tuple[str, str]:
    """``host:port`` as /proc/net/tcp (IPv4) or tcp6 prints it: each 32-bit word of the
    address in the host's byte order, as 8 upper-case hex digits; the port as 4."""
    raw = ipaddress.ip_address(host).packed
    words = (int.from_bytes(raw[i : i + 4], sys.byteorder) for i in range(0, len(raw), 4))
    text = "".join(f"{w:08X}" for w in words) + f":{port:04X}"
    return ("tcp" if len(raw) == 4 else "tcp6"), text


def socket_owner(
    tables: Mapping[str, Iterable[str]], client: tuple[str, int], server: tuple[str, int]
) -> int | None:
    """The uid owning the client's end of a local TCP connection (client -> server),
    found in the kernel's socket tables ({"tcp": lines, "tcp6": lines}); None if absent."""
    table, local = kernel_address(*client)
    _, remote = kernel_address(*server)
    for line in tables.get(table, ()):
        fields = line.split()
        # sl local_address rem_address st tx:rx tr:when retrnsmt uid ...
        if len(fields) > 7 and fields[1] == local and fields[2] == remote:
            return int(fields[7]) if fields[7].isdigit() else None
    return None


# sock_diag (linux/sock_diag.h, linux/inet_diag.h)
NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 1
INET_DIAG_NOCOOKIE = 0xFFFFFFFF
TCP_ESTABLISHED = 1
_NLMSG_HEADER = struct.Struct("=IHHII")  # length, type, flags, seq, pid
_UID_OFFSET = 4 + 48 + 12  # family..retrans, inet_diag_sockid, expires/rqueue/wqueue


def diag_request(client: tuple[str, int], server: tuple[str, int]) -> bytes:
    """A sock_diag request for the one TCP socket whose local end is ``client`` and
    remote end ``server``: the client's end of a connection to us."""
    family = socket.AF_INET6 if ":" in client[0] else socket.AF_INET

    def address(host: str) -> bytes:
        return socket.inet_pton(family, host).ljust(16, b"\0")

    sockid = (
        struct.pack("!HH", client[1], server[1])
        + address(client[0])
        + address(server[0])
        + struct.pack("=III", 0, INET_DIAG_NOCOOKIE, INET_DIAG_NOCOOKIE)
    )
    body = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid
    header = _NLMSG_HEADER.pack(
        _NLMSG_HEADER.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 1, 0
    )
    return header + body


def diag_uid(reply: bytes, client: tuple[str, int], server: tuple[str, int]) -> int | None:
    """The uid in a sock_diag reply about the connection client -> server; None for an
    error reply (no such socket) or any other socket: the kernel's lookup falls back to
    a listening socket on the client's port when the connection is gone."""
    if len(reply) < _NLMSG_HEADER.size + _UID_OFFSET + 4:
        return None
    _, kind, _, _, _ = _NLMSG_HEADER.unpack_from(reply)
    if kind != SOCK_DIAG_BY_FAMILY:
        return None
    state = reply[_NLMSG_HEADER.size + 1]
    ports = struct.unpack_from("!HH", reply, _NLMSG_HEADER.size + 4)
    if state != TCP_ESTABLISHED or ports != (client[1], server[1]):
        return None
    return struct.unpack_from("=I", reply, _NLMSG_HEADER.size + _UID_OFFSET)[0]


def connection_owner(client: tuple[str, int], server: tuple[str, int]) -> int | None:
    """The uid owning the client's end of a local TCP connection to us."""
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as nl:
            nl.settimeout(1.0)
            nl.send(diag_request(client, server))
            return diag_uid(nl.recv(8192), client, server)
    except OSError:  # no netlink here (a sandbox): the slow way
        return socket_owner(read_socket_tables(), client, server)


def read_socket_tables() -> dict[str, list[str]]:
    tables = {}
    for name in ("tcp", "tcp6"):
        try:
            with open(f"/proc/net/{name}") as f:
                tables[name] = f.readlines()[1:]
        except OSError:
            tables[name] = []
    return tables
