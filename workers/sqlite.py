"""The one place SQLite connections are opened and transactions are run.

Every database Relay keeps (the per-shard message indexes, the control plane) is opened
through `open_db`, so they all share the same pragmas: WAL so that readers (the router,
the CLI) never block the writer; synchronous=NORMAL because the Maildir, fsynced by the
writer, is the truth and the index is rebuilt from it after a crash; a busy timeout so a
second process waits instead of failing.
"""

from __future__ import annotations

import contextlib
import os

import apsw

BUSY_TIMEOUT_MS = 5000


def open_db(path: str | os.PathLike[str], *, readonly: bool = False) -> apsw.Connection:
    """Open (creating if needed, mode 0600) a SQLite database with Relay's pragmas."""
    path = os.fspath(path)
    if readonly:
        flags = apsw.SQLITE_OPEN_READONLY
    else:
        flags = apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE
        if not os.path.exists(path):
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
    conn = apsw.Connection(path, flags=flags)
    conn.setbusytimeout(BUSY_TIMEOUT_MS)
    if not readonly:
        conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA foreign_keys=ON")
    return conn


class transaction:  # lower case: called as the function it replaced, ``with transaction(conn):``
    """BEGIN IMMEDIATE ... COMMIT, rolled back on any exception.

    IMMEDIATE takes the write lock up front, so a transaction never fails half-way
    with SQLITE_BUSY after it has started changing rows.

    A class, not a ``@contextlib.contextmanager``: a writer runs one for every group
    commit, and the generator form costs a generator and four Python calls more
    (docs/performance.md, "The writer's commit, function by function").
    """

    __slots__ = ("_conn",)

    def __init__(self, conn: apsw.Connection | apsw.Cursor) -> None:
        self._conn = conn  # a cursor too: its statements run in the connection's transaction

    def __enter__(self) -> apsw.Connection | apsw.Cursor:
        self._conn.execute("BEGIN IMMEDIATE")
        return self._conn

    def __exit__(self, exc_type: type[BaseException] | None, *_rest: object) -> None:
        self._conn.execute("COMMIT" if exc_type is None else "ROLLBACK")


def user_version(conn: apsw.Connection) -> int:
    return conn.execute("PRAGMA user_version").fetchone()[0]


def migrate(conn: apsw.Connection, migrations: list[str]) -> None:
    """Apply the migrations past the database's user_version, each in one transaction.

    ``migrations[i]`` upgrades a database from version i to version i+1; a list only
    ever grows, so an old database upgrades in place.
    """
    while user_version(conn) < len(migrations):
        with transaction(conn):
            # Read again under the write lock: another process may have migrated
            # between our check and our BEGIN IMMEDIATE.
            version = user_version(conn)
            if version < len(migrations):
                conn.execute(migrations[version])
                conn.execute(f"PRAGMA user_version={version + 1}")


def checkpoint_and_close(conn: apsw.Connection) -> None:
    """Fold the WAL into the database file and close, so a clean stop leaves one file."""
    with contextlib.suppress(apsw.Error):
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
