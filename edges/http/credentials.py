"""Who is asking: bearer tokens as auth.json holds them, and the uid behind a loopback
connection. Pure except `read_socket_tables`.

Tokens. A token belongs to a CURVE key identity of auth.json, which keeps only its
SHA-256 (``"tokens": ["sha256:<hex>"]`` in the key's entry): the gateway acts for the
token's bearer by connecting to the router with that key, so the router judges every
request against that identity's sender and receive rights, as for any client.

Loopback. With no token configured, a request without one is served only when it comes
over loopback from the data directory's owner: the kernel's socket tables
(/proc/net/tcp, tcp6) name the uid that owns the client's end of the connection.
"""

from __future__ import annotations

import hashlib
import ipaddress
import secrets
import sys
from collections.abc import Iterable, Mapping
from typing import Any

TOKEN_PREFIX = "relay_"
HASH_PREFIX = "sha256:"


def new_token() -> str:
    """A fresh bearer token: 256 random bits, with a prefix that says what it is."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    """What auth.json keeps of a token (never the token itself)."""
    return HASH_PREFIX + hashlib.sha256(token.encode("utf-8")).hexdigest()


def tokens_by_hash(auth: Mapping[str, Any]) -> dict[str, str]:
    """token hash -> the public key (Z85) of the identity it belongs to, from a parsed
    auth.json (already validated by broker.auth.AuthPolicy.from_json)."""
    found: dict[str, str] = {}
    for public_key, entry in auth.get("keys", {}).items():
        for digest in entry.get("tokens", []):
            found[digest] = public_key
    return found


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, else None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


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


def read_socket_tables() -> dict[str, list[str]]:
    tables = {}
    for name in ("tcp", "tcp6"):
        try:
            with open(f"/proc/net/{name}") as f:
                tables[name] = f.readlines()[1:]
        except OSError:
            tables[name] = []
    return tables
