"""Every operation a client may ask for (docs/protocol.md), in one table: the request
it decodes into, the function that carries it out, and whether it needs operator
rights ("admin" in auth.json)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from broker.router import ops_admin as admin
from broker.router import ops_consume as consume
from broker.router import ops_federation as federation
from broker.router import ops_publish as publish
from broker.router import ops_query as query
from broker.router import requests as rq


@dataclass(frozen=True)
class Operation:
    decode: Callable[[dict[str, Any]], Any]
    run: Callable[..., Any]  # (context, session, request, rid) -> result
    admin: bool = False


OPERATIONS: dict[str, Operation] = {
    # sessions and consuming
    "hello": Operation(rq.Hello.decode, consume.hello),
    "ping": Operation(rq.Hello.decode, consume.ping),
    "bye": Operation(rq.Empty.decode, consume.bye),
    "subscribe": Operation(rq.Subscribe.decode, consume.subscribe),
    "unsubscribe": Operation(rq.Unsubscribe.decode, consume.unsubscribe),
    "ack": Operation(rq.Finish.decode, consume.ack),
    "nack": Operation(rq.Finish.decode, consume.nack),
    "in_progress": Operation(rq.Finish.decode, consume.in_progress),
    "fetch": Operation(rq.Fetch.decode, consume.fetch),
    "complete": Operation(rq.Finish.decode, consume.complete, admin=True),
    "fail": Operation(rq.Finish.decode, consume.fail, admin=True),
    "requeue": Operation(rq.Finish.decode, consume.requeue, admin=True),
    # sending
    "publish": Operation(rq.Publish.decode, publish.publish),
    "signal": Operation(rq.SendSignal.decode, publish.signal),
    # federation: a bridge hands in a message from another node (docs/federation.md)
    "ingest": Operation(rq.Ingest.decode, federation.ingest),
    "relay_take": Operation(rq.RelayTake.decode, federation.relay_take, admin=True),
    "relayed": Operation(rq.Relayed.decode, federation.relayed, admin=True),
    "remote_endpoints": Operation(
        rq.RemoteEndpoints.decode, federation.remote_endpoints, admin=True
    ),
    # endpoints, rules, configuration, maintenance
    "register": Operation(rq.Register.decode, admin.register),
    "unregister": Operation(rq.SubjectOnly.decode, admin.unregister, admin=True),
    "add_rule": Operation(rq.AddRule.decode, admin.add_rule, admin=True),
    "remove_rule": Operation(rq.RemoveRule.decode, admin.remove_rule, admin=True),
    "set_config": Operation(rq.SetConfig.decode, admin.set_config, admin=True),
    "purge_dead_letters": Operation(rq.Purge.decode, admin.purge_dead_letters, admin=True),
    "requeue_dead_letters": Operation(
        rq.RequeueDeadLetters.decode, admin.requeue_dead_letters, admin=True
    ),
    "compact_remove": Operation(rq.CompactRemove.decode, admin.compact_remove, admin=True),
    "rebuild_index": Operation(rq.Empty.decode, admin.rebuild_index, admin=True),
    # reading
    "endpoints": Operation(rq.Empty.decode, query.endpoints),
    "list_rules": Operation(rq.Empty.decode, query.list_rules),
    "get_config": Operation(rq.Empty.decode, query.get_config),
    "status": Operation(rq.Empty.decode, query.status),
    "trace": Operation(rq.Trace.decode, query.trace),
    "dead_letters": Operation(rq.DeadLetters.decode, query.dead_letters),
    "pending": Operation(rq.PendingOf.decode, query.pending),
}

ADMIN_OPS = frozenset(name for name, op in OPERATIONS.items() if op.admin)
