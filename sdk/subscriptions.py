"""A client's subscriptions together: their workers (sdk/subscription.py) by the
router's id, what the I/O thread hands them (pushed messages, the heartbeat's list of
the subscriptions the router holds, answers whose delay passed), and renewing those the
router lost (it restarted, or ended a silent session).

It depends on a small interface to the connection (`Connection`, which
sdk/transport.py's `Transport` is), and is the `Answers` its workers answer through.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

from sdk import wire
from sdk.errors import RelayError
from sdk.subscription import Handler, SubscriptionWorker, answer_of
from sdk.transport import Follower, ReplyHook, Request

log = logging.getLogger("relay.client")


class Connection(Protocol):
    """What the subscriptions need from the client's connection."""

    def send_request(
        self,
        op: str,
        *,
        timeout: float | None = None,
        on_reply: ReplyHook | None = None,
        **fields: Any,
    ) -> Future: ...

    def call(self, op: str, *, timeout: float | None = None, **fields: Any) -> Any: ...

    def wait(self, future: Future, op: str, timeout: float | None = None) -> Any: ...

    def holding(
        self, message_id: str, endpoint: str, deliveries: int, ack_wait_ms: int | None
    ) -> None: ...

    def answered(self, message_id: str, endpoint: str, deliveries: int) -> None: ...

    def wake(self) -> None: ...

    def follow(self, follower: Follower) -> bool: ...

    def stop_following(self, follower: Follower) -> None: ...


class Subscriptions:
    """The subscriptions of one client and the one owner of their registry."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self.workers: dict[int, SubscriptionWorker] = {}  # by the router's sub id
        self._starting: set[SubscriptionWorker] = set()  # subscribe sent, not answered
        self._renew_lock = threading.Lock()  # finding which lost workers to renew
        # Workers whose answers wait for their deadline (the I/O thread looks at these).
        self._answers_waiting: set[SubscriptionWorker] = set()
        self._ending = False  # close() has begun: answers leave through it, before "bye"
        self._answers_lock = threading.Lock()  # never held while waiting on anything

    def subscribe(
        self, handler: Handler, mode: str, fields: dict[str, Any], *, confirm: bool
    ) -> Callable[[], None]:
        """Subscribe at the router (``fields``: the subscribe request); unsubscribe()."""
        worker = SubscriptionWorker(self, handler, mode, fields, confirm=confirm)
        self._start(worker)

        def unsubscribe() -> None:
            if worker.ended:
                return
            # Ended first, so that no heartbeat renews it meanwhile (its reply may list
            # the router's subscriptions without this one before we forget it). Then
            # the router stops pushing (pushes sent before its reply still reach the
            # worker and are handled and acknowledged), then the worker stops. A
            # renewal already under way ends the new one itself (renew).
            worker.ended = True
            self._end_at_router(worker)  # worker.sub changes if it had to be renewed
            worker.stop()

        return unsubscribe

    def _start(self, worker: SubscriptionWorker) -> None:
        """Subscribe and wait for the reply; the worker is registered on the I/O thread
        when it comes, before the backlog pushes that follow it are read."""
        self._starting.add(worker)
        try:
            self._connection.wait(
                self._connection.send_request(
                    "subscribe",
                    on_reply=lambda result: self._subscribed(worker, result),
                    **worker.fields,
                ),
                "subscribe",
            )
        finally:
            self._starting.discard(worker)  # a late reply must not start a worker nobody can stop

    def _subscribed(self, worker: SubscriptionWorker, result: Any) -> None:
        if worker in self._starting:
            self._starting.discard(worker)
            worker.subscribed(result)
            self.workers[worker.sub] = worker

    def _end_at_router(self, worker: SubscriptionWorker) -> None:
        sub_id = worker.sub
        with contextlib.suppress(RelayError):
            self._connection.call("unsubscribe", sub=sub_id)
        if self.workers.get(sub_id) is worker:
            del self.workers[sub_id]

    # ------------------------------------------------------------------ the I/O thread

    def pushed(self, push: wire.Push) -> None:
        worker = self.workers.get(push.sub)
        if worker is None:
            return
        if worker.mode == "consume":
            ack_wait = worker.fields.get("ackWait")
            self._connection.holding(push.id, push.endpoint, push.deliveries, ack_wait)
        worker.queue.put(push)

    def expects_pushes(self, besides: object = None) -> bool:
        return bool(self._starting) or any(w is not besides for w in self.workers.values())

    def router_holds(self, subs: set[int]) -> None:
        """One of ours missing from the router's list means it restarted or ended our
        silent session: subscribe again (on another thread: this is the I/O thread)."""
        # A copy: handler and renewal threads change the dict meanwhile. An ended worker
        # is never renewed: it was let go, not lost, whatever the router says.
        lost = [
            (w, w.renewals)
            for sub_id, w in list(self.workers.items())
            if sub_id not in subs and not w.ended
        ]
        if lost:
            threading.Thread(target=self.renew, args=(lost,), daemon=True).start()

    def answers_due(self, now: float, send: Callable[[list[Request]], None]) -> float | None:
        """Send the answers that waited their ACK_DELAY_S (their handler thread may be
        busy with a slow message); returns when the next waiting one is due. Their
        replies, like those of every answer, are not waited for. Nothing is taken once
        close() has begun: it answers itself, before "bye"."""
        if not self._answers_waiting:
            return None
        return self._send_due(list(self._answers_waiting), now, send, following=False)

    def answers_due_of(
        self, worker: SubscriptionWorker, now: float, send: Callable[[list[Request]], None]
    ) -> float | None:
        """`answers_due` for one worker, called by its own thread while it reads the
        socket itself (`Transport.follow`)."""
        return self._send_due([worker], now, send, following=True)

    def _send_due(
        self,
        workers: list[SubscriptionWorker],
        now: float,
        send: Callable[[list[Request]], None],
        *,
        following: bool,
    ) -> float | None:
        # The I/O thread holds this lock while it takes the socket to send (_send_now);
        # a follower holds the socket while it comes here: it does not wait for the
        # lock then (the I/O thread is about to ask it for the socket), it looks again.
        if not self._answers_lock.acquire(blocking=not following):
            return now
        try:  # close() sets _ending under the lock: no answer after "bye"
            if self._ending:
                return None
            due, next_due = [], None
            for worker in workers:
                handled, deadline = worker.take_due(now, following=following)
                if deadline is not None:
                    next_due = deadline if next_due is None else min(next_due, deadline)
                due += handled
            if due:
                for delivery, _ in due:
                    self.answered(delivery.id, delivery.endpoint, delivery.deliveries)
                send([answer_of(delivery, error) for delivery, error in due])
            return next_due
        finally:
            self._answers_lock.release()

    # ------------------------------------------------------------------ renewing

    def renew(self, lost: list[tuple[SubscriptionWorker, int]]) -> None:
        """Subscribe again for each worker found lost at its ``renewals`` count."""
        # Every lost one leaves the registry before any is renewed: the new router's ids
        # may be the old ids of others still waiting (a renewed one must not overwrite
        # them). Under the lock, and only if not renewed since it was found lost: two
        # renewals of one loss (two heartbeats' threads) must not subscribe it twice.
        with self._renew_lock:
            workers = [
                w
                for w, renewals in lost
                if not w.ended and w.renewals == renewals and self.workers.get(w.sub) is w
            ]
            for worker in workers:
                worker.renewals += 1
                del self.workers[worker.sub]
        for worker in workers:
            pattern = worker.fields["pattern"]
            log.warning(
                "subscription %s to %r was lost by the broker; subscribing again",
                worker.sub,
                pattern,
            )
            try:
                self._start(worker)
            except RelayError as exc:
                log.error("could not renew the subscription to %r: %s", pattern, exc)
                worker.stop()  # it handles and answers what was pushed to it, then ends
                continue
            if worker.ended:
                # Unsubscribed while it was being renewed: end that one too. Messages
                # pushed to it meanwhile reach a stopped worker and stay pending (the
                # window is one subscribe's round trip).
                self._end_at_router(worker)

    # ------------------------------------------------------------------ Answers

    def send_request(self, op: str, **fields: Any) -> Future:
        return self._connection.send_request(op, **fields)

    def wait(self, future: Future, op: str) -> Any:
        return self._connection.wait(future, op)

    def answered(self, message_id: str, endpoint: str, deliveries: int) -> None:
        self._connection.answered(message_id, endpoint, deliveries)

    def answers_waiting(self, worker: SubscriptionWorker, waiting: bool) -> None:
        """A worker's answers wait for their deadline (the I/O thread watches it), or no
        longer do. Called under the worker's lock, never the connection's."""
        if waiting:
            self._answers_waiting.add(worker)
        else:
            self._answers_waiting.discard(worker)

    def wake_for_answers(self) -> None:
        """A handler thread has answers waiting and stops watching their deadline: have
        the I/O thread watch it."""
        self._connection.wake()

    def follow(self, worker: SubscriptionWorker) -> bool:
        return self._connection.follow(worker)

    def stop_following(self, worker: SubscriptionWorker) -> None:
        self._connection.stop_following(worker)

    # ------------------------------------------------------------------ lifecycle

    def close(self, *, answer: bool) -> None:
        """Stop every worker. Messages pushed but not yet handled are dropped: they stay
        claimed (pending()), rather than being handled with an ack that cannot go out.
        With ``answer`` (the connection still runs), what was handled is answered now,
        before the caller's "bye"."""
        with self._answers_lock:  # waits for answers the I/O thread is sending
            self._ending = True  # from here it leaves them to us
        for worker in {*self.workers.values(), *self._answers_waiting}:
            worker.stop(discard_queued=True)
            if answer:
                worker.answer()
        self.workers.clear()
