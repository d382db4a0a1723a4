"""CURVE key files for tcp:// connections (ZeroMQ's certificate format, ZMQ RFC 32 keys).

A certificate is a pair of text files made by `relay auth add-key` (or
``zmq.auth.create_certificates``): ``NAME.key`` holds the public key, ``NAME.key_secret``
both keys, 0600. A client needs its own ``.key_secret`` and the broker's public key
(``<home>/keys/server.key``, or its 40-character Z85 text).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import zmq
import zmq.auth

from sdk.errors import InvalidConfig

Z85_KEY_LENGTH = 40


class CurveKeys(NamedTuple):
    """What a client socket needs to talk CURVE to the broker."""

    public: bytes
    secret: bytes
    server: bytes

    def apply(self, sock: zmq.Socket) -> None:
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret
        sock.curve_serverkey = self.server


def load_secret(path: str | os.PathLike[str]) -> tuple[bytes, bytes]:
    """(public, secret) from a ``.key_secret`` certificate."""
    try:
        public, secret = zmq.auth.load_certificate(os.fspath(path))
    except (OSError, ValueError) as exc:
        raise InvalidConfig(f"cannot read the CURVE certificate {path}: {exc}") from None
    if secret is None:
        raise InvalidConfig(f"{path} holds no secret key (use the .key_secret file)")
    return public, secret


def load_public(value: str | os.PathLike[str]) -> bytes:
    """A public key given as its Z85 text or as the path of a certificate file."""
    text = os.fspath(value)
    if len(text) == Z85_KEY_LENGTH and not Path(text).exists():
        return text.encode()
    try:
        public, _ = zmq.auth.load_certificate(text)
    except (OSError, ValueError) as exc:
        raise InvalidConfig(f"cannot read the CURVE public key {text}: {exc}") from None
    return public


def client_keys(key_file: str | os.PathLike[str], server_key: str | os.PathLike[str]) -> CurveKeys:
    public, secret = load_secret(key_file)
    return CurveKeys(public, secret, load_public(server_key))


def create_certificate(directory: Path, name: str) -> tuple[Path, Path]:
    """Make ``directory/NAME.key`` and ``NAME.key_secret`` (0600; directory 0700)."""
    old = os.umask(0o077)
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        public, secret = zmq.auth.create_certificates(os.fspath(directory), name)
    finally:
        os.umask(old)
    return Path(public), Path(secret)


def server_certificate(directory: Path) -> tuple[bytes, bytes]:
    """The broker's (public, secret) keys, made on first use in ``directory``."""
    secret_file = directory / "server.key_secret"
    if not secret_file.exists():
        create_certificate(directory, "server")
    return load_secret(secret_file)
