"""The chat widget's tool calls in headless Chromium, against real server processes and the
loopback model: "Looking up order ORD-17…" while the tool runs, its result folded under the
line once done, Approve and Reject for a call that needs the user's approval (over the
websocket under ASGI, through the REST API under WSGI), Stop stopping a running tool, and a
call waiting for approval met again: on the conversation opened in another tab or after the
page that asked was left (Approve, Reject and Stop there too), or stopped when that page closes.

Screenshots go to ``var/screenshots/``; with ``RAGCHAT_DOC_IMAGES=1`` the approval test also
writes ``docs/images/chat-widget-tools.png`` (docs/tools.md's picture)."""

from __future__ import annotations

import os
import time
from datetime import date, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone
from selenium.webdriver.common.by import By

from django_ragchat.models import Conversation, Message, ToolInvocation
from django_ragchat.testing.openai_server import call, tool_calls
from example_project.orders.models import Order
from tests import test_browser
from tests.live_servers import QUICK_HEARTBEAT, caller_for
from tests.test_browser import ROOT, SCREENSHOTS, idle, js, open_chat, wait

# The browser and the page of tests/test_browser.py (fixtures found by name in this module).
browser = test_browser.browser
page = test_browser.page

# pairwise: on Django 5.x with PostgreSQL and 6.x with SQLite in scripts/test.sh (pyproject.toml).
pytestmark = [pytest.mark.browser, pytest.mark.pairwise, pytest.mark.django_db(transaction=True)]

ARRIVAL = date.today() + timedelta(days=2)


def signed_in_chat(driver, server, user, conversation) -> None:
    driver.get(f"{server.url}/chat/")  # a page of the site, to be allowed to set its cookie
    driver.add_cookie({"name": "sessionid", "value": caller_for(user).sessionid, "path": "/"})
    open_chat(driver, f"{server.url}/chat/")
    wait(driver, lambda d: js(d, "return document.querySelector('.ragchat-conversation.ragchat-open') !== null"))
    assert js(driver, "return document.querySelector('.ragchat-conversation.ragchat-open').dataset.id") == str(
        conversation.pk)


def send(driver, question: str) -> None:
    box = driver.find_element(By.CSS_SELECTOR, ".ragchat-input")
    box.clear()
    box.send_keys(question)
    driver.find_element(By.CSS_SELECTOR, ".ragchat-send").click()


def tool_lines(driver) -> list[dict]:
    return js(driver, """return [...document.querySelectorAll('.ragchat-assistant:last-of-type .ragchat-tool')].map(li => ({
        label: li.querySelector('.ragchat-tool-label').textContent,
        state: li.querySelector('.ragchat-tool-state').textContent,
        cls: li.className,
        open: li.querySelector('details').open,
        result: li.querySelector('.ragchat-tool-result').textContent,
        spinning: !li.querySelector('.ragchat-spinner').hidden,
        buttons: [...li.querySelectorAll('button')].map(b => b.textContent)}))""")


def record_tool_lines(driver) -> None:
    """Record every state a tool line of the page goes through: [label, state, spinning]."""
    js(driver, """window.__toolLines = [];
        new MutationObserver(() => {
          for (const li of document.querySelectorAll('.ragchat-tool')) {
            const row = [li.querySelector('.ragchat-tool-label').textContent,
                         li.querySelector('.ragchat-tool-state').textContent,
                         !li.querySelector('.ragchat-spinner').hidden];
            const last = window.__toolLines[window.__toolLines.length - 1];
            if (!last || last.join() !== row.join()) window.__toolLines.push(row);
          }
        }).observe(document.querySelector('.ragchat-log'), {subtree: true, childList: true, characterData: true,
                                                          attributes: true});""")


def shot(driver, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(SCREENSHOTS / f"{name}.png"))


def order(owner, number: str, status=Order.Status.SHIPPED, **fields) -> Order:
    defaults = {"items": "Aurora X2, 128 GB", "total": Decimal("699.00"), "placed_at": timezone.now(),
                "carrier": "PostNord", "tracking_number": "PN123456SE", "estimated_delivery": ARRIVAL}
    return Order.objects.create(owner=owner, number=number, status=status, **{**defaults, **fields})


def test_a_tool_call_shows_while_it_runs_and_its_result_folds_under_it(page, asgi, user, openai_server):
    order(user, "ORD-17")
    conversation = Conversation.objects.create(owner=user, profile="fake_tools", title="My order")
    openai_server.token_delay = 0.15  # the line is on the page while the arguments stream and the tool runs
    openai_server.script(
        tool_calls(call("order_status", order_number="ORD-17"), content="Let me check. "),
        f"Your order ORD-17 (Aurora X2, 128 GB) has shipped with PostNord, tracking PN123456SE. It should arrive "
        f"on {ARRIVAL:%A %d %B}.")
    signed_in_chat(page, asgi, user, conversation)
    record_tool_lines(page)
    send(page, "Where is my order ORD-17?")
    wait(page, idle)
    # While it ran (a few milliseconds: the recorder saw it), the line said what was being done.
    assert ["Looking up order ORD-17…", "", True] in js(page, "return window.__toolLines")
    line = tool_lines(page)[0]
    assert (line["label"], line["state"], line["spinning"], line["open"]) == ("Looking up order ORD-17", "Done",
                                                                             False, False)
    assert '"tracking_number": "PN123456SE"' in line["result"]  # folded, pretty
    page.find_element(By.CSS_SELECTOR, ".ragchat-assistant:last-of-type .ragchat-tool summary").click()
    assert tool_lines(page)[0]["open"]
    body = page.find_elements(By.CSS_SELECTOR, ".ragchat-assistant .ragchat-body")[-1].text
    assert body.startswith("Let me check. Your order ORD-17") and "PostNord" in body
    shot(page, "tools-done")
    # After a reload the saved message shows the same line, folded.
    page.refresh()
    open_chat(page, f"{asgi.url}/chat/")
    wait(page, lambda d: tool_lines(d))
    assert tool_lines(page)[0]["state"] == "Done" and not tool_lines(page)[0]["open"]


def approve_or_reject(driver, server, user, openai_server, *, choice: str) -> Order:
    pending = order(user, "ORD-18", status=Order.Status.PROCESSING, items="Nimbus Tab with stylus")
    conversation = Conversation.objects.create(owner=user, profile="fake_tools", title="Cancel an order")

    def final(body):
        result = [m for m in body["messages"] if m["role"] == "tool"][-1]["content"]
        return ("Done: order ORD-18 is cancelled." if '"cancelled"' in result and "error" not in result
                else "All right, I did not cancel it.")

    openai_server.script(tool_calls(call("cancel_order", order_number="ORD-18")), final)
    signed_in_chat(driver, server, user, conversation)
    send(driver, "Please cancel my order ORD-18.")
    wait(driver, lambda d: tool_lines(d) and tool_lines(d)[0]["buttons"])
    line = tool_lines(driver)[0]
    assert line["label"] == "Cancelling order ORD-18" and line["state"] == "Waiting for your approval"
    assert line["buttons"] == ["Approve", "Reject"] and line["open"] and '"order_number": "ORD-18"' in line["result"]
    assert Order.objects.get(pk=pending.pk).status == "processing"  # nothing runs before the decision
    assert driver.find_element(By.CSS_SELECTOR, ".ragchat-status").text == "Waiting for your approval…"
    shot(driver, f"tools-confirm-{server.name}")
    if choice == "approve" and os.environ.get("RAGCHAT_DOC_IMAGES") == "1":
        js(driver, "document.querySelector('.ragchat-notice')?.remove()")  # about the default profile, not this one
        driver.set_window_size(1000, 640)
        driver.save_screenshot(str(ROOT / "docs" / "images" / "chat-widget-tools.png"))
        driver.set_window_size(1200, 900)
    button = "ragchat-approve" if choice == "approve" else "ragchat-reject"
    driver.find_element(By.CSS_SELECTOR, f".ragchat-assistant:last-of-type .{button}").click()
    wait(driver, idle)
    shot(driver, f"tools-{choice}-{server.name}")
    return Order.objects.get(pk=pending.pk)


def test_approve_runs_a_call_that_needed_the_users_approval_over_the_websocket(page, asgi, user, openai_server):
    assert approve_or_reject(page, asgi, user, openai_server, choice="approve").status == "cancelled"
    line = tool_lines(page)[0]
    assert line["state"] == "Done" and line["buttons"] == []
    assert "cancelled" in page.find_elements(By.CSS_SELECTOR, ".ragchat-assistant .ragchat-body")[-1].text
    saved = ToolInvocation.objects.get()
    assert saved.status == "done" and saved.decided_by_id == user.pk


def test_reject_leaves_it_undone_and_works_through_the_rest_api_under_wsgi(page, wsgi, user, openai_server):
    assert approve_or_reject(page, wsgi, user, openai_server, choice="reject").status == "processing"
    line = tool_lines(page)[0]
    assert line["state"] == "Declined" and line["buttons"] == []
    assert page.find_elements(By.CSS_SELECTOR, ".ragchat-assistant .ragchat-body")[-1].text == (
        "All right, I did not cancel it.")
    assert ToolInvocation.objects.get().status == "rejected"
    assert js(page, "return performance.getEntriesByType('resource').some(e => e.name.includes('/decision/'))")


def test_approve_and_reject_are_scrolled_into_view_above_the_sources(page, asgi, user, openai_server):
    """An allotment site's trial: the message's six sources, listed below its calls, filled the
    log, which scrolled to its end: "Waiting for your approval…" with no button in sight."""
    from django_ragchat.ingestion.pipeline import ingest_paths

    ingest_paths([ROOT / "example_project" / "sample_docs"])
    order(user, "ORD-18", status=Order.Status.PROCESSING, items="Nimbus Tab with stylus")
    conversation = Conversation.objects.create(owner=user, profile="fake_tools", title="Cancel an order")
    openai_server.script(tool_calls(call("cancel_order", order_number="ORD-18")), "All right.")
    page.set_window_size(1000, 560)
    try:
        signed_in_chat(page, asgi, user, conversation)
        send(page, "Please cancel my order ORD-18 for the Nimbus Tab, and what is the returns policy?")
        wait(page, lambda d: tool_lines(d) and tool_lines(d)[0]["buttons"])
        assert js(page, "return document.querySelectorAll('.ragchat-assistant:last-of-type .ragchat-sources li').length") >= 3
        shot(page, "tools-confirm-in-view")
        assert js(page, """const log = document.querySelector('.ragchat-log').getBoundingClientRect();
            const box = document.querySelector('.ragchat-assistant:last-of-type .ragchat-approve').getBoundingClientRect();
            return box.top >= log.top && box.bottom <= log.bottom""")
    finally:
        page.set_window_size(1200, 900)


def test_stop_stops_a_running_tool(page, asgi, user, openai_server):
    conversation = Conversation.objects.create(owner=user, profile="fake_tools", title="Slow")
    openai_server.script(tool_calls(call("slow", seconds=60)), "never asked")
    signed_in_chat(page, asgi, user, conversation)
    send(page, "Take your time.")
    wait(page, lambda d: tool_lines(d) and tool_lines(d)[0]["spinning"])
    assert tool_lines(page)[0]["label"] == "Using slow…"
    shot(page, "tools-running")
    page.find_element(By.CSS_SELECTOR, ".ragchat-stop").click()
    wait(page, idle, timeout=10)
    line = tool_lines(page)[0]
    assert line["state"] == "Stopped" and not line["spinning"]
    assert "Stopped before the end." in page.find_elements(By.CSS_SELECTOR, ".ragchat-assistant .ragchat-note")[-1].text
    shot(page, "tools-stopped")
    assert ToolInvocation.objects.get().status == "cancelled"
    assert Message.objects.get(conversation=conversation, role="assistant").status == "incomplete"


# --- an answer waiting for approval, met again -----------------------------------------------------
# A new user's trial (gunicorn, server-sent events): asked on a desk page to cancel a booking, they
# went to the chat page and opened the conversation. The call said "Waiting…" with no Approve,
# Reject or Stop, and every message was refused "An answer is still being written" for two minutes.


def cancelled_or_not(body) -> str:
    result = [m for m in body["messages"] if m["role"] == "tool"][-1]["content"]
    return "Done: order ORD-18 is cancelled." if '"cancelled"' in result and "error" not in result else "Not done."


def ask_on_the_desk(driver, server, user, openai_server, *then) -> Order:
    """On the site's desk page (its widget's profile offers the order tools), ``user`` asks to
    cancel their order ORD-18; the call waits for their approval. The order."""
    pending = order(user, "ORD-18", status=Order.Status.PROCESSING, items="Nimbus Tab with stylus")
    openai_server.script(tool_calls(call("cancel_order", order_number="ORD-18")), *then)
    driver.get(f"{server.url}/chat/")  # a page of the site, to be allowed to set its cookie
    driver.add_cookie({"name": "sessionid", "value": caller_for(user).sessionid, "path": "/"})
    open_chat(driver, f"{server.url}/embed-tools/")
    send(driver, "Please cancel my order ORD-18.")
    wait(driver, lambda d: tool_lines(d) and tool_lines(d)[0]["buttons"])
    return pending


def waiting_again(driver) -> dict:
    """The chat page opened on the conversation: its call waits with Approve and Reject, Stop
    shows and Send waits. The call's line."""
    wait(driver, lambda d: tool_lines(d) and tool_lines(d)[0]["buttons"])
    line = tool_lines(driver)[0]
    assert (line["label"], line["state"], line["buttons"]) == (
        "Cancelling order ORD-18", "Waiting for your approval", ["Approve", "Reject"])
    assert line["open"] and '"order_number": "ORD-18"' in line["result"]
    assert driver.find_element(By.CSS_SELECTOR, ".ragchat-stop").is_displayed()
    assert not driver.find_element(By.CSS_SELECTOR, ".ragchat-send").is_enabled()
    return line


@pytest.mark.parametrize("server_name", ["wsgi", "asgi"])
def test_a_call_waiting_for_approval_is_approved_from_the_conversation_opened_in_another_tab(
        page, request, server_name, user, openai_server):
    server = request.getfixturevalue(server_name)
    pending = ask_on_the_desk(page, server, user, openai_server, cancelled_or_not)
    desk = page.current_window_handle
    page.switch_to.new_window("tab")
    open_chat(page, f"{server.url}/chat/")  # the newest conversation opens: the desk's
    waiting_again(page)
    shot(page, f"tools-opened-again-{server.name}")
    page.find_element(By.CSS_SELECTOR, ".ragchat-assistant:last-of-type .ragchat-approve").click()
    wait(page, idle)
    line = tool_lines(page)[0]
    assert (line["state"], line["buttons"]) == ("Done", [])
    assert page.find_elements(By.CSS_SELECTOR, ".ragchat-assistant .ragchat-body")[-1].text == (
        "Done: order ORD-18 is cancelled.")
    assert Order.objects.get(pk=pending.pk).status == "cancelled"
    assert ToolInvocation.objects.get().decided_by_id == user.pk
    page.close()
    page.switch_to.window(desk)  # the page that asked hears the end too
    wait(page, idle)
    assert tool_lines(page)[0]["state"] == "Done"


def test_stop_on_the_conversation_opened_again_frees_it_at_once_under_wsgi(page, wsgi, user, openai_server):
    pending = ask_on_the_desk(page, wsgi, user, openai_server, "All right, I left it as it is.")
    desk = page.current_window_handle
    page.switch_to.new_window("tab")
    open_chat(page, f"{wsgi.url}/chat/")
    waiting_again(page)
    page.find_element(By.CSS_SELECTOR, ".ragchat-stop").click()
    wait(page, idle, timeout=10)
    assert tool_lines(page)[0]["state"] == "Stopped"
    assert "Stopped before the end." in page.find_elements(By.CSS_SELECTOR, ".ragchat-assistant .ragchat-note")[-1].text
    assert ToolInvocation.objects.get().status == "cancelled"
    send(page, "Never mind.")  # taken at once, not refused
    wait(page, lambda d: "All right, I left it as it is." in d.find_elements(
        By.CSS_SELECTOR, ".ragchat-assistant .ragchat-body")[-1].text)
    assert Order.objects.get(pk=pending.pk).status == "processing"
    page.close()
    page.switch_to.window(desk)
    wait(page, lambda d: tool_lines(d)[0]["state"] == "Stopped")


def test_a_call_left_waiting_on_a_page_of_the_site_is_approved_on_the_chat_page_under_wsgi(page, wsgi, user,
                                                                                          openai_server):
    """The trial's steps, in one tab: asked on the desk page, then on to the chat page. Chromium
    keeps the desk page in its back-forward cache, stream and all: the answer still waits."""
    pending = ask_on_the_desk(page, wsgi, user, openai_server, cancelled_or_not)
    open_chat(page, f"{wsgi.url}/chat/")
    waiting_again(page)
    shot(page, "tools-left-and-opened-again")
    page.find_element(By.CSS_SELECTOR, ".ragchat-assistant:last-of-type .ragchat-approve").click()
    wait(page, idle)
    assert tool_lines(page)[0]["state"] == "Done"
    assert Order.objects.get(pk=pending.pk).status == "cancelled"


def test_closing_the_page_while_a_call_waits_stops_the_answer_within_two_heartbeats_under_wsgi(
        page, quick_wsgi, user, openai_server):
    """The page that asked is closed: its stream's keep-alive tells the WSGI worker, which stops
    the answer; the conversation, opened again, shows it stopped and takes a message."""
    chat = page.current_window_handle
    page.switch_to.new_window("tab")
    pending = ask_on_the_desk(page, quick_wsgi, user, openai_server, "All right, I left it as it is.")
    page.close()
    closed = time.monotonic()
    page.switch_to.window(chat)
    wait(page, lambda d: Message.objects.filter(role="assistant").exclude(status="streaming").exists(), timeout=10)
    assert time.monotonic() - closed < 2 * QUICK_HEARTBEAT + 3
    assert ToolInvocation.objects.get().status == "cancelled"
    open_chat(page, f"{quick_wsgi.url}/chat/")
    wait(page, lambda d: tool_lines(d) and tool_lines(d)[0]["state"] == "Stopped")
    wait(page, idle)
    send(page, "Never mind.")  # taken at once
    wait(page, lambda d: "All right, I left it as it is." in d.find_elements(
        By.CSS_SELECTOR, ".ragchat-assistant .ragchat-body")[-1].text)
    assert Order.objects.get(pk=pending.pk).status == "processing"
