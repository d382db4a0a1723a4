"""The data directory's layout, in one place (docs/architecture.md, "Files on disk").

``$RELAY_HOME`` (default ``~/.dork/relay``) is created with mode 0700; everything
below it is private to the user that runs the broker.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

DEFAULT_HOME = "~/.dork/relay"
UNROUTABLE = "_unroutable"  # mailbox of publishes that matched no endpoint (shard 0)


def shard_of(endpoint: str, shards: int) -> int:
    """Which shard owns a mailbox. The layout on disk does not depend on N."""
    if endpoint == UNROUTABLE:
        return 0
    return int(endpoint, 16) % shards


def is_mailbox_name(name: str) -> bool:
    if name == UNROUTABLE:
        return True
    return len(name) == 12 and all(c in "0123456789abcdef" for c in name)


def default_home() -> Path:
    return Path(os.environ.get("RELAY_HOME") or DEFAULT_HOME).expanduser()


def write_private(path: Path, text: str) -> None:
    """Write ``path`` whole, atomically, mode 0600 (the umask can only narrow it).

    Through a temporary file renamed into place: a reader (the router's inotify sees
    MOVED_TO) never finds it half-written, and a file left by an earlier run is
    replaced, mode and all, not rewritten in place with the mode it had. The temporary
    name is the writer's own, so two writers never share one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


class Home:
    """Paths and socket addresses under one data directory."""

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = Path(root).expanduser() if root is not None else default_home()

    def __repr__(self) -> str:
        return f"Home({str(self.root)!r})"

    def create(self) -> Home:
        """Create the data directory tree (0700), idempotent."""
        old = os.umask(0o077)
        try:
            for path in (self.root, self.run, self.mailboxes):
                path.mkdir(mode=0o700, parents=True, exist_ok=True)
                os.chmod(path, 0o700)
        finally:
            os.umask(old)
        return self

    @property
    def owner_uid(self) -> int:
        """The uid that owns the data directory: the broker's user."""
        return self.root.stat().st_uid

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def mailboxes(self) -> Path:
        return self.root / "mailboxes"

    @property
    def control_db(self) -> Path:
        return self.root / "control.db"

    @property
    def access_rules_file(self) -> Path:
        return self.root / "access-rules.json"

    @property
    def config_file(self) -> Path:
        return self.root / "config.json"

    @property
    def auth_file(self) -> Path:
        return self.root / "auth.json"

    @property
    def keys(self) -> Path:
        """CURVE certificates: the broker's (server.key, server.key_secret) and clients'."""
        return self.root / "keys"

    @property
    def server_public_key_file(self) -> Path:
        return self.keys / "server.key"

    @property
    def archive(self) -> Path:
        return self.root / "archive"

    def index_db(self, shard: int) -> Path:
        return self.root / f"index-{shard}.db"

    def mailbox(self, endpoint_hash: str) -> Path:
        return self.mailboxes / endpoint_hash

    # ZeroMQ addresses. ipc:// paths are limited to ~107 bytes by the kernel
    # (sun_path); `relay router --address tcp://...` is the way out for deep homes.
    @property
    def router_address(self) -> str:
        return f"ipc://{self.run / 'router.sock'}"

    @property
    def signals_address(self) -> str:
        return f"ipc://{self.run / 'signals.sock'}"

    @property
    def results_address(self) -> str:
        return f"ipc://{self.run / 'results.sock'}"

    def shard_address(self, shard: int) -> str:
        return f"ipc://{self.run / f'shard-{shard}.sock'}"
