"""The live console in a real browser: headless Debian chromium driven by Playwright.

`make test` installs chromium (edges/setup-browser.sh); without it these tests skip and
say so. Screenshots go to $RELAY_CONSOLE_SHOTS (a directory) when set, else the test's
tmp_path."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sdk.client import Client
from sdk.types import Envelope, Signal, SignalType
from tests.edges_harness import RunningGateway
from tests.harness import Broker, wait_for

pytestmark = pytest.mark.integration

CHROMIUM = os.environ.get("RELAY_CHROMIUM") or shutil.which("chromium")
if CHROMIUM is None:
    pytest.skip(
        "no chromium on this machine: `make browser` (edges/setup-browser.sh) installs it",
        allow_module_level=True,
    )

from playwright.sync_api import Page, expect, sync_playwright  # noqa: E402

DEMO = "relay.agent.demo.backend"
SENDER = "relay.agent.demo.frontend"


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("RELAY_CONSOLE_SHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def console(broker: Broker) -> Iterator[tuple[Page, Client]]:
    """The console open in chromium, once its stream is live; an SDK client of the same
    broker, with the endpoint DEMO registered."""
    client = broker.client()
    client.register_endpoint(DEMO)
    with RunningGateway(broker) as gw, sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
        )
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.on("dialog", lambda dialog: dialog.accept())  # the purge confirmation
        page.goto(gw.url + "/")
        expect(page.locator("#stream-state")).to_have_text("live", timeout=15_000)
        try:
            yield page, client
        finally:
            browser.close()


def test_console_shows_a_message_published_from_the_sdk_and_its_trace(
    console: tuple[Page, Client], shots: Path
) -> None:
    page, client = console
    expect(page.locator(f'#endpoints tr[data-subject="{DEMO}"]')).to_be_visible(timeout=10_000)

    result = client.publish(DEMO, {"content": "hello from the SDK"}, sender=SENDER)
    row = page.locator(f'#messages li[data-id="{result.message_id}"]')
    expect(row).to_be_visible(timeout=10_000)
    expect(row).to_contain_text("hello from the SDK")
    endpoint_row = page.locator(f'#endpoints tr[data-subject="{DEMO}"]')
    expect(endpoint_row.locator(".depth")).to_have_text("1")
    expect(endpoint_row.locator(".claimed")).to_have_text("0")
    assert client.fetch(DEMO)  # claimed now: the console shows it beside waiting
    expect(endpoint_row.locator(".claimed")).to_have_text("1", timeout=10_000)
    expect(endpoint_row.locator(".depth")).to_have_text("0")

    # Signals as they pass: a signal subscription takes effect a moment after it is
    # made, so send until one shows.
    typing = Signal(SignalType.TYPING, "active", DEMO, 0)
    signals = page.locator('#signals li[data-type="typing"]')
    wait_for(
        lambda: client.signal(DEMO, typing, sender=SENDER) or signals.count(),
        what="a typing signal in the console",
    )
    expect(signals.first).to_contain_text(f"typing active on {DEMO}")

    row.click()
    trace = page.locator(f'#trace table[data-id="{result.message_id}"]')
    expect(trace).to_be_visible(timeout=10_000)
    expect(trace).to_contain_text(DEMO)
    expect(trace.locator(".copy-state")).to_have_text("claimed")
    page.screenshot(path=str(shots / "console-message-trace.png"), full_page=True)


def test_console_shows_a_conversation_a_request_and_its_reply(
    console: tuple[Page, Client], shots: Path
) -> None:
    page, client = console

    def answer(envelope: Envelope) -> None:
        client.reply(envelope, {"content": "pong"}, sender=DEMO)

    client.subscribe(DEMO, answer)
    reply = client.request(DEMO, {"content": "ping"}, sender=SENDER, timeout=10)
    request_id = reply.parent_id
    page.locator("#trace-id").fill(request_id)
    page.locator("#trace-form button").click()
    replies = page.locator("#trace .conversation .replies a")
    expect(replies).to_have_count(1, timeout=10_000)
    expect(replies.first).to_contain_text(f"{reply.id} from {DEMO}")
    page.screenshot(path=str(shots / "console-conversation.png"), full_page=True)
    replies.first.click()  # the reply's own trace says what it answers
    parent = page.locator("#trace .conversation .parent a")
    expect(parent).to_have_text(request_id, timeout=10_000)
    parent.click()
    expect(page.locator(f'#trace table[data-id="{request_id}"]')).to_be_visible()


def test_console_purges_a_dead_letter(console: tuple[Page, Client], shots: Path) -> None:
    page, client = console

    def refuse(envelope: Envelope) -> None:
        raise ValueError("cannot parse this request")

    stop = client.subscribe(DEMO, refuse)
    doomed = client.publish(DEMO, {"content": "doomed"}, sender=SENDER).message_id
    wait_for(lambda: client.dead_letters(), what="the nacked message to become a dead letter")
    stop()

    page.locator("#refresh-dead-letters").click()
    letter = page.locator(f'#dead-letters tr[data-id="{doomed}"]')
    expect(letter).to_be_visible(timeout=10_000)
    expect(letter).to_contain_text("cannot parse this request")
    page.screenshot(path=str(shots / "console-dead-letter.png"), full_page=True)

    letter.locator("button.purge").click()
    expect(letter).to_have_count(0, timeout=10_000)
    expect(page.locator("#notice")).to_have_text("purged 1 dead letter(s)")
    assert client.dead_letters() == []
    page.screenshot(path=str(shots / "console-purged.png"), full_page=True)


def test_console_requeues_a_dead_letter_to_a_consumer_under_its_own_id(
    console: tuple[Page, Client], shots: Path
) -> None:
    page, client = console
    message_id = client.publish(DEMO, {"content": "retry me"}, sender=SENDER).message_id
    (held,) = client.fetch(DEMO, wait=5)
    held.nack("the handler had a bug")
    page.locator("#refresh-dead-letters").click()
    letter = page.locator(f'#dead-letters tr[data-id="{message_id}"]')
    expect(letter).to_be_visible(timeout=10_000)

    letter.locator("button.requeue").click()

    expect(page.locator("#notice")).to_have_text(f"requeued {message_id} to {DEMO}")
    expect(letter).to_have_count(0, timeout=10_000)
    page.locator("#trace-id").fill(message_id)
    page.locator("#trace-form button").click()
    trace = page.locator(f'#trace table[data-id="{message_id}"]')
    expect(trace.locator(".copy-state")).to_have_text("new", timeout=10_000)
    expect(trace.locator(".requeued")).to_contain_text("after nack: the handler had a bug")
    page.screenshot(path=str(shots / "console-requeued.png"), full_page=True)
    (again,) = client.fetch(DEMO, wait=5)
    assert again.id == message_id and again.deliveries == 1
    assert again.envelope.payload == {"content": "retry me"}


def test_console_asks_for_a_token_when_auth_json_lists_tokens(broker: Broker, shots: Path) -> None:
    """On a default install (the router on ipc://, as `make run` starts it)."""
    made = broker.relay("auth", "add-token", "console", "--sender", ">", "--admin")
    assert made.returncode == 0, made.stderr
    token = made.stdout.split("shown once; auth.json keeps its hash): ")[1].split()[0]
    with RunningGateway(broker) as gw, sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
        )
        try:
            page = browser.new_page()
            page.goto(gw.url + "/")
            form = page.locator("#token-form")
            expect(form).to_be_visible(timeout=10_000)  # the API said 401
            page.locator("#token").fill(token)
            form.locator("button").click()
            expect(page.locator("#stream-state")).to_have_text("live", timeout=15_000)
            broker.client().register_endpoint(DEMO)
            row = page.locator(f'#endpoints tr[data-subject="{DEMO}"]')
            expect(row).to_be_visible(timeout=10_000)
            page.screenshot(path=str(shots / "console-token.png"), full_page=True)
        finally:
            browser.close()


LONG = "relay.agent.a-rather-long-project-name.backend-service-with-a-long-name"


@pytest.mark.parametrize("width", [800, 1400])
def test_console_fits_the_window_and_shows_a_small_pressure(
    broker: Broker, shots: Path, width: int
) -> None:
    """Given endpoints with long subjects, one message waiting (0.1 % of a mailbox), a
    dead letter with a long reason and an unroutable one; when the console opens at
    ``width`` px, then nothing is wider than the window, the pressure bar shows, and no
    request of the page (the favicon included) answered 404."""
    client = broker.client()
    for subject in (DEMO, LONG, f"{LONG}.with.more.tokens"):
        client.register_endpoint(subject)
    client.publish(LONG, {"content": "waiting"}, sender=SENDER)

    def refuse(envelope: Envelope) -> None:
        raise ValueError("the request names a tool this agent does not have: " + "x" * 150)

    stop = client.subscribe(DEMO, refuse)
    client.publish(DEMO, {"content": "doomed"}, sender=SENDER)
    wait_for(lambda: client.dead_letters(), what="the nacked message to become a dead letter")
    stop()
    client.publish("relay.agent.nobody.home", {"content": "lost"}, sender=SENDER)

    with RunningGateway(broker) as gw, sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
        )
        try:
            page = browser.new_page(viewport={"width": width, "height": 900})
            missing: list[str] = []
            page.on("response", lambda r: r.status == 404 and missing.append(r.url))
            page.goto(gw.url + "/")
            expect(page.locator("#stream-state")).to_have_text("live", timeout=15_000)
            row = page.locator(f'#endpoints tr[data-subject="{LONG}"]')
            expect(row).to_be_visible(timeout=10_000)
            page.locator("#refresh-dead-letters").click()
            expect(page.locator("#dead-letters tbody tr")).to_have_count(2, timeout=10_000)
            page.screenshot(path=str(shots / f"console-{width}.png"), full_page=True)

            overflow = page.evaluate(
                """() => [document.documentElement, ...document.querySelectorAll('section')]
                    .filter(e => e.scrollWidth > e.clientWidth + 1)
                    .map(e => `${e.id || e.tagName}: ${e.scrollWidth} > ${e.clientWidth}`)"""
            )
            assert overflow == [], overflow
            bar = row.locator(".pressure .bar span").bounding_box()
            assert bar is not None and bar["width"] >= 2, bar
            expect(row.locator(".pressure")).to_contain_text("0.1%")
            assert httpx.get(gw.url + "/favicon.ico").status_code == 200
            assert missing == []
        finally:
            browser.close()
