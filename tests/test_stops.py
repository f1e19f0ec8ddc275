"""Stopping an answer from anywhere, and a client gone (docs/tools.md, "Stop"; turn/stops.py).

A new user's trial (gunicorn gthread, server-sent events, a tool with confirmation): they left
the page while "Waiting for your approval" showed and opened the conversation again. The call
waited with no Approve, Reject or Stop, and every new message was refused "An answer is still
being written" for two minutes, until the call was abandoned: the WSGI worker never learned
that its client had left, as it wrote nothing while the call waited.

Here: ``POST conversations/{id}/cancel/`` (and the websocket's ``cancel``) stops an answer
whatever transport and process write it; a stop asked for in another process reaches the turn
through the database (within half a second while a call waits, at its next heartbeat
otherwise); the conversation's detail shows the answer being written with its pending calls;
and a stream whose client left, under gunicorn as under uvicorn, stops within two heartbeats.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.urls import reverse
from django.utils import timezone

from django_ragchat.models import Conversation, Message, ToolInvocation, TurnTrace
from django_ragchat.testing.openai_server import call, tool_calls
from example_project.orders.models import Order
from tests import test_tools, tool_plugins
from tests.asgi import application
from tests.live_servers import QUICK_HEARTBEAT, caller_for, post_stream, sse_headers, sse_url, wait_for, words
from tests.test_api import API, client_for, messages_url, post_json
from tests.test_tools import chats, confirm_turn, events_of, make_order, pending_invocation, run_in_thread

# Tools query the database from threads of their own, and the servers are other processes.
pytestmark = pytest.mark.django_db(transaction=True)

# The profile with tools of tests/test_tools.py (a fixture found by name in this module).
use_tools = test_tools.use_tools


def awaiting_approval(use_tools, openai_server, user):
    """alice's turn (in a thread) waiting for her approval of an e-mail: (conversation, box, call)."""
    conversation, box = confirm_turn(use_tools, openai_server, user, stream=True)
    return conversation, box, pending_invocation()


def cancel_url(conversation) -> str:
    return f"{API}/conversations/{conversation.pk}/cancel/"


def assert_stopped(events: list[dict], status: str = "cancelled") -> dict:
    """The turn ended with ``error`` ``cancelled``, its answer saved "incomplete"; that answer."""
    stopped = events[-1]
    assert (stopped["type"], stopped["code"]) == ("error", "cancelled"), stopped
    answer = stopped["assistant_message"]
    assert answer["status"] == "incomplete" == Message.objects.get(pk=answer["id"]).status
    assert [c["status"] for c in answer["tool_calls"]] == [status] * len(answer["tool_calls"])
    return answer


def test_cancel_over_rest_stops_an_answer_waiting_for_an_approval_at_once(use_tools, openai_server, user,
                                                                         admin_client):
    conversation, box, pending = awaiting_approval(use_tools, openai_server, user)
    alice = client_for(user)
    started = time.monotonic()
    response = alice.post(cancel_url(conversation))  # no body: an action
    assert (response.status_code, response.json()) == (202, {"assistant_message_id": pending.message_id})
    box["thread"].join(10)
    assert time.monotonic() - started < 3
    answer = assert_stopped(box["result"])
    assert answer["tool_calls"][0]["error"]["code"] == "cancelled"
    assert tool_plugins.SENT == [] and len(chats(openai_server)) == 1  # not run, the model not asked again
    assert ToolInvocation.objects.get().status == "cancelled"
    # The admin's trace gives the call that never ran no time (a trial read "0.0 ms" as a run).
    trace = TurnTrace.objects.get(message_id=pending.message_id)
    page = admin_client.get(reverse("admin:django_ragchat_turntrace_change", args=[trace.pk])).content.decode()
    assert '<td class="ragchat-num"><span title="the tool did not run">—</span></td>' in page
    refused = post_json(alice, f"{API}/tool-calls/{pending.pk}/decision/", {"approve": True})
    assert (refused.status_code, refused.json()["code"]) == (409, "not_pending")
    # The conversation takes the next message at once.
    openai_server.script("All right.")
    assert post_json(alice, messages_url(conversation), {"content": "Never mind."}).status_code == 201
    nothing = alice.post(cancel_url(conversation))
    assert (nothing.status_code, nothing.json()["code"]) == (409, "not_in_progress")


def test_a_stop_asked_in_another_process_reaches_a_call_waiting_for_an_approval(use_tools, openai_server, user):
    conversation, box, pending = awaiting_approval(use_tools, openai_server, user)
    # What stops.request_stop writes from another worker: the rows only, no notice in this process.
    Message.objects.filter(pk=pending.message_id).update(stop_requested_at=timezone.now())
    ToolInvocation.objects.filter(pk=pending.pk).update(status="cancelled")
    started = time.monotonic()
    box["thread"].join(10)
    assert time.monotonic() - started < 2  # the wait reads its row every half second
    assert_stopped(box["result"])
    assert tool_plugins.SENT == [] and len(chats(openai_server)) == 1


def test_a_stop_asked_in_another_process_reaches_an_answer_being_written_at_its_heartbeat(
        use_tools, ragchat_settings_override, openai_server, user):
    use_tools([])
    ragchat_settings_override(STREAM_HEARTBEAT_SECONDS=0.2, STREAM_LEASE_SECONDS=5)
    openai_server.token_delay = 0.02
    openai_server.script(words(500))
    conversation = Conversation.objects.create(owner=user)
    box = run_in_thread(events_of, conversation, "Tell me everything.", stream=True)
    answer = wait_for(lambda: Message.objects.filter(conversation=conversation, role="assistant")
                      .exclude(content="").first())  # a heartbeat saved some text
    Message.objects.filter(pk=answer.pk).update(stop_requested_at=timezone.now())
    started = time.monotonic()
    box["thread"].join(10)
    assert time.monotonic() - started < 2
    stopped = assert_stopped(box["result"])
    assert stopped["content"].startswith("word0 word1") and "word499" not in stopped["content"]
    # The stage it was stopped in keeps its time: the trace's stages add up to most of its total,
    # the rest being the work between stages and the save (a new user's trial: a stopped answer's
    # trace had no llm time, the rows summing to a sliver of it). Over half, not a tighter share:
    # with four CI runs on two cores the work between stages took a quarter of it (435 of 591 ms).
    timings = TurnTrace.objects.get(message_id=stopped["id"]).data["timings"]
    stages = sum(ms for stage, ms in timings.items() if stage != "total")
    assert timings["llm"] > 100 and stages > 0.5 * timings["total"], timings


def test_a_websocket_cancel_stops_an_answer_another_transport_writes(use_tools, openai_server, user):
    conversation, box, _ = awaiting_approval(use_tools, openai_server, user)  # not on any socket
    cookie = caller_for(user).cookie_header.encode()

    async def cancel_from_a_socket():
        communicator = WebsocketCommunicator(application, f"/ws/ragchat/conversations/{conversation.pk}/", headers=[
            (b"origin", b"http://testserver"), (b"host", b"testserver"), (b"cookie", cookie)])
        assert (await communicator.connect())[0]
        await communicator.receive_json_from(timeout=10)  # ready
        await communicator.send_json_to({"type": "cancel", "conversation_id": str(conversation.pk)})
        for _ in range(100):  # the turn's thread ends (the socket's loop goes on meanwhile)
            if not box["thread"].is_alive():
                break
            await asyncio.sleep(0.1)
        await communicator.disconnect()

    async_to_sync(cancel_from_a_socket)()
    assert_stopped(box["result"])


def test_the_conversation_shows_the_answer_being_written_with_its_calls_awaiting_approval(
        use_tools, openai_server, user, reviewer):
    conversation, box, pending = awaiting_approval(use_tools, openai_server, user)
    alice = client_for(user)
    detail = alice.get(f"{API}/conversations/{conversation.pk}/").json()
    progress = detail["answer_in_progress"]
    assert progress["assistant_message_id"] == pending.message_id
    assert progress["cancel_url"] == f"http://testserver{cancel_url(conversation)}"
    [waiting] = progress["pending_tool_calls"]
    assert (waiting["name"], waiting["status"], waiting["confirmation_id"], waiting["arguments"]) == (
        "send_email", "pending", pending.pk, {"to": "bob@example.com", "body": "Hello"})
    assert waiting["decision_url"] == f"http://testserver{API}/tool-calls/{pending.pk}/decision/"
    # A reviewer reads it too, and may neither decide nor stop.
    assert client_for(reviewer).get(f"{API}/conversations/{conversation.pk}/").json()["answer_in_progress"]
    refused = client_for(reviewer).post(progress["cancel_url"])
    assert (refused.status_code, refused.json()["code"]) == (403, "forbidden")
    assert post_json(alice, waiting["decision_url"], {"approve": False}).status_code == 200  # the URL works
    box["thread"].join(10)
    assert alice.get(f"{API}/conversations/{conversation.pk}/").json()["answer_in_progress"] is None
    assert "answer_in_progress" not in alice.get(f"{API}/conversations/").json()["results"][0]


# --- real servers: a client gone, a stop from elsewhere ------------------------------------------------


@pytest.fixture(params=["gunicorn", "uvicorn"])
def quick_server(request):
    """Each test runs under gunicorn (WSGI, threads) and uvicorn (ASGI), beating every half second."""
    return request.getfixturevalue("quick_wsgi" if request.param == "gunicorn" else "quick_asgi")


def ask_to_cancel_an_order(server, user, openai_server):
    """alice asks, over server-sent events, to cancel her order ORD-18: (conversation, order, the
    open stream's client and response, the lines read until the call awaited her approval)."""
    order = make_order(user, "ORD-18", status=Order.Status.PROCESSING)
    conversation = Conversation.objects.create(owner=user, profile="fake_tools")
    openai_server.script(tool_calls(call("cancel_order", order_number="ORD-18")), "never asked")
    caller = caller_for(user)
    client = httpx.Client(cookies=caller.cookies, timeout=20)
    response = client.send(client.build_request("POST", sse_url(server, conversation.pk), headers=sse_headers(caller),
                                                json={"content": "Please cancel my order ORD-18."}), stream=True)
    lines = response.iter_lines()
    read = []
    for line in lines:
        read.append(line)
        if '"awaiting_confirmation"' in line:
            break
    return conversation, order, client, response, lines, read


def events_in(lines) -> list[dict]:
    return [json.loads(line[len("data: "):]) for line in lines if line.startswith("data: ")]


def test_a_client_that_leaves_while_a_call_awaits_approval_stops_the_answer_within_two_heartbeats(
        quick_server, user, openai_server):
    conversation, order, client, response, _, read = ask_to_cancel_an_order(quick_server, user, openai_server)
    assert events_in(read)[-1]["status"] == "awaiting_confirmation"
    response.close()
    client.close()  # the page left: the connection closed
    left = time.monotonic()
    answer = wait_for(lambda: Message.objects.filter(conversation=conversation, role="assistant")
                      .exclude(status="streaming").first(), timeout=4 * QUICK_HEARTBEAT + 3)
    assert time.monotonic() - left < 2 * QUICK_HEARTBEAT + 2
    assert answer.status == "incomplete" and ToolInvocation.objects.get().status == "cancelled"
    assert Order.objects.get(pk=order.pk).status == "processing"  # nothing ran
    # The conversation is free at once: the next message is answered, not refused.
    openai_server.script("All right.")
    reply, events = post_stream(quick_server, caller_for(user), conversation.pk, "Never mind.")
    assert reply.status_code == 200 and events[-1]["type"] == "done", reply.content


@pytest.mark.parametrize("asked_from", ["the same server", "another process"])
def test_a_stop_asked_by_another_client_ends_the_stream_that_waits_for_an_approval(
        quick_server, user, openai_server, asked_from):
    conversation, order, client, response, lines, read = ask_to_cancel_an_order(quick_server, user, openai_server)
    try:
        time.sleep(3 * QUICK_HEARTBEAT)  # quiet: the stream says it is alive meanwhile
        if asked_from == "the same server":
            caller = caller_for(user)
            stop = httpx.post(f"{quick_server.url}{cancel_url(conversation)}", cookies=caller.cookies,
                              headers={"X-CSRFToken": caller.csrftoken})
        else:
            stop = client_for(user).post(cancel_url(conversation))
        assert stop.status_code == 202, stop.content
        rest = list(lines)  # to the end of the stream
    finally:
        response.close()
        client.close()
    assert ": keep-alive" in rest or ": keep-alive" in read
    answer = assert_stopped(events_in(read + rest))
    assert answer["tool_calls"][0]["name"] == "cancel_order"
    assert Order.objects.get(pk=order.pk).status == "processing"
