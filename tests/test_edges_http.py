"""The HTTP + SSE gateway (edges/http) against a real broker: REST, streams, auth, errors.

Each test gets its own broker (data directory, sockets) and gateway (free port)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from broker.auth import AuthPolicy
from edges.http.app import build_app
from edges.http.credentials import (
    connection_owner,
    kernel_address,
    read_socket_tables,
    socket_owner,
)
from edges.http.errors import STATUS_BY_CODE, HttpError
from edges.http.gateway import Gateway, Peer
from edges.http.guard import allowed_hosts, refusal
from edges.http.listener import retry_delay
from edges.http.openapi import document
from edges.http.sse import CUT, ObserverHub, message_event
from edges.http.streams import Stream
from edges.tokens import TokenBook
from sdk import edge_state
from sdk.client import connect
from sdk.edge_state import EdgeState
from sdk.errors import ERROR_CLASSES, InvalidConfig, RelayError
from sdk.ids import new_id
from sdk.paths import Home
from sdk.types import Envelope, Signal, SignalType, default_budget
from tests.edges_harness import VALIDATED, EventReader, RunningGateway
from tests.harness import ROOT, Broker, free_port, wait_for

pytestmark = pytest.mark.integration

DEMO = "relay.agent.demo.backend"
SENDER = "relay.agent.demo.frontend"


@pytest.fixture
def gw(broker: Broker) -> Iterator[RunningGateway]:
    with RunningGateway(broker, keepalive=0.3) as running:
        yield running


def register(gw: RunningGateway, subject: str = DEMO) -> dict:
    response = gw.http.post("/api/endpoints", json={"subject": subject})
    assert response.status_code == 201, response.text
    return response.json()


def publish(gw: RunningGateway, payload: object, subject: str = DEMO, **extra: object) -> dict:
    response = gw.http.post(
        "/api/publish", json={"subject": subject, "from": SENDER, "payload": payload, **extra}
    )
    assert response.status_code == 200, response.text
    return response.json()


def copy_state(gw: RunningGateway, message_id: str) -> str | None:
    copies = gw.http.get(f"/api/trace/{message_id}").json()["copies"]
    return copies[0]["state"] if copies else None


# ---------------------------------------------------------------------- REST


def test_publish_over_http_stores_the_message_and_trace_finds_it(gw: RunningGateway) -> None:
    info = register(gw)
    result = publish(gw, {"content": "hello"})
    assert result["deliveredTo"] == 1 and result["rejected"] == []
    trace = gw.http.get(f"/api/trace/{result['messageId']}").json()
    assert [(c["endpoint"], c["state"]) for c in trace["copies"]] == [(info["hash"], "new")]


def test_endpoints_show_depth_pressure_and_breaker(gw: RunningGateway) -> None:
    register(gw)
    publish(gw, "one")
    endpoints = gw.http.get("/api/endpoints").json()["endpoints"]
    (demo,) = [e for e in endpoints if e["subject"] == DEMO]
    assert demo["depth"] == 1
    assert demo["pressure"] > 0
    assert demo["breaker"]["state"] == "closed"


def test_unregister_removes_the_endpoint_and_keeps_its_mail(gw: RunningGateway) -> None:
    info = register(gw)
    message_id = publish(gw, "kept")["messageId"]
    assert gw.http.delete(f"/api/endpoints/{DEMO}").json() == {"removed": True}
    subjects = [e["subject"] for e in gw.http.get("/api/endpoints").json()["endpoints"]]
    assert DEMO not in subjects
    assert any(
        c["endpoint"] == info["hash"]
        for c in gw.http.get(f"/api/trace/{message_id}").json()["copies"]
    )


def test_inbox_holds_messages_until_ack_or_nack(gw: RunningGateway) -> None:
    info = register(gw)
    first = publish(gw, "first")["messageId"]
    second = publish(gw, "second")["messageId"]

    def both() -> list:
        held = gw.http.get(f"/api/endpoints/{DEMO}/inbox", params={"wait": 5}).json()["messages"]
        return held if len(held) == 2 else []

    held = wait_for(both, what="both messages in the inbox")
    assert [m["id"] for m in held] == [first, second]
    assert held[0]["payload"] == "first" and held[0]["from"] == SENDER
    assert [(m["endpoint"], m["deliveries"]) for m in held] == [(info["hash"], 1)] * 2
    # Read again: still held, since not answered.
    again = gw.http.get(f"/api/endpoints/{DEMO}/inbox").json()["messages"]
    assert [m["id"] for m in again] == [first, second]
    assert copy_state(gw, first) == "claimed"

    acked = gw.http.post(f"/api/messages/{first}/ack")
    assert acked.status_code == 200, acked.text
    assert acked.json() == {
        "id": first,
        "endpoint": info["hash"],
        "answer": "ack",
        "state": "done",
        "deliveries": 1,
    }
    assert copy_state(gw, first) == "done"  # confirmed: no waiting for it to land
    nacked = gw.http.post(f"/api/messages/{second}/nack", json={"reason": "cannot parse"})
    assert nacked.status_code == 200, nacked.text
    assert (nacked.json()["state"], nacked.json()["reason"]) == ("failed", "cannot parse")
    assert copy_state(gw, second) == "failed"
    letters = gw.http.get("/api/dead-letters").json()["items"]
    assert [(d["id"], d["code"], d["reason"]) for d in letters] == [
        (second, "nack", "cannot parse")
    ]
    assert gw.http.get(f"/api/endpoints/{DEMO}/inbox").json()["messages"] == []


def test_the_ack_deadline_gives_an_unanswered_message_to_the_next_reader(
    broker: Broker,
) -> None:
    """Given a gateway whose ack deadline is 0.5 s, when an HTTP client reads a message
    and never answers, then it goes to the next consumer, handed out a second time, and
    the gateway no longer holds it."""
    with RunningGateway(broker, ack_wait=0.5) as gw:
        register(gw)
        message_id = publish(gw, "read, then silence")["messageId"]
        (held,) = gw.http.get(f"/api/endpoints/{DEMO}/inbox").json()["messages"]
        assert (held["id"], held["deliveries"]) == (message_id, 1)
        (again,) = broker.client().fetch(DEMO, wait=10)
        assert (again.id, again.deliveries) == (message_id, 2)
        assert gw.http.get(f"/api/endpoints/{DEMO}/inbox").json()["messages"] == []
        late = gw.http.post(f"/api/messages/{message_id}/ack")
        assert late.status_code == 404, late.text
        assert "ack deadline" in late.json()["error"]["message"]
        again.ack()


def test_messages_held_when_the_gateway_stops_go_to_the_next_reader(broker: Broker) -> None:
    with RunningGateway(broker) as gw:
        register(gw)
        message_id = publish(gw, "held at the stop")["messageId"]
        assert len(gw.http.get(f"/api/endpoints/{DEMO}/inbox").json()["messages"]) == 1
    (again,) = broker.client().fetch(DEMO, wait=10)
    assert (again.id, again.deliveries) == (message_id, 2)


def test_an_inbox_read_claims_no_more_than_it_asks_for(gw: RunningGateway) -> None:
    register(gw)
    ids = [publish(gw, n)["messageId"] for n in range(3)]
    held = gw.http.get(f"/api/endpoints/{DEMO}/inbox", params={"limit": 1, "wait": 5}).json()
    assert [m["id"] for m in held["messages"]] == ids[:1]
    assert [copy_state(gw, i) for i in ids] == ["claimed", "new", "new"]
    # What the HTTP reader did not ask for goes to another consumer.
    got: list[str] = []
    gw.broker.client().subscribe(DEMO, lambda envelope: got.append(envelope.id))
    wait_for(lambda: sorted(got) == ids[1:], what="the SDK consumer to get the other two")


def test_ack_of_a_message_not_held_is_message_not_found(gw: RunningGateway) -> None:
    register(gw)
    message_id = publish(gw, "never read")["messageId"]
    response = gw.http.post(f"/api/messages/{message_id}/ack")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "message_not_found"


def test_registering_answers_201_when_made_and_200_when_it_was_there(gw: RunningGateway) -> None:
    made = gw.http.post("/api/endpoints", json={"subject": DEMO})
    again = gw.http.post("/api/endpoints", json={"subject": DEMO})
    assert (made.status_code, again.status_code) == (201, 200), again.text
    assert made.json() == again.json()
    assert "created" not in made.json()  # the status code says it


def test_trace_of_an_unknown_id_is_404_message_not_found(gw: RunningGateway) -> None:
    response = gw.http.get(f"/api/trace/{new_id()}")
    assert response.status_code == 404, response.text
    assert response.json()["error"]["code"] == "message_not_found"


def test_ack_and_nack_of_an_unknown_id_are_404_message_not_found(gw: RunningGateway) -> None:
    for answer in ("ack", "nack"):
        response = gw.http.post(f"/api/messages/{new_id()}/{answer}", json={})
        assert response.status_code == 404, response.text
        assert response.json()["error"]["code"] == "message_not_found"


def test_inbox_of_an_unregistered_endpoint_is_endpoint_not_found(gw: RunningGateway) -> None:
    response = gw.http.get("/api/endpoints/relay.agent.nobody/inbox")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "endpoint_not_found"


PUB = "/api/publish"


def pub(**fields: object) -> dict:
    return {"subject": DEMO, "from": SENDER, "payload": 1, **fields}


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "code"),
    [
        ("post", PUB, pub(subject="bad..subject"), 400, "invalid_subject"),
        ("post", PUB, {"subject": DEMO, "from": SENDER}, 400, "invalid_message"),
        ("post", PUB, pub(**{"from": 7}), 400, "invalid_message"),
        ("post", PUB, "not json", 400, "invalid_message"),
        ("post", PUB, pub(payload="x" * 1_100_000), 413, "payload_too_large"),
        ("post", "/api/rules", {"from": "a.>", "to": "b", "action": "maybe"}, 400,
         "invalid_message"),
        ("get", "/api/trace/not-an-id", None, 400, "invalid_message"),
        ("get", "/api/stream?pattern=a.>.b", None, 400, "invalid_subject"),
        ("get", "/api/stream?mode=sideways", None, 400, "invalid_message"),
        ("get", "/api/dead-letters?limit=0", None, 400, "invalid_message"),
        ("get", "/api/nowhere", None, 404, "not_found"),
        ("put", PUB, None, 405, "unknown_operation"),
    ],
    ids=[
        "bad-subject", "no-payload", "sender-not-a-string", "body-not-json", "payload-too-large",
        "bad-rule", "bad-id", "bad-pattern", "bad-mode", "bad-limit", "no-route", "bad-method",
    ],
)  # fmt: skip
def test_bad_input_gets_the_protocol_error_code_and_a_fitting_status(
    gw: RunningGateway, method: str, path: str, body: object, status: int, code: str
) -> None:
    register(gw)
    if isinstance(body, str):
        response = gw.http.request(method, path, content=body)
    else:
        response = gw.http.request(method, path, json=body)
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code
    assert response.json()["error"]["message"]


def test_a_body_over_16_mib_is_refused_before_it_is_read(gw: RunningGateway) -> None:
    response = gw.http.post("/api/publish", content=b" " * (16 * 1024 * 1024 + 1))
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "payload_too_large"


def test_every_relay_error_code_has_an_http_status() -> None:
    assert set(ERROR_CLASSES) <= set(STATUS_BY_CODE)


def test_dead_letters_are_listed_republished_and_purged(gw: RunningGateway) -> None:
    info = register(gw)
    message_id = publish(gw, {"content": "doomed"})["messageId"]
    held = gw.http.get(f"/api/endpoints/{DEMO}/inbox", params={"wait": 5}).json()["messages"]
    assert [m["id"] for m in held] == [message_id]
    gw.http.post(f"/api/messages/{message_id}/nack", json={"reason": "boom"})
    letters = wait_for(
        lambda: gw.http.get("/api/dead-letters", params={"endpoint": info["hash"]}).json()["items"],
        what="the dead letter",
    )
    republished = gw.http.post(f"/api/dead-letters/{message_id}/republish", json={})
    assert republished.status_code == 200, republished.text
    new_id = republished.json()["result"]["messageId"]
    assert new_id != message_id and republished.json()["result"]["deliveredTo"] == 1
    assert letters[0]["id"] == message_id
    purged = gw.http.delete("/api/dead-letters", params={"endpoint": info["hash"]})
    assert purged.json() == {"purged": 1}
    assert gw.http.get("/api/dead-letters").json()["items"] == []


def test_a_republished_dead_letter_is_marked_with_the_dead_letters_id(gw: RunningGateway) -> None:
    register(gw)
    message_id = publish(gw, {"content": "again"})["messageId"]
    held = gw.http.get(f"/api/endpoints/{DEMO}/inbox", params={"wait": 5}).json()["messages"]
    assert [m["id"] for m in held] == [message_id]
    gw.http.post(f"/api/messages/{message_id}/nack", json={"reason": "boom"})
    wait_for(lambda: gw.http.get("/api/dead-letters").json()["items"], what="the dead letter")
    answer = gw.http.post(f"/api/dead-letters/{message_id}/republish", json={}).json()
    assert answer["subject"] == DEMO
    new_id = answer["result"]["messageId"]
    (copy,) = gw.http.get(f"/api/endpoints/{DEMO}/inbox", params={"wait": 5}).json()["messages"]
    assert copy["id"] == new_id and copy["payload"] == {"content": "again"}
    assert copy["republishedFrom"] == message_id


def nacked_over_http(gw: RunningGateway, count: int = 1, **extra: object) -> list[str]:
    """``count`` messages published, taken from the inbox and nacked: dead letters."""
    ids = [publish(gw, {"n": n}, **extra)["messageId"] for n in range(count)]
    held: list[dict] = []
    while len(held) < count:
        params = {"wait": 5, "limit": count}
        held += gw.http.get(f"/api/endpoints/{DEMO}/inbox", params=params).json()["messages"]
    for message in held:
        gw.http.post(f"/api/messages/{message['id']}/nack", json={"reason": "boom"})
    wait_for(
        lambda: set(ids) <= {d["id"] for d in gw.http.get("/api/dead-letters").json()["items"]},
        what="the dead letters",
    )
    return ids


def test_a_nacked_message_requeued_over_http_reaches_a_consumer_under_its_own_id(
    gw: RunningGateway,
) -> None:
    info = register(gw)
    (message_id,) = nacked_over_http(gw)

    answer = gw.http.post(f"/api/dead-letters/{message_id}/requeue", json={})

    assert answer.status_code == 200, answer.text
    assert answer.json()["requeued"] == [{"id": message_id, "endpoint": info["hash"]}]
    assert gw.http.get("/api/dead-letters").json()["items"] == []
    assert copy_state(gw, message_id) == "new"
    (copy,) = gw.http.get(f"/api/endpoints/{DEMO}/inbox", params={"wait": 5}).json()["messages"]
    assert copy["id"] == message_id and copy["payload"] == {"n": 0}
    assert copy["deliveries"] == 1
    again = gw.http.post(f"/api/dead-letters/{message_id}/requeue", json={})
    assert again.status_code == 404 and again.json()["error"]["code"] == "message_not_found"


def test_requeue_over_http_refuses_an_expired_dead_letter_and_pages_an_endpoints(
    gw: RunningGateway,
) -> None:
    register(gw)
    ttl = int(time.time() * 1000) + 1500
    budget = {**default_budget(0).to_wire(), "ttl": ttl}
    (expired,) = nacked_over_http(gw, budget=budget)
    wait_for(lambda: time.time() * 1000 > ttl + 50, what="the message's TTL to pass")
    refused = gw.http.post(f"/api/dead-letters/{expired}/requeue", json={})
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["code"] == "ttl_expired"

    living = nacked_over_http(gw, count=2)  # after the expired one, in id order
    page = gw.http.post("/api/dead-letters/requeue", params={"endpoint": DEMO, "limit": 2})
    assert page.status_code == 200, page.text
    first = page.json()
    assert [r["id"] for r in first["refused"]] == [expired]
    assert first["refused"][0]["code"] == "ttl_expired"
    assert len(first["requeued"]) == 1 and first["more"] is True
    params = {"endpoint": DEMO, "after": first["after"]}
    rest = gw.http.post("/api/dead-letters/requeue", params=params).json()
    requeued = [r["id"] for r in first["requeued"] + rest["requeued"]]
    assert requeued == living and rest["more"] is False
    assert [d["id"] for d in gw.http.get("/api/dead-letters").json()["items"]] == [expired]


def test_an_unroutable_dead_letter_is_republished_to_the_subject_it_was_sent_to(
    gw: RunningGateway,
) -> None:
    lost = publish(gw, {"content": "too early"})  # DEMO is not registered yet
    assert lost["deliveredTo"] == 0 and lost["rejected"] == [["*", "no_match"]]
    (letter,) = gw.http.get("/api/dead-letters", params={"endpoint": "_unroutable"}).json()["items"]
    assert letter["endpointSubject"] is None and letter["subject"] == DEMO
    register(gw)
    answer = gw.http.post(f"/api/dead-letters/{lost['messageId']}/republish", json={})
    assert answer.status_code == 200, answer.text
    assert answer.json()["subject"] == DEMO and answer.json()["result"]["deliveredTo"] == 1
    (copy,) = gw.http.get(f"/api/endpoints/{DEMO}/inbox", params={"wait": 5}).json()["messages"]
    assert copy["republishedFrom"] == lost["messageId"]


def test_rules_and_config_round_trip(gw: RunningGateway) -> None:
    rule = {"from": "relay.agent.x.>", "to": DEMO, "action": "deny", "priority": 5}
    assert gw.http.post("/api/rules", json=rule).status_code == 201
    assert rule in gw.http.get("/api/rules").json()["rules"]
    removed = gw.http.delete("/api/rules", params={"from": rule["from"], "to": rule["to"]})
    assert removed.json() == {"removed": True}
    config = gw.http.patch("/api/config", json={"rateLimit": {"maxPerWindow": 250}})
    assert config.status_code == 200, config.text
    assert gw.http.get("/api/config").json()["rateLimit"]["maxPerWindow"] == 250


def test_status_names_the_router_and_its_writers(gw: RunningGateway) -> None:
    status = gw.http.get("/api/status").json()
    assert status["router"]["pid"] == gw.broker.procs["router"].pid
    assert len(status["writers"]) == 2


def test_openapi_documents_every_api_route_and_no_other(gw: RunningGateway) -> None:
    served = gw.http.get("/openapi.json").json()
    assert served == document("1")
    documented = {(m.upper(), p) for p, ops in served["paths"].items() for m in ops}
    app = build_app(Gateway(gw.broker.home), ("127.0.0.1", gw.port))
    routed = {
        (m, r.path) for r in app.routes if r.path.startswith("/api/") for m in r.methods - {"HEAD"}
    }
    assert documented == routed


def test_a_schema_validating_client_accepts_every_documented_answer(gw: RunningGateway) -> None:
    """Every call below goes through openapi-core (tests/edges_harness.py), which holds
    the real answer to /openapi.json; then every documented success was seen."""
    VALIDATED.clear()
    http = gw.http
    register(gw)
    assert http.post("/api/endpoints", json={"subject": DEMO}).status_code == 200
    http.get("/api/endpoints")
    first = publish(gw, {"content": "one"})["messageId"]
    second = publish(gw, {"content": "two"})["messageId"]
    held = http.get(f"/api/endpoints/{DEMO}/inbox", params={"wait": 5, "limit": 1})
    assert [m["id"] for m in held.json()["messages"]] == [first]
    http.get(f"/api/endpoints/{DEMO}/pending")
    http.post(f"/api/messages/{first}/nack", json={"reason": "for the schema"})
    wait_for(lambda: http.get("/api/dead-letters").json()["items"], what="the dead letter")
    again = http.post(f"/api/dead-letters/{first}/republish", json={})
    assert again.status_code == 200, again.text
    http.get(f"/api/trace/{first}")
    held = http.get(f"/api/endpoints/{DEMO}/inbox", params={"limit": 1, "wait": 5})
    assert [m["id"] for m in held.json()["messages"]] == [second]
    http.post(f"/api/messages/{second}/ack")
    wait_for(lambda: copy_state(gw, second) == "done", what="the ack to land")
    release = threading.Event()
    gw.broker.client().subscribe(DEMO, lambda msg: release.wait(30))  # holds its claim
    try:
        item = wait_for(
            lambda: http.get(f"/api/endpoints/{DEMO}/pending").json()["items"],
            what="the republished message claimed by the SDK consumer",
        )[0]
        requeue = {"endpoint": item["endpoint"]}
        answer = http.post(f"/api/messages/{item['id']}/requeue", json=requeue)
        assert answer.is_success, answer.text
    finally:
        release.set()
    http.post("/api/signals", json={"subject": DEMO, "type": "typing", "state": "active"})
    rule = {"from": "relay.agent.x.>", "to": DEMO, "action": "deny", "priority": 5}
    http.post("/api/rules", json=rule)
    http.get("/api/rules")
    http.delete("/api/rules", params={"from": rule["from"], "to": rule["to"]})
    http.get("/api/config")
    http.patch("/api/config", json={"rateLimit": {"maxPerWindow": 250}})
    http.get("/api/status")
    assert http.post(f"/api/dead-letters/{first}/requeue", json={}).is_success
    assert http.post("/api/dead-letters/requeue", params={"endpoint": DEMO}).is_success
    http.delete("/api/dead-letters")
    http.delete(f"/api/endpoints/{DEMO}")

    documented = {
        (method.upper(), path, int(status))
        for path, ops in document("1")["paths"].items()
        for method, op in ops.items()
        for status in op["responses"]
        if status.isdigit() and "application/json" in op["responses"][status]["content"]
    }
    assert documented - VALIDATED == set()


# ---------------------------------------------------------------------- streams


def test_observe_stream_sends_messages_and_signals(gw: RunningGateway) -> None:
    register(gw)
    reader = EventReader(f"{gw.url}/api/stream?pattern=relay.agent.demo.>")
    try:
        assert reader.status == 200
        # A signal subscription takes effect a moment after it is made: send until seen.
        wait_for(
            lambda: (
                gw.http.post(
                    "/api/signals", json={"subject": DEMO, "type": "typing", "state": "active"}
                ).status_code
                == 200
                and reader.of("relay_signal")
            ),
            what="a signal on the stream",
        )
        message_id = publish(gw, {"content": "watched"})["messageId"]
        event = wait_for(lambda: reader.messages(), what="the message on the stream")[0]
        assert event.data["id"] == message_id and event.data["payload"] == {"content": "watched"}
        assert event.id == f"{message_id}.{event.data['endpoint']}"
        signal = reader.of("relay_signal")[0].data
        assert (signal["subject"], signal["type"], signal["state"]) == (DEMO, "typing", "active")
        assert copy_state(gw, message_id) == "new"  # observed, not claimed
    finally:
        reader.close()


def test_observe_stream_resumes_after_last_event_id(gw: RunningGateway) -> None:
    register(gw)
    first = EventReader(f"{gw.url}/api/stream?pattern={DEMO}&signals=false")
    try:
        publish(gw, "one")
        seen = wait_for(lambda: first.messages(), what="the first message")[0]
    finally:
        first.close()
    missed = [publish(gw, n)["messageId"] for n in ("two", "three")]
    again = EventReader(
        f"{gw.url}/api/stream?pattern={DEMO}&signals=false", headers={"Last-Event-ID": seen.id}
    )
    try:
        events = wait_for(lambda: again.messages() if len(again.messages()) >= 2 else None,
                          what="the missed messages")  # fmt: skip
        assert [e.data["id"] for e in events] == missed
    finally:
        again.close()


def test_observe_stream_with_an_unknown_last_event_id_reports_a_gap(gw: RunningGateway) -> None:
    register(gw)
    reader = EventReader(
        f"{gw.url}/api/stream?pattern={DEMO}",
        headers={"Last-Event-ID": "01JDQ3ZV9R6Q4W1T3M5N7P8K2A.x"},
    )
    try:
        gap = wait_for(lambda: reader.of("relay_gap"), what="the gap event")[0]
        assert gap.data["lastEventId"] == "01JDQ3ZV9R6Q4W1T3M5N7P8K2A.x"
    finally:
        reader.close()


def test_consume_stream_acks_what_it_sent(gw: RunningGateway) -> None:
    register(gw)
    message_id = publish(gw, "take me")["messageId"]
    reader = EventReader(f"{gw.url}/api/stream?pattern={DEMO}&mode=consume&signals=false")
    try:
        event = wait_for(lambda: reader.messages(), what="the backlog message")[0]
        assert event.data["id"] == message_id
        wait_for(lambda: copy_state(gw, message_id) == "done", what="the ack")
    finally:
        reader.close()


def test_stream_sends_keepalive_comments(gw: RunningGateway) -> None:
    reader = EventReader(f"{gw.url}/api/stream?mode=signals")
    try:
        wait_for(lambda: "keepalive" in reader.events, what="a keepalive comment")
    finally:
        reader.close()


def _envelope(n: int) -> Envelope:
    return Envelope(new_id(), DEMO, SENDER, None, default_budget(0), 0, n)


def test_hub_replays_what_came_after_the_last_event_id_and_reports_a_gap_otherwise() -> None:
    hub = ObserverHub(client=None, pattern=DEMO, buffer=3)  # type: ignore[arg-type]
    envelopes = [_envelope(n) for n in range(5)]
    for envelope in envelopes:
        asyncio.run(hub._on_message(envelope))
    ids = [message_event(e)[0] for e in envelopes]

    backlog, _ = hub.attach(ids[2])  # the hub keeps the last 3: ids 2, 3, 4
    assert backlog == [message_event(e)[1] for e in envelopes[3:]]
    backlog, _ = hub.attach(ids[0])  # fell out of the buffer
    assert len(backlog) == 1 and b"event: relay_gap" in backlog[0]
    backlog, live = hub.attach(None)
    assert backlog == [] and live.empty()


def test_hub_cuts_a_stream_that_falls_too_far_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("edges.http.sse.LISTENER_LAG", 2)
    hub = ObserverHub(client=None, pattern=DEMO)  # type: ignore[arg-type]
    _, slow = hub.attach(None)
    for n in range(3):
        asyncio.run(hub._on_message(_envelope(n)))
    assert [slow.get_nowait() for _ in range(3)][-1] is CUT
    assert slow not in hub.listeners and hub.idle_since is not None


def test_a_stream_nobody_reads_ends_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("edges.http.sse.LISTENER_LAG", 2)
    stream = Stream(session=None, pattern=DEMO)  # type: ignore[arg-type]
    typing = Signal(SignalType.TYPING, "active", DEMO, 0)
    for _ in range(4):
        asyncio.run(stream._signal(DEMO, typing))
    assert stream.closed
    assert [stream.queue.get_nowait() for _ in range(3)][-1] is CUT
    assert stream.queue.empty()


# ---------------------------------------------------------------------- authentication


def test_the_uid_behind_a_loopback_connection_is_found_in_the_kernel(gw: RunningGateway) -> None:
    with httpx.Client(base_url=gw.url) as http:
        assert http.get("/api/status").status_code == 200  # served as the owner
    import socket

    with socket.create_connection(("127.0.0.1", gw.port)) as sock:
        client, server = sock.getsockname(), sock.getpeername()
        assert connection_owner(client, server) == os.getuid()  # sock_diag
        assert socket_owner(read_socket_tables(), client, server) == os.getuid()  # /proc
        assert connection_owner(server, ("127.0.0.1", 1)) is None  # no such connection


def test_kernel_address_is_the_proc_net_tcp_spelling() -> None:
    table, text = kernel_address("127.0.0.1", 8080)
    assert table == "tcp"
    assert text == ("0100007F:1F90" if sys.byteorder == "little" else "7F000001:1F90")


def test_a_broken_auth_json_serves_nobody(broker: Broker) -> None:
    broker.home.auth_file.write_text("{not json")
    gateway = Gateway(broker.home)
    with pytest.raises(HttpError) as refused:
        gateway.principal(None, Peer(("127.0.0.1", 40000), ("127.0.0.1", 7480)))
    assert refused.value.status == 401
    assert "auth.json is refused" in str(refused.value)


def test_without_tokens_only_loopback_is_served(broker: Broker) -> None:
    gateway = Gateway(broker.home)
    with pytest.raises(HttpError) as refused:
        gateway.principal(None, Peer(("10.1.2.3", 40000), ("10.1.2.4", 7480)))
    assert refused.value.status == 401
    assert refused.value.code == "not_authorized"


def add_token(broker: Broker, name: str, *options: str) -> str:
    """`relay auth add-token NAME OPTIONS`; the token it prints once."""
    made = broker.relay("auth", "add-token", name, *options)
    assert made.returncode == 0, made.stderr
    return made.stdout.split("shown once; auth.json keeps its hash): ")[1].split()[0]


def test_a_token_acts_with_its_identity_rights_on_a_default_install(broker: Broker) -> None:
    """The router on ipc:// (`make run`): the gateway, as the owner, acts for the token's
    identity on its own connection, and the router judges each request by it."""
    token = add_token(broker, "agent-a", "--sender", "relay.agent.a.>")
    with RunningGateway(broker) as gw:
        auth = {"Authorization": f"Bearer {token}"}
        no_token = gw.http.get("/api/status")
        assert no_token.status_code == 401
        assert no_token.json()["error"]["code"] == "not_authorized"
        wrong = gw.http.get("/api/status", headers={"Authorization": "Bearer relay_nope"})
        assert wrong.status_code == 401

        made = gw.http.post("/api/endpoints", headers=auth, json={"subject": "relay.agent.a.x"})
        assert made.status_code == 201, made.text
        own = gw.http.post(
            "/api/publish",
            headers=auth,
            json={"subject": "relay.agent.a.x", "from": "relay.agent.a.x", "payload": 1},
        )
        assert own.status_code == 200, own.text
        assert own.json()["deliveredTo"] == 1
        other = gw.http.post(
            "/api/publish",
            headers=auth,
            json={"subject": "relay.agent.a.x", "from": "relay.agent.b.x", "payload": 1},
        )
        assert other.status_code == 403
        assert other.json()["error"]["code"] == "sender_not_allowed"
        admin_only = gw.http.patch("/api/config", headers=auth, json={"rateLimit": {}})
        assert admin_only.status_code == 403
        assert admin_only.json()["error"]["code"] == "not_authorized"
        stream = gw.http.get("/api/stream?pattern=relay.agent.b.>", headers=auth)
        assert stream.status_code == 403  # may not receive relay.agent.b.>

        # Consuming for it works too: the inbox claims, then the ack is confirmed.
        inbox = gw.http.get("/api/endpoints/relay.agent.a.x/inbox", headers=auth)
        assert inbox.status_code == 200, inbox.text
        (message,) = inbox.json()["messages"]
        acked = gw.http.post(f"/api/messages/{message['id']}/ack", headers=auth)
        assert acked.status_code == 200, acked.text
        assert acked.json()["state"] == "done"

        removed = broker.relay("auth", "remove", "agent-a")
        assert removed.returncode == 0, removed.stderr
        wait_for(
            lambda: gw.http.get("/api/status", headers=auth).status_code == 401,
            what="the revoked token to be refused",
        )


def test_once_serving_by_token_a_request_without_one_stays_401_when_none_are_left(
    broker: Broker,
) -> None:
    """Removing the last token (or auth.json) must not open the gateway to whoever
    reaches it over loopback with the owner's rights: it fails closed, as MCP does."""
    add_token(broker, "agent-a", "--sender", "relay.agent.a.>")
    with RunningGateway(broker) as gw:  # started with a token listed: serves by token
        removed = broker.relay("auth", "remove", "agent-a")
        assert removed.returncode == 0, removed.stderr
        left = gw.http.get("/api/status")
        assert left.status_code == 401
        assert left.json()["error"]["code"] == "not_authorized"
        assert "no token is left" in left.json()["error"]["message"]
        broker.home.auth_file.unlink()
        assert gw.http.get("/api/status").status_code == 401


def test_an_expired_token_gets_401_like_an_unknown_one(broker: Broker) -> None:
    token = add_token(broker, "agent-a", "--sender", "relay.agent.a.>", "--expires", "30d")
    with RunningGateway(broker) as gw:
        auth = {"Authorization": f"Bearer {token}"}
        assert gw.http.get("/api/status", headers=auth).status_code == 200
        data = json.loads(broker.home.auth_file.read_text())
        (entry,) = data["keys"].values()
        entry["tokens"][0]["expires"] = "2020-01-01T00:00:00Z"  # thirty days later
        broker.home.auth_file.write_text(json.dumps(data))
        expired = gw.http.get("/api/status", headers=auth)
        assert expired.status_code == 401
        assert expired.json()["error"]["message"] == "unknown, expired or revoked bearer token"


def test_a_token_is_served_with_the_router_on_tcp_too() -> None:
    """On tcp:// the gateway connects with its own key, which needs the delegation
    right (the owner's uid has it implicitly; a key must be granted it)."""
    broker = Broker.on_tcp([("edge", [">"], True)])
    try:
        data = json.loads(broker.home.auth_file.read_text())
        (edge,) = data["keys"].values()
        edge["delegate"] = True
        broker.home.auth_file.write_text(json.dumps(data))
        token = add_token(broker, "agent-a", "--sender", "relay.agent.a.>")
        broker.start()
        options = {
            "address": broker.client_options["address"],
            "key_file": str(broker.client_options["key_file"]),
        }
        with RunningGateway(broker, **options) as gw:
            auth = {"Authorization": f"Bearer {token}"}
            body = {"subject": "relay.agent.a.x", "payload": 1}
            own = gw.http.post(
                "/api/publish", headers=auth, json={**body, "from": "relay.agent.a.x"}
            )
            assert own.status_code == 200, own.text
            other = gw.http.post("/api/publish", headers=auth, json={**body, "from": "relay.b.x"})
            assert other.status_code == 403
            assert other.json()["error"]["code"] == "sender_not_allowed"
    finally:
        broker.cleanup()


def test_auth_json_keeps_only_the_token_hash(broker: Broker) -> None:
    token = add_token(broker, "agent-a", "--sender", "relay.agent.a.>")
    text = broker.home.auth_file.read_text()
    assert token not in text
    policy = AuthPolicy.from_json(json.loads(text), broker.home.owner_uid)
    found = TokenBook(policy).verify(token, 0)
    assert found is not None and found.name == "agent-a"
    assert not list(broker.home.keys.glob("agent-a*"))  # no key secret: only the token


@pytest.mark.parametrize(
    "entry",
    [
        {"keys": {"k" * 40: {"senders": [">"], "tokens": ["md5:abc"]}}},
        {"keys": {"k" * 40: {"senders": [">"], "tokens": "sha256:" + "0" * 64}}},
        {"uids": {"1001": {"senders": [">"], "tokens": ["sha256:" + "0" * 64]}}},
    ],
    ids=["not-sha256", "not-a-list", "on-a-uid"],
)
def test_auth_json_refuses_tokens_it_cannot_honour(entry: dict) -> None:
    with pytest.raises(InvalidConfig):
        AuthPolicy.from_json(entry, owner_uid=0)
    good = {"keys": {"k" * 40: {"senders": [">"], "tokens": ["sha256:" + "0" * 64]}}}
    assert AuthPolicy.from_json(good, owner_uid=0).keys


# ---------------------------------------------------------------------- other sites

HOSTS = allowed_hosts("127.0.0.1", 7480)


@pytest.mark.parametrize(
    ("headers", "refused"),
    [
        ({"host": "127.0.0.1:7480"}, False),  # a script
        ({"host": "localhost:7480", "sec-fetch-site": "same-origin"}, False),
        ({"host": "127.0.0.1:7480", "sec-fetch-site": "none"}, False),  # the address bar
        ({"host": "127.0.0.1:7480", "origin": "http://127.0.0.1:7480"}, False),
        ({"host": "127.0.0.1:7480", "sec-fetch-site": "cross-site"}, True),  # <img src=...>
        ({"host": "127.0.0.1:7480", "sec-fetch-site": "same-site"}, True),
        ({"host": "127.0.0.1:7480", "origin": "https://evil.example"}, True),  # a form POST
        ({"host": "127.0.0.1:7480", "origin": "null"}, True),  # a sandboxed frame
        ({"host": "evil.example:7480"}, True),  # DNS rebinding
        ({"host": "127.0.0.1:9999"}, True),
    ],
    ids=[
        "script", "same-origin", "address-bar", "own-origin", "cross-site", "same-site",
        "other-origin", "null-origin", "rebound-name", "other-port",
    ],
)  # fmt: skip
def test_requests_from_other_sites_are_refused(headers: dict, refused: bool) -> None:
    assert (refusal(headers, HOSTS) is not None) == refused


def test_listening_on_all_interfaces_skips_only_the_host_check() -> None:
    assert allowed_hosts("0.0.0.0", 7480) is None
    assert refusal({"host": "box.lan:7480"}, None) is None
    assert refusal({"host": "box.lan:7480", "sec-fetch-site": "cross-site"}, None)


def test_a_cross_site_publish_gets_403_access_denied(gw: RunningGateway) -> None:
    register(gw)
    response = gw.http.post(
        "/api/publish",
        content=json.dumps({"subject": DEMO, "from": SENDER, "payload": "csrf"}),
        headers={"Origin": "https://evil.example", "Content-Type": "text/plain"},
    )
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "access_denied"
    assert gw.http.get("/api/endpoints").json()["endpoints"][0]["depth"] == 0


# ---------------------------------------------------------------------- the command


def serves(port: int) -> bool:
    """Whether a gateway answers on 127.0.0.1:port."""
    try:
        return httpx.get(f"http://127.0.0.1:{port}/api/status").status_code == 200
    except httpx.HTTPError:
        return False


def test_relay_http_command_serves_the_api_and_the_console(broker: Broker) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "--home", str(broker.home.root), "http",
         "--listen", f"127.0.0.1:{port}"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_for(lambda: serves(port), 20, interval=0.1, what="relay http to serve")
        page = httpx.get(f"http://127.0.0.1:{port}/")
        assert page.status_code == 200 and "Relay console" in page.text
    finally:
        proc.terminate()
        proc.wait(10)


def taken_port() -> socket.socket:
    """A socket listening on a free loopback port, as another program would hold it."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    return holder


def edges_of(broker: Broker) -> list[dict]:
    return broker.client().status()["edges"]


def test_the_gateway_stays_up_while_its_address_is_taken_and_binds_once_free(
    broker: Broker,
) -> None:
    holder = taken_port()
    port = holder.getsockname()[1]
    broker.start_process("http", "http", "--listen", f"127.0.0.1:{port}")
    wait_for(lambda: "cannot bind" in broker.log("http"), 20, what="the cannot-bind line")
    (line,) = [x for x in broker.log("http").splitlines() if "cannot bind" in x]
    assert f"127.0.0.1:{port}" in line and "retrying" in line

    (edge,) = wait_for(lambda: edges_of(broker), what="the gateway in status")
    assert (edge["kind"], edge["state"], edge["address"]) == (
        "http",
        "retrying",
        f"127.0.0.1:{port}",
    )
    assert edge["pid"] == broker.procs["http"].pid and "in use" in edge["error"]
    shown = broker.relay("status")
    assert f"http pid {edge['pid']}: CANNOT BIND 127.0.0.1:{port}" in shown.stdout, shown

    holder.close()
    wait_for(lambda: serves(port), 20, interval=0.1, what="the gateway to bind once free")
    assert [e["state"] for e in edges_of(broker)] == ["listening"]
    assert broker.procs["http"].poll() is None
    broker.procs["http"].terminate()
    assert broker.procs["http"].wait(10) == 0
    assert edges_of(broker) == []  # its state file went with it


def test_a_gateway_stopped_while_retrying_exits_cleanly(broker: Broker) -> None:
    with contextlib.closing(taken_port()) as holder:
        port = holder.getsockname()[1]
        broker.start_process("http", "http", "--listen", f"127.0.0.1:{port}")
        wait_for(lambda: edges_of(broker), 20, what="the gateway in status")
        broker.procs["http"].terminate()
        assert broker.procs["http"].wait(10) == 0
    assert edges_of(broker) == []


def test_retry_delays_double_up_to_thirty_seconds() -> None:
    assert [retry_delay(n) for n in range(1, 9)] == [1, 2, 4, 8, 16, 30, 30, 30]


def test_edge_states_of_processes_that_no_longer_run_are_ignored(tmp_path: Path) -> None:
    home = Home(tmp_path).create()
    for pid in (11, 12):
        edge_state.write(home, EdgeState("http", pid, "127.0.0.1:7480", "listening", 0))
    (home.run / "http-13.json").write_text("not json")
    assert [s.pid for s in edge_state.read_all(home, runs=lambda pid: pid == 12)] == [12]
    edge_state.forget_dead(home, "http", runs=lambda pid: pid == 12)
    assert sorted(p.name for p in home.run.glob("http-*")) == ["http-12.json"]


def test_make_run_keeps_the_broker_up_when_the_gateways_address_is_taken(
    tmp_path: Path,
) -> None:
    """The Procfile under honcho, as `make run HTTP=...` starts it: honcho stops the
    whole group when one process exits, so the gateway must not exit."""
    home = Home(tempfile.mkdtemp(prefix="relay-")).create()  # short: ipc:// path limit
    holder = taken_port()
    port = holder.getsockname()[1]
    env = {
        **os.environ,
        "RELAY_HOME": str(home.root),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "RELAY_HTTP_LISTEN": f"127.0.0.1:{port}",
    }
    out = (tmp_path / "honcho.log").open("wb")
    honcho = subprocess.Popen(
        [str(Path(sys.executable).parent / "honcho"), "start"],
        cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    log = tmp_path / "honcho.log"
    try:

        def retrying() -> list:
            assert honcho.poll() is None, log.read_text()
            try:
                with connect(home.root, timeout=1.0) as client:
                    status = client.status()
            except RelayError:
                return []
            return [e for e in status["edges"] if e["state"] == "retrying"]

        (edge,) = wait_for(retrying, 30, interval=0.1, what="the group up, its gateway retrying")
        assert edge["address"] == f"127.0.0.1:{port}"
        assert "cannot bind" in log.read_text()
    finally:
        holder.close()
        honcho.terminate()
        try:
            honcho.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(honcho.pid, signal.SIGKILL)  # the group this test started
            honcho.wait()
        out.close()
        shutil.rmtree(home.root, ignore_errors=True)
