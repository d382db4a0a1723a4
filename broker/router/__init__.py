"""The router process: decides where every message goes; the writers do the I/O.

A publish is answered only when every writer involved has reported its copy durable
(or failed), so "delivered" in a PublishResult means fsynced and indexed. Work sent to
a writer that does not answer within `WRITER_DEADLINE_MS` is answered with an
``unavailable`` error instead of silence.

The package, from the socket inwards (docs/architecture.md draws it):

- `loop`: the sockets and the poll; the only module that sends or receives.
- `operations`: the table of client operations; `requests` decodes each into a typed
  request; `ops_publish`, `ops_consume`, `ops_admin`, `ops_query` carry them out.
- `writer_events`: what the writers' reports, arrivals and departures mean.
- The units, each owning its state: `delivery` (the ledger: queues, claims, credit),
  `consumers` (sessions and subscriptions), `jobs` (work the writers owe an answer
  for), `replies`, `directory` (endpoints), `settings` (config, rules, auth and their
  files), `indexes` (read-only queries), `signal_out`, `writer_links`.
- `context`: the units joined, as every operation and event sees them.
"""

# The compiled units, when built and current (sdk/compiled.py), before any is imported.
from sdk.compiled import search_path

__path__ = search_path(__name__, __path__)

from broker.router.jobs import WRITER_DEADLINE_MS
from broker.router.loop import Router, main
from broker.router.operations import ADMIN_OPS, OPERATIONS

__all__ = ["ADMIN_OPS", "OPERATIONS", "WRITER_DEADLINE_MS", "Router", "main"]
