"""The message index's schema, its migrations, and the SQL of its reads and writes
(`MessageIndex`, workers/index.py), as constants: fixed texts, so that apsw's statement
cache serves them.

Table layout, measured (bench/bench_storage.py and a rowid variant of the same schema,
20,000 rows): WITHOUT ROWID with the primary key (id, endpoint) inserts as fast as a
rowid table (≈ 100,000 rows/s in transactions of 100, within noise) and pages through
``query(subject=...)`` about 30 % faster (≈ 270,000 vs 200,000 rows/s): each secondary
index carries (id, endpoint) as its tail, so ``subject = ? ORDER BY id, endpoint`` walks
one index without a sort, and the table itself is stored in id order. Ids are ULIDs
that grow with time, so the writer's inserts append at the right edge of the b-tree.
"""

# migrations[i] upgrades a database from version i to i+1 (workers.sqlite.migrate).
# Append only: a shipped entry never changes.
MIGRATIONS = [
    # v1: the messages table and the indexes its queries use.
    """
    CREATE TABLE messages (
        id          TEXT    NOT NULL,
        endpoint    TEXT    NOT NULL,
        subject     TEXT    NOT NULL,
        sender      TEXT    NOT NULL,
        state       TEXT    NOT NULL CHECK (state IN ('new', 'claimed', 'done', 'failed')),
        created_at  INTEGER NOT NULL,
        stored_at   INTEGER NOT NULL,
        claimed_at  INTEGER,
        finished_at INTEGER,
        reason      TEXT,
        reason_code TEXT,
        size        INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (id, endpoint)
    ) WITHOUT ROWID;
    -- backlog of one endpoint, count_new_by_endpoint, query(endpoint=...)
    CREATE INDEX messages_endpoint_state ON messages (endpoint, state);
    -- query(subject=...), metrics by subject
    CREATE INDEX messages_subject ON messages (subject);
    -- count_publishes: the rate limiter's window, seeded at router start
    CREATE INDEX messages_sender_created ON messages (sender, created_at);
    -- delete_finished_before (compaction), metrics by state
    CREATE INDEX messages_state_finished ON messages (state, finished_at);
    """,
    # v2: what a reply answers (the envelope's parentId) and how many times a copy was
    # handed to a consumer (its file name's N=, docs/architecture.md). No file had a
    # parentId before; a file in cur/ then had no N=, so it was handed out once.
    """
    ALTER TABLE messages ADD COLUMN parent_id TEXT;
    ALTER TABLE messages ADD COLUMN deliveries INTEGER NOT NULL DEFAULT 0;
    UPDATE messages SET deliveries = 1 WHERE state IN ('claimed', 'done');
    """,
    # v3: the replies of a message (trace, the console's conversation view); only
    # replies have a parent, so the index holds only their rows.
    """
    CREATE INDEX messages_parent ON messages (parent_id) WHERE parent_id IS NOT NULL;
    """,
]
SCHEMA_VERSION = len(MIGRATIONS)

COLUMNS = (
    "id",
    "endpoint",
    "subject",
    "sender",
    "state",
    "created_at",
    "stored_at",
    "claimed_at",
    "finished_at",
    "reason",
    "reason_code",
    "size",
    "parent_id",
    "deliveries",
)
SELECT_ROWS = f"SELECT {', '.join(COLUMNS)} FROM messages"

INSERT = (
    f"INSERT OR REPLACE INTO messages ({', '.join(COLUMNS)}) "
    f"VALUES ({', '.join('?' * len(COLUMNS))})"
)
LOAD = INSERT.replace("INSERT OR REPLACE", "INSERT")  # into an emptied table
CLAIM = (
    "UPDATE messages SET state = 'claimed', claimed_at = ?, deliveries = ? "
    "WHERE id = ? AND endpoint = ?"
)
DONE = "UPDATE messages SET state = 'done', finished_at = ? WHERE id = ? AND endpoint = ?"
# A failed row keeps its claim time: the dead letter of a claimed message keeps it too
# (deadLetter.claimedAt in failed/<id>, docs/architecture.md), and one failed from new/
# had none (a requeue clears it); it keeps the hand-outs its deadLetter records. So the
# rebuilt index equals this one.
FAIL = (
    "UPDATE messages SET state = 'failed', finished_at = ?, reason = ?, reason_code = ?, "
    "deliveries = ? WHERE id = ? AND endpoint = ?"
)
FAIL_SIZED = (
    "UPDATE messages SET state = 'failed', finished_at = ?, reason = ?, reason_code = ?, "
    "deliveries = ?, size = ? WHERE id = ? AND endpoint = ?"
)
# Back in new/, a copy counts no hand-out (workers.filenames.deliveries_of).
REQUEUE = (
    "UPDATE messages SET state = 'new', claimed_at = NULL, deliveries = 0 "
    "WHERE id = ? AND endpoint = ?"
)
DELETE = "DELETE FROM messages WHERE id = ? AND endpoint = ?"
DELETE_ALL = "DELETE FROM messages"
LIST_INDEXES = (
    "SELECT name, sql FROM sqlite_schema "
    "WHERE type = 'index' AND tbl_name = 'messages' AND sql IS NOT NULL ORDER BY name"
)
GET = f"{SELECT_ROWS} WHERE id = ? ORDER BY endpoint"
HAS = "SELECT 1 FROM messages WHERE id = ? AND endpoint = ?"
REPLIES = f"{SELECT_ROWS} WHERE parent_id = ? ORDER BY id, endpoint LIMIT ?"
ALL = f"{SELECT_ROWS} ORDER BY id, endpoint"
COUNT_NEW_BY_ENDPOINT = (
    "SELECT endpoint, count(*) FROM messages WHERE state = 'new' GROUP BY endpoint"
)
# One count per publish: fan-out copies share the id; dead letters are not publishes
# the sender got through (docs/design.md, "Mistakes not to repeat": the old limiter counted both).
# A publish counts toward its sender's rate limit when it stored a copy in some new/:
# any row but a dead letter made at publish time (later consumer failures still count).
_COUNTED = (
    "(state != 'failed' OR reason_code NOT IN ('no_match', 'access_denied', 'hop_limit', "
    "'cycle_detected', 'ttl_expired', 'budget_exhausted'))"
)
COUNT_PUBLISHES = (
    f"SELECT count(DISTINCT id) FROM messages WHERE sender = ? AND created_at >= ? AND {_COUNTED}"
)
RECENT_PUBLISHES = (
    "SELECT id, sender, min(created_at) FROM messages "
    f"WHERE created_at >= ? AND {_COUNTED} GROUP BY id"
)
COUNT_ALL = "SELECT count(*) FROM messages"
COUNT_BY_STATE = "SELECT state, count(*) FROM messages GROUP BY state"
COUNT_BY_SUBJECT = "SELECT subject, count(*) FROM messages GROUP BY subject"
# ops: keyset pages in primary-key order (compaction's candidates, the metrics' scan).
# "+state" keeps SQLite off messages_state_finished: through it, every page would sort
# all candidates again (a temp b-tree per page); the primary-key walk stops at LIMIT.
LOOKUP = f"{SELECT_ROWS} WHERE id = ? AND endpoint = ?"
PAGE = f"{SELECT_ROWS} WHERE (id, endpoint) > (?, ?) ORDER BY id, endpoint LIMIT ?"
FINISHED_PAGE = (
    f"{SELECT_ROWS} WHERE ((+state = 'done' AND finished_at < ?) OR "
    "(+state = 'failed' AND finished_at < ?)) AND (id, endpoint) > (?, ?) "
    "ORDER BY id, endpoint LIMIT ?"
)

# Filters of `query`, each a fixed fragment: every combination is a constant SQL text,
# so apsw's statement cache serves repeated queries.
QUERY_FILTERS = (
    ("subject", "subject = ?"),
    ("endpoint", "endpoint = ?"),
    ("sender", "sender = ?"),
    ("state", "state = ?"),
    ("since", "created_at >= ?"),
    ("until", "created_at < ?"),
)
