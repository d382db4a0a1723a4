"""A consumer that fell behind catches up: once its credit is back, new messages are
stored claimed again (one commit) even while older ones are still on their way into
new/, and each is handed out only after every older one (broker/router/delivery.py,
"Catching up")."""

from __future__ import annotations

import itertools

from broker.router.consumers import CONSUME, Consumers
from broker.router.delivery import Claim, Ledger
from sdk.ids import new_id

CLIENT = b"c"
SUBJECT = "m.a.e0"
ENDPOINT = "0123456789ab"


def _ledger(credit: int, pattern: str = SUBJECT) -> tuple[Ledger, Consumers, int]:
    consumers = Consumers()
    ledger = Ledger(consumers, 1, lambda endpoint: [], itertools.count(1))
    ledger.writer_up(0)
    ledger.add_endpoint(ENDPOINT, SUBJECT)
    consumers.touch(CLIENT, 0)
    sub = consumers.subscribe(CLIENT, pattern, CONSUME, credit, 0, None)
    ledger.subscribed(sub, [ENDPOINT])
    return ledger, consumers, sub.id


def _handed(ledger: Ledger, consumers: Consumers, sub_id: int, message_id: str) -> None:
    """The router pushed it: the consumer holds it."""
    consumers.handed_out(consumers.subs[sub_id], message_id, ENDPOINT, "s", 1, 0)


def _behind(ledger: Ledger, consumers: Consumers, sub_id: int) -> list[str]:
    """Given three messages stored claimed (the credit is used up) and a fourth on its
    way into new/; when the first two are acked. Returns the four ids."""
    ids = [new_id() for _ in range(4)]
    for message_id in ids[:3]:
        assert ledger.store_target(message_id, ENDPOINT) is not None
        assert ledger.copy_settled(message_id, ENDPOINT) == sub_id
        _handed(ledger, consumers, sub_id, message_id)
    assert ledger.store_target(ids[3], ENDPOINT) is None  # no credit left: into new/
    for message_id in ids[:2]:
        assert consumers.settled(CLIENT, message_id, ENDPOINT) is not None
    ledger.feed_refilled()
    return ids


def test_new_messages_are_stored_claimed_again_while_an_older_one_is_still_being_stored():
    ledger, consumers, sub_id = _ledger(credit=3)
    _behind(ledger, consumers, sub_id)

    sub = ledger.store_target(new_id(), ENDPOINT)

    assert sub is not None and sub.id == sub_id


def test_a_message_stored_claimed_behind_an_older_one_is_handed_out_after_it():
    ledger, consumers, sub_id = _ledger(credit=3)
    ids = _behind(ledger, consumers, sub_id)
    newest = new_id()
    assert ledger.store_target(newest, ENDPOINT) is not None

    # The older one lands in new/ and is claimed; the newest is stored claimed first.
    assert ledger.copy_settled(ids[3], ENDPOINT) is None
    ledger.stored_new(ids[3], ENDPOINT)
    claims = [c for c in ledger.take_outbox() if isinstance(c, Claim)]
    assert [c.id for c in claims] == [ids[3]]
    assert ledger.copy_settled(newest, ENDPOINT) == sub_id
    held = ledger.hand_out_in_order(newest, ENDPOINT, sub_id, newest, stored=True)
    assert ledger.claimed(sub_id, ids[3], ENDPOINT, ok=True)
    after_claim = ledger.hand_out_in_order(ids[3], ENDPOINT, sub_id, ids[3], stored=False)

    assert held == []
    assert after_claim == [ids[3], newest]


def test_credit_for_the_older_ones_is_kept_back():
    """Two messages on their way into new/ need two claims: with one unit of credit to
    spare, the next message goes into new/ too, rather than take the credit they need."""
    ledger, consumers, sub_id = _ledger(credit=3)
    _behind(ledger, consumers, sub_id)
    second_behind = new_id()
    ledger.queues[ENDPOINT].storing.add(second_behind)  # another copy on its way to new/

    assert ledger.store_target(new_id(), ENDPOINT) is None


def test_a_wildcard_consumer_waits_until_nothing_older_is_on_its_way():
    """Its credit may go to other endpoints' backlogs, so none is kept back for this
    one: the rule of before holds (stored claimed only when nothing is in the way)."""
    ledger, consumers, sub_id = _ledger(credit=3, pattern="m.a.*")
    _behind(ledger, consumers, sub_id)

    assert ledger.store_target(new_id(), ENDPOINT) is None


def test_a_held_message_is_released_when_the_older_one_is_given_up_on():
    """The older copy's store is abandoned (its publish deadline passed before it was
    sent): nothing older is on its way, so the held one goes at the end of the pass."""
    ledger, consumers, sub_id = _ledger(credit=3)
    ids = _behind(ledger, consumers, sub_id)
    newest = new_id()
    assert ledger.store_target(newest, ENDPOINT) is not None
    assert ledger.copy_settled(newest, ENDPOINT) == sub_id
    assert ledger.hand_out_in_order(newest, ENDPOINT, sub_id, newest, stored=True) == []

    ledger.copy_abandoned(ids[3], ENDPOINT, sent=False)

    assert ledger.take_released() == [newest]
    assert ledger.take_released() == []
