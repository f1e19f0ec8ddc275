"""The chat widget's tool calls in headless Chromium, against real server processes and the
loopback model: "Looking up order ORD-17…" while the tool runs, its result folded under the
line once done, Approve and Reject for a call that needs the user's approval (over the
websocket under ASGI, through the REST API under WSGI), and Stop stopping a running tool.

Screenshots go to ``var/screenshots/``; with ``RAGCHAT_DOC_IMAGES=1`` the approval test also
writes ``docs/images/chat-widget-tools.png`` (docs/tools.md's picture)."""

from __future__ import annotations

import os
from datetime import date, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone
from selenium.webdriver.common.by import By

from django_ragchat.models import Conversation, Message, ToolInvocation
from django_ragchat.testing.openai_server import call, tool_calls
from example_project.orders.models import Order
from tests import test_browser
from tests.live_servers import caller_for
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
