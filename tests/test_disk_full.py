"""A full disk under one endpoint's mailbox: clear errors, nothing half-written, the
breaker counts it, and every other endpoint keeps working. A real tiny filesystem
(tmpfs of 64 KiB) is mounted on the mailbox; this needs root, as CI has."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from sdk.subjects import endpoint_hash
from tests.harness import Broker

pytestmark = pytest.mark.integration

FULL = "relay.agent.disk.full"
FINE = "relay.agent.disk.fine"
SENDER = "relay.agent.disk.sender"


@pytest.fixture
def tiny_mailbox_broker():
    broker = Broker(shards=1)
    mailbox = broker.home.create().mailbox(endpoint_hash(FULL))
    mailbox.mkdir(mode=0o700)
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(mailbox)],
        capture_output=True,
        text=True,
    )
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tiny filesystem here (needs root): {mount.stderr.strip()}")
    try:
        broker.start()
        yield broker, mailbox
    finally:
        broker.stop()
        subprocess.run(["umount", str(mailbox)], check=False)
        broker.cleanup()


def test_a_full_disk_fails_deliveries_cleanly_and_opens_the_breaker(tiny_mailbox_broker):
    broker, mailbox = tiny_mailbox_broker
    client = broker.client()
    full = client.register_endpoint(FULL)
    client.register_endpoint(FINE)
    client.set_config({"rateLimit": {"enabled": False}})
    payload = "x" * 6000  # two pages a file: the 64 KiB fill after a few messages
    outcomes = [client.publish(FULL, payload, sender=SENDER) for _ in range(30)]
    delivered = [r for r in outcomes if r.delivered_to == 1]
    failed = [r for r in outcomes if r.rejected == ((full.hash, "storage_error"),)]
    refused = [r for r in outcomes if r.rejected == ((full.hash, "circuit_open"),)]
    assert delivered and failed and refused, [r.rejected for r in outcomes]
    assert len(delivered) + len(failed) + len(refused) == 30
    assert "No space left on device" in failed[0].details[full.hash]
    assert len(failed) == 5  # five consecutive failures open the breaker
    # nothing half-written: no tmp file left, every file in new/ a whole envelope
    assert os.listdir(mailbox / "tmp") == []
    names = sorted(os.listdir(mailbox / "new"))
    assert names == sorted(r.message_id for r in delivered)
    for name in names:
        assert json.loads((mailbox / "new" / name).read_bytes())["payload"] == payload
    assert client.status()["endpoints"][1]["breaker"]["state"] == "open"
    # the rest of the broker serves on
    assert client.publish(FINE, "elsewhere", sender=SENDER).delivered_to == 1
