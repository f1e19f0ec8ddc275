"""Tool calling in the turn, against the loopback OpenAI-compatible server (real HTTP), whole
and streamed: one call, parallel calls, a chain of steps, every way a call can fail (bad
arguments, an unknown tool, a raising tool, a timeout, a tool the user may not use), the step
limit, calls that need the user's approval (approved, rejected, abandoned), a follow-up turn
that refers to a tool's result, advisors around a call, isolation between users, and
retrieval offered as a tool. See docs/tools.md."""

from __future__ import annotations

import json
import re
import threading
import time
from decimal import Decimal

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Permission
from django.db import connection
from django.utils import timezone

from django_ragchat import hookimpl
from django_ragchat.models import Conversation, Message, ToolInvocation, TurnTrace
from django_ragchat.stages.responses import ResponseAugmenter
from django_ragchat.testing.openai_server import call, tool_calls
from django_ragchat.turn.confirmations import DecisionRefused, decide_tool_call
from django_ragchat.turn.pipeline import run_turn_sync, stream_turn
from example_project.orders.models import Order
from tests import tool_plugins
from tests.asgi import application
from tests.live_servers import caller_for
from tests.test_api import API, client_for, messages_url, post_json

# Tools query the database from threads of their own: the rows must be committed.
pytestmark = pytest.mark.django_db(transaction=True)

BOTH = pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
PLUGINS = ["tests.tool_plugins", "tests.tool_plugins.advisors", "example_project.orders.ragchat"]


@pytest.fixture
def use_tools(ragchat_settings_override, openai_server):
    """``use_tools(tools, **profile)``: the default profile answers with the loopback model and
    offers ``tools``; nothing is retrieved (the questions are about the site's data)."""

    def apply(tools, **profile):
        ragchat_settings_override(PLUGINS=PLUGINS, PROFILES={"default": {
            "llm": "openai", "tools": tools, "empty_context": "answer",
            "options": {"openai": {"base_url": openai_server.base_url, "max_retries": 0, "timeout": 10}},
            **profile,
        }})

    tool_plugins.CALLS.clear()
    tool_plugins.SENT.clear()
    return apply


def chats(openai_server) -> list[dict]:
    """The bodies of the chat completions requests the model server received, in order."""
    return [r.json for r in openai_server.requests if r.path.endswith("/chat/completions")]


def tool_messages(body: dict) -> list[dict]:
    """The tool results of this turn (after its user message), in order."""
    messages = body["messages"]
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    return [m for m in messages[last_user:] if m["role"] == "tool"]


def events_of(conversation, text, *, stream: bool, user=None) -> list[dict]:
    async def run():
        return [event.to_dict() async for event in stream_turn(conversation, text, stream=stream, user=user)]

    return async_to_sync(run)()


def echo_tool_results(body: dict) -> str:
    """A model that answers by quoting every tool result it was given."""
    return "Results: " + " | ".join(m["content"] for m in tool_messages(body))


def make_order(owner, number: str, **fields) -> Order:
    defaults = {"items": "Aurora X2, 128 GB", "total": Decimal("699.00"), "placed_at": timezone.now(),
                "status": Order.Status.SHIPPED, "carrier": "PostNord", "tracking_number": "PN123456SE",
                "estimated_delivery": timezone.now().date()}
    return Order.objects.create(owner=owner, number=number, **{**defaults, **fields})


# --- one call, parallel calls, a chain -------------------------------------------------------------


@BOTH
def test_one_call_runs_as_the_asking_user_and_the_model_answers_with_its_result(use_tools, openai_server, user,
                                                                                   stream):
    use_tools(["weather"])
    openai_server.script(tool_calls(call("weather", city="Lyon", id="call_w")), echo_tool_results)
    conversation = Conversation.objects.create(owner=user)
    events = events_of(conversation, "Is it warm in Lyon?", stream=stream)

    types = [e["type"] for e in events]
    assert types[:5] == ["ack", "status", "sources", "status", "tool_call"], types
    requested = events[4]
    assert requested == {"type": "tool_call", "id": "call_w", "name": "weather", "arguments": {"city": "Lyon"},
                         "label": "Checking the weather in Lyon…", "step": 1, "status": "requested",
                         "confirmation_id": None}
    result = next(e for e in events if e["type"] == "tool_result")
    assert result["status"] == "done" and result["error"] is None and result["ms"] >= 250
    assert json.loads(result["content"]) == {"city": "Lyon", "temperature": 21, "unit": "C", "asked_by": "alice"}
    assert types.index("tool_result") < len(types) - 1 and types[-1] == "done"
    assert ("delta" in types) is stream

    first, second = chats(openai_server)
    assert [t["function"]["name"] for t in first["tools"]] == ["weather"]
    assert first["tools"][0]["function"]["parameters"]["properties"]["unit"] == {
        "type": "string", "enum": ["C", "F"], "description": "Celsius or Fahrenheit.", "default": "C"}
    assert second["messages"][-2] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_w", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Lyon"}'}}]}
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "call_w", "content": result["content"]}

    done = events[-1]["message"]
    assert done["content"] == f"Results: {result['content']}" and done["status"] == "complete"
    assert [(t["id"], t["status"], t["label"]) for t in done["tool_calls"]] == [
        ("call_w", "done", "Checking the weather in Lyon…")]
    saved = ToolInvocation.objects.get()
    assert (saved.message_id, saved.call_id, saved.step, saved.index, saved.name, saved.status) == (
        done["id"], "call_w", 1, 0, "weather", "done")
    assert saved.content == result["content"] and saved.parsed_arguments == {"city": "Lyon"}
    trace = TurnTrace.objects.get(message_id=done["id"]).data
    assert trace["tools_offered"] == ["weather"] and trace["tool_steps"] == 1
    assert [(t["name"], t["status"], t["arguments"]) for t in trace["tools"]] == [("weather", "done", {"city": "Lyon"})]
    assert "tools" in trace["timings"]


def test_a_tool_question_goes_to_the_model_when_nothing_was_retrieved(use_tools, openai_server, user):
    # An outside user's trial: with the default empty_context ("decline"), a question no document
    # matched was declined before the model was asked, so the site's tool never ran.
    use_tools(["weather"], empty_context="decline")
    openai_server.script(tool_calls(call("weather", city="Lyon", id="call_w")), echo_tool_results)
    events = events_of(Conversation.objects.create(owner=user), "Is it warm in Lyon?", stream=False)
    assert [e["status"] for e in events if e["type"] == "tool_result"] == ["done"]
    assert events[-1]["message"]["content"].startswith("Results: ")
    # Without tools the profile still declines without asking the model.
    use_tools([], empty_context="decline")
    before = len(chats(openai_server))
    events = events_of(Conversation.objects.create(owner=user), "Is it warm in Lyon?", stream=False)
    assert len(chats(openai_server)) == before and events[-1]["type"] == "done"


@BOTH
def test_parallel_calls_run_concurrently_and_their_results_go_back_in_the_models_order(
        use_tools, openai_server, user, stream):
    use_tools(["weather"])
    openai_server.script(tool_calls(call("weather", city="Lyon", id="a"), call("weather", city="Oslo", id="b")),
                         echo_tool_results)
    conversation = Conversation.objects.create(owner=user)
    result = run_turn_sync(conversation, "Lyon or Oslo, which is warmer?", stream=stream)
    assert result.status == "complete"
    first, second = tool_plugins.CALLS
    assert second["started"] < first["ended"] and first["started"] < second["ended"]  # they overlapped
    assert [m["tool_call_id"] for m in tool_messages(chats(openai_server)[1])] == ["a", "b"]
    assert [json.loads(m["content"])["city"] for m in tool_messages(chats(openai_server)[1])] == ["Lyon", "Oslo"]
    assert list(ToolInvocation.objects.values_list("index", "call_id", "status")) == [(0, "a", "done"),
                                                                                        (1, "b", "done")]


def test_parallel_sync_tools_run_in_threads_of_their_own(use_tools, openai_server, user):
    use_tools(["slow_sync"])
    openai_server.script(tool_calls(call("slow_sync", seconds=0.4), call("slow_sync", seconds=0.4)), "ok")
    result = run_turn_sync(Conversation.objects.create(owner=user), "Wait twice.")
    assert result.status == "complete"
    first, second = tool_plugins.CALLS
    assert second["started"] < first["ended"] and first["started"] < second["ended"]  # neither waited


@BOTH
def test_a_chain_of_two_steps_feeds_each_result_to_the_next_step(use_tools, openai_server, user, stream):
    use_tools(["order_status", "weather"])
    make_order(user, "ORD-17")

    def second_step(body):
        order = json.loads(tool_messages(body)[0]["content"])
        return tool_calls(call("weather", city=order["carrier"] + " hub", id="s2"), content="One moment. ")

    openai_server.script(tool_calls(call("order_status", order_number="ord-17", id="s1")), second_step,
                         echo_tool_results)
    result = run_turn_sync(Conversation.objects.create(owner=user), "Where is ORD-17, and what weather is it in?",
                           stream=stream)
    assert result.status == "complete"
    requests = chats(openai_server)
    assert len(requests) == 3
    assert [m["tool_call_id"] for m in tool_messages(requests[2])] == ["s1", "s2"]
    assert requests[2]["messages"][-2]["content"] == "One moment. "  # the step's own text goes back with it
    assert result.answer.startswith("One moment. Results: ") and "PostNord hub" in result.answer
    assert list(ToolInvocation.objects.values_list("step", "name", "status")) == [(1, "order_status", "done"),
                                                                                  (2, "weather", "done")]
    assert result.trace["tool_steps"] == 2


# --- calls that fail: the model hears why, the turn goes on -----------------------------------------


@BOTH
@pytest.mark.parametrize(("arguments", "expected"), [
    ('{"city": 12}', "city: 12 is not of type 'string'"),
    ('{"city": "Lyon", "unit": "K"}', "unit: 'K' is not one of ['C', 'F']"),
    ('{"town": "Lyon"}', "'city' is a required property"),
    ('{"city": "Ly', "The arguments are not valid JSON"),
], ids=["wrong-type", "not-in-enum", "missing", "malformed-json"])
def test_bad_arguments_are_an_error_the_model_reads_and_the_tool_never_runs(use_tools, openai_server, user,
                                                                          arguments, expected, stream):
    use_tools(["weather"])
    openai_server.script(tool_calls(call("weather", arguments, id="bad")), echo_tool_results)
    result = run_turn_sync(Conversation.objects.create(owner=user), "Weather?", stream=stream)
    assert result.status == "complete"
    seen = json.loads(tool_messages(chats(openai_server)[1])[0]["content"])
    assert seen["error"] == "invalid_arguments" and expected in seen["message"]
    saved = ToolInvocation.objects.get()
    assert saved.status == "error" and saved.error["code"] == "invalid_arguments" and saved.arguments == arguments
    assert saved.ms < 250  # weather sleeps 0.3 s when it runs


@BOTH
def test_an_unknown_tool_is_an_error_result(use_tools, openai_server, user, stream):
    use_tools(["weather"])
    openai_server.script(tool_calls(call("drop_tables", id="x")), echo_tool_results)
    result = run_turn_sync(Conversation.objects.create(owner=user), "Do something.", stream=stream)
    assert result.status == "complete"
    assert json.loads(tool_messages(chats(openai_server)[1])[0]["content"])["error"] == "unknown_tool"
    assert ToolInvocation.objects.get().error["code"] == "unknown_tool"


@BOTH
def test_a_raising_tool_is_an_error_result_that_leaks_nothing(use_tools, openai_server, user, stream, caplog):
    use_tools(["explode", "refuse"])
    openai_server.script(tool_calls(call("explode", id="e"), call("refuse", reason="it is Sunday", id="r")),
                         echo_tool_results)
    events = events_of(Conversation.objects.create(owner=user), "Try both.", stream=stream)
    assert events[-1]["type"] == "done" and events[-1]["message"]["status"] == "complete"
    results = {e["id"]: e for e in events if e["type"] == "tool_result"}
    assert results["e"]["error"]["code"] == "tool_failed"
    assert results["r"]["error"] == {"code": "tool_error", "message": "Cannot do that: it is Sunday"}
    sent = json.dumps(chats(openai_server)[1]) + json.dumps(events)
    assert "secret database password" not in sent  # neither the model nor the user reads the exception
    assert "secret database password" in caplog.text
    # Staff read what it raised in the admin trace (a plugin author found only "tool_failed").
    raised = {t["id"]: t.get("raised", "") for t in TurnTrace.objects.get().data["tools"]}
    assert raised == {"e": "RuntimeError('secret database password in a traceback')", "r": ""}


@BOTH
def test_a_tool_over_its_timeout_is_an_error_result_and_is_cancelled(use_tools, openai_server, user, stream):
    use_tools(["slow"], tool_timeout=0.3)
    openai_server.script(tool_calls(call("slow", seconds=5, id="t")), echo_tool_results)
    started = time.monotonic()
    result = run_turn_sync(Conversation.objects.create(owner=user), "Wait.", stream=stream)
    assert result.status == "complete" and time.monotonic() - started < 3
    seen = json.loads(tool_messages(chats(openai_server)[1])[0]["content"])
    assert seen == {"error": "timeout", "message": "The tool did not answer within 0.3 seconds."}
    assert tool_plugins.CALLS[0]["cancelled"] is True


def test_a_result_json_cannot_carry_is_an_error_result(use_tools, openai_server, user):
    use_tools(["unserialisable"])
    openai_server.script(tool_calls(call("unserialisable")), echo_tool_results)
    result = run_turn_sync(Conversation.objects.create(owner=user), "Go.")
    assert result.status == "complete" and '"error": "bad_result"' in result.answer


@BOTH
def test_the_step_limit_bounds_the_rounds_and_the_last_request_forbids_tools(use_tools, openai_server, user,
                                                                            stream):
    use_tools(["weather"], max_tool_steps=2)

    def always_call(body):
        if body.get("tool_choice") == "none":
            return "I have to stop looking things up now."
        return tool_calls(call("weather", city=f"City{len(tool_messages(body))}"))

    openai_server.when("", always_call)
    result = run_turn_sync(Conversation.objects.create(owner=user), "Check every city.", stream=stream)
    assert result.status == "complete" and result.answer == "I have to stop looking things up now."
    requests = chats(openai_server)
    assert len(requests) == 3
    assert [r.get("tool_choice") for r in requests] == [None, None, "none"]
    assert all(r["tools"] for r in requests)  # still listed: the history has calls to them
    assert result.trace["tool_steps"] == 2 and result.trace["tool_step_limit_reached"] is True
    assert ToolInvocation.objects.count() == 2


@BOTH
def test_a_model_failing_after_a_call_fails_the_turn_and_keeps_the_call(use_tools, openai_server, user, stream):
    use_tools(["weather"])

    def broken(body):
        raise RuntimeError("the model server fell over")

    openai_server.script(tool_calls(call("weather", city="Lyon"), content="Checking. "), broken)
    result = run_turn_sync(Conversation.objects.create(owner=user), "Weather?", stream=stream)
    assert result.status == "error" and result.error.code == "model_unavailable"
    assert result.answer == "Checking. "  # what the model had written is kept
    assert ToolInvocation.objects.get().status == "done"
    assert [t["status"] for t in result.trace["tools"]] == ["done"] and result.trace["tool_steps"] == 1


class UnsavableTrace(ResponseAugmenter):
    """A plugin's bug: leaves in the trace what JSON cannot hold."""

    name = "unsavable_trace"
    enabled_by_default = False

    def augment(self, answer, turn):
        turn.trace["plugin"] = {"started": object()}
        return answer


class UnsavablePlugin:
    @staticmethod
    @hookimpl
    def register_response_augmenters(register):
        register(UnsavableTrace)


def test_a_tool_run_is_saved_with_an_answer_that_could_not_be_saved_whole(use_tools, openai_server, user,
                                                                          ragchat_settings_override):
    """The answer's trace cannot be saved (a plugin's bug), so the answer is saved as an error
    without it (``persistence.release_answer``); the tool did run, and its row says so rather
    than "running" for good."""
    use_tools(["weather"], response_augmenters=["citations", "unsavable_trace"])
    ragchat_settings_override(PLUGINS=[*PLUGINS, "tests.test_tools.UnsavablePlugin"])
    openai_server.script(tool_calls(call("weather", city="Lyon")), echo_tool_results)
    result = run_turn_sync(Conversation.objects.create(owner=user), "Weather?")
    assert result.status == "error" and result.error.code == "internal_error"
    assert ToolInvocation.objects.get().status == "done"


# --- who may use a tool ---------------------------------------------------------------------------------


@BOTH
def test_a_tool_the_user_may_not_use_is_not_offered_and_never_runs_if_called(use_tools, openai_server, user,
                                                                             stream):
    use_tools(["weather", "staff_directory", "audit_log"])
    openai_server.script(tool_calls(call("staff_directory", id="s"), call("audit_log", id="a")), echo_tool_results)
    result = run_turn_sync(Conversation.objects.create(owner=user), "Who works here?", stream=stream)
    first, second = chats(openai_server)
    assert [t["function"]["name"] for t in first["tools"]] == ["weather"]
    refused = [json.loads(m["content"]) for m in tool_messages(second)]
    assert [r["error"] for r in refused] == ["forbidden", "forbidden"]
    assert "Ada" not in result.answer and "nothing happened" not in result.answer
    assert result.trace["tools_offered"] == ["weather"]


def test_a_tool_is_offered_to_a_user_with_its_permission(use_tools, openai_server, user, staff_user):
    use_tools(["staff_directory", "audit_log"])
    user.user_permissions.add(Permission.objects.get(codename="view_user", content_type__app_label="auth"))
    openai_server.script(tool_calls(call("staff_directory")), echo_tool_results)
    result = run_turn_sync(Conversation.objects.create(owner=user), "Who works here?")
    assert [t["function"]["name"] for t in chats(openai_server)[0]["tools"]] == ["staff_directory"]
    assert result.answer == 'Results: ["Ada", "Grace"]'
    openai_server.reset()
    openai_server.script("fine")
    run_turn_sync(Conversation.objects.create(owner=staff_user), "Anything logged?")
    assert [t["function"]["name"] for t in chats(openai_server)[0]["tools"]] == ["audit_log"]


def test_an_anonymous_visitor_is_not_offered_the_order_tools(use_tools, openai_server):
    use_tools(["order_status", "weather"])
    openai_server.script("Sign in to see your orders.")
    conversation = Conversation.objects.create(session_key="visitor-session")
    result = run_turn_sync(conversation, "Where is my order ORD-17?")
    assert result.status == "complete"
    assert [t["function"]["name"] for t in chats(openai_server)[0]["tools"]] == ["weather"]


def test_bob_asking_for_alices_order_through_the_tool_gets_nothing_of_it(use_tools, openai_server, user,
                                                                          other_user):
    use_tools(["order_status"])
    make_order(user, "ORD-17", items="Nimbus Tab with stylus", tracking_number="ALICE-TRACK-1",
               total=Decimal("4817.63"))
    make_order(other_user, "ORD-18", items="Zephyr Buds")
    openai_server.script(tool_calls(call("order_status", order_number="ORD-17", id="probe")), echo_tool_results)
    bobs = Conversation.objects.create(owner=other_user)
    events = events_of(bobs, "Where is order ORD-17?", stream=True)

    result = next(e for e in events if e["type"] == "tool_result")
    assert result["error"] == {"code": "tool_error", "message": "There is no order ORD-17 on this customer's account."}
    everything = json.dumps(events) + json.dumps(chats(openai_server)) + json.dumps(list(
        ToolInvocation.objects.values("content", "arguments"))) + json.dumps(TurnTrace.objects.get().data)
    for secret in ("Nimbus Tab", "ALICE-TRACK-1", "PostNord"):
        assert secret not in everything
    # Her total as a number on its own: the trace's millisecond timings are digits too.
    assert not re.search(r"(?<![\d.])4817\.63(?!\d)", everything)
    # The same answer as for an order that exists nowhere: numbers cannot be probed.
    openai_server.script(tool_calls(call("order_status", order_number="ORD-99999")), echo_tool_results)
    other = run_turn_sync(bobs, "And ORD-99999?")
    assert other.answer.replace("ORD-99999", "ORD-17") == events[-1]["message"]["content"]
    # Bob's own order is his to see.
    openai_server.script(tool_calls(call("order_status", order_number="ORD-18")), echo_tool_results)
    assert "Zephyr Buds" in run_turn_sync(bobs, "And ORD-18?").answer


# --- calls that need the user's approval ------------------------------------------------------------


def run_in_thread(function, *args, **kwargs) -> dict:
    """Run ``function`` in a thread (the turn waits for a decision the test makes meanwhile)."""
    box: dict = {}

    def target():
        try:
            box["result"] = function(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=target)
    thread.start()
    box["thread"] = thread
    return box


def pending_invocation(timeout: float = 10.0) -> ToolInvocation:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = ToolInvocation.objects.filter(status="pending").first()
        if found is not None:
            return found
        time.sleep(0.02)
    raise AssertionError("no tool call awaited a decision")


def confirm_turn(use_tools, openai_server, user, *, stream: bool, **profile):
    use_tools(["send_email", "weather"], **profile)
    openai_server.script(tool_calls(call("send_email", to="bob@example.com", body="Hello", id="mail")),
                         echo_tool_results)
    conversation = Conversation.objects.create(owner=user)
    return conversation, run_in_thread(events_of, conversation, "E-mail Bob hello.", stream=stream)


@BOTH
def test_an_approved_call_runs_once_approved(use_tools, openai_server, user, stream):
    conversation, box = confirm_turn(use_tools, openai_server, user, stream=stream)
    pending = pending_invocation()
    assert tool_plugins.SENT == []  # nothing runs before the decision
    decided = decide_tool_call(pending.pk, user, None, approve=True)
    assert decided.status == "approved"
    box["thread"].join(10)
    events = box["result"]
    statuses = [(e["type"], e.get("status")) for e in events if e["type"].startswith("tool_")]
    assert statuses == [("tool_call", "requested"), ("tool_call", "awaiting_confirmation"),
                        ("tool_call", "approved"), ("tool_result", "done")]
    awaiting = next(e for e in events if e.get("status") == "awaiting_confirmation")
    assert awaiting["confirmation_id"] == pending.pk and awaiting["label"] == "Sending an e-mail to bob@example.com…"
    assert tool_plugins.SENT == [{"to": "bob@example.com", "body": "Hello", "by": "alice"}]
    saved = ToolInvocation.objects.get()
    assert (saved.pk, saved.status, saved.decided_by_id, saved.requires_confirmation) == (pending.pk, "done",
                                                                                          user.pk, True)
    assert saved.decided_at is not None
    assert events[-1]["message"]["tool_calls"][0]["confirmation_id"] == pending.pk


@BOTH
def test_a_rejected_call_never_runs_and_the_model_hears_it_was_declined(use_tools, openai_server, user, stream):
    conversation, box = confirm_turn(use_tools, openai_server, user, stream=stream)
    decide_tool_call(pending_invocation().pk, user, None, approve=False)
    box["thread"].join(10)
    events = box["result"]
    assert tool_plugins.SENT == []
    result = next(e for e in events if e["type"] == "tool_result")
    assert result["status"] == "rejected" and result["error"]["code"] == "rejected"
    assert json.loads(tool_messages(chats(openai_server)[1])[0]["content"])["error"] == "rejected"
    assert events[-1]["message"]["status"] == "complete"
    assert ToolInvocation.objects.get().status == "rejected"


@BOTH
def test_an_abandoned_call_never_runs(use_tools, openai_server, user, stream):
    conversation, box = confirm_turn(use_tools, openai_server, user, stream=stream, tool_confirmation_timeout=0.6)
    pending = pending_invocation()
    box["thread"].join(10)
    assert tool_plugins.SENT == []
    result = next(e for e in box["result"] if e["type"] == "tool_result")
    assert result["status"] == "abandoned"
    assert ToolInvocation.objects.get().status == "abandoned"
    with pytest.raises(DecisionRefused) as refused:  # too late
        decide_tool_call(pending.pk, user, None, approve=True)
    assert refused.value.code == "not_pending"
    assert tool_plugins.SENT == []


def test_the_user_approves_the_call_that_will_run_even_when_an_advisor_changed_it(use_tools, openai_server, user):
    conversation, box = confirm_turn(use_tools, openai_server, user, stream=True, advisors=["signed_mail"])
    pending = pending_invocation()
    signed = "Hello\n-- sent by the assistant"
    assert pending.parsed_arguments == {"to": "bob@example.com", "body": signed}
    decide_tool_call(pending.pk, user, None, approve=True)
    box["thread"].join(10)
    awaiting = next(e for e in box["result"] if e.get("status") == "awaiting_confirmation")
    assert awaiting["arguments"]["body"] == signed  # shown to the user as it ran
    assert tool_plugins.SENT == [{"to": "bob@example.com", "body": signed, "by": "alice"}]
    assert ToolInvocation.objects.get().parsed_arguments["body"] == signed


def test_only_the_conversations_owner_decides(use_tools, openai_server, user, other_user, reviewer):
    conversation, box = confirm_turn(use_tools, openai_server, user, stream=True, tool_confirmation_timeout=5)
    pending = pending_invocation()
    with pytest.raises(DecisionRefused) as bob:
        decide_tool_call(pending.pk, other_user, None, approve=True)
    assert bob.value.code == "not_found"  # as for an id that does not exist
    with pytest.raises(DecisionRefused) as staff:
        decide_tool_call(pending.pk, reviewer, None, approve=True)
    assert staff.value.code == "forbidden"  # a reviewer reads the conversation, and decides nothing
    decide_tool_call(pending.pk, user, None, approve=False)
    with pytest.raises(DecisionRefused) as twice:
        decide_tool_call(pending.pk, user, None, approve=True)
    assert twice.value.code == "not_pending"
    box["thread"].join(10)
    assert tool_plugins.SENT == [] and ToolInvocation.objects.get().status == "rejected"


def test_a_decision_made_in_another_process_reaches_the_turn_through_the_database(use_tools, openai_server, user):
    # What another worker does: the UPDATE only, no in-process notification.
    conversation, box = confirm_turn(use_tools, openai_server, user, stream=True)
    pending = pending_invocation()
    ToolInvocation.objects.filter(pk=pending.pk, status="pending").update(status="approved", decided_by=user,
                                                                          decided_at=timezone.now())
    box["thread"].join(10)
    assert tool_plugins.SENT and ToolInvocation.objects.get().status == "done"


# --- memory: a later turn sees the calls and results ------------------------------------------------------


@BOTH
def test_a_follow_up_turn_sees_the_earlier_tool_calls_and_results_in_openai_format(use_tools, openai_server, user,
                                                                                   stream):
    use_tools(["order_status"])
    make_order(user, "ORD-17", estimated_delivery=timezone.now().date().replace(day=28))
    openai_server.script(tool_calls(call("order_status", order_number="ORD-17", id="o1")),
                         "ORD-17 has shipped with PostNord.")
    conversation = Conversation.objects.create(owner=user)
    run_turn_sync(conversation, "Where is my order ORD-17?", stream=stream)

    def from_history(body):
        earlier = json.loads(next(m for m in body["messages"] if m["role"] == "tool")["content"])
        return f"It should arrive on {earlier['estimated_delivery']}."

    openai_server.script(from_history)
    follow_up = run_turn_sync(conversation, "When will it arrive?", stream=stream)
    assert follow_up.answer == f"It should arrive on {timezone.now().date().replace(day=28).isoformat()}."
    messages = chats(openai_server)[-1]["messages"]
    roles = [(m["role"], bool(m.get("tool_calls"))) for m in messages]
    assert roles == [("system", False), ("user", False), ("assistant", True), ("tool", False), ("assistant", False),
                     ("user", False)]
    assert messages[2]["tool_calls"][0]["id"] == messages[3]["tool_call_id"] == "o1"
    assert messages[4]["content"] == "ORD-17 has shipped with PostNord."
    assert follow_up.trace["history"]["messages"] == 4


def test_the_tool_steps_of_old_turns_count_against_the_history_budget(use_tools, openai_server, user):
    use_tools(["weather"], context_window=2000, max_answer_tokens=200, history_share=0.3)
    conversation = Conversation.objects.create(owner=user)
    for city in ("Lyon", "Oslo", "Rome", "Nice"):
        openai_server.script(tool_calls(call("weather", city=city + " " + "x" * 400)), f"Fine in {city}.")
        run_turn_sync(conversation, f"Weather in {city}?")
    openai_server.script("ok")
    result = run_turn_sync(conversation, "Thanks.")
    history = chats(openai_server)[-1]["messages"][1:-1]
    assert 0 < len([m for m in history if m["role"] == "tool"]) < 4  # the oldest whole turns were left out
    assert result.trace["prompt"]["history_tokens"] <= result.trace["prompt"]["history_budget"]
    assert history[0]["role"] == "user"  # whole turns: never a result without its call


def test_a_profile_without_tools_sends_earlier_turns_as_text_only(ragchat_settings_override, use_tools,
                                                                 openai_server, user):
    use_tools(["weather"])
    conversation = Conversation.objects.create(owner=user)
    openai_server.script(tool_calls(call("weather", city="Lyon")), "Warm.")
    run_turn_sync(conversation, "Weather in Lyon?")
    ragchat_settings_override(PROFILES={"default": {"llm": "openai", "empty_context": "answer", "options": {
        "openai": {"base_url": openai_server.base_url, "max_retries": 0}}}})
    openai_server.script("ok")
    run_turn_sync(conversation, "Thanks.")
    last = chats(openai_server)[-1]
    assert "tools" not in last and [m["role"] for m in last["messages"]] == ["system", "user", "assistant", "user"]


# --- advisors around a call -----------------------------------------------------------------------


@BOTH
def test_around_tool_can_answer_a_call_itself_or_change_it(use_tools, openai_server, user, stream):
    use_tools(["weather"], advisors=["cached_weather"])
    openai_server.script(tool_calls(call("weather", city="Atlantis", id="c"), call("weather", city="lyon", id="l")),
                         echo_tool_results)
    started = time.monotonic()
    result = run_turn_sync(Conversation.objects.create(owner=user), "Atlantis and Lyon?", stream=stream)
    assert time.monotonic() - started < 2
    cached, changed = (json.loads(m["content"].removesuffix(" (checked)")) for m in
                       tool_messages(chats(openai_server)[1]))
    assert cached == {"city": "Atlantis", "temperature": 4, "unit": "C", "source": "cache"}
    assert changed["city"] == "LYON"  # the advisor changed the call before the tool saw it
    assert tool_messages(chats(openai_server)[1])[1]["content"].endswith(" (checked)")
    traced = {t["id"]: t for t in result.trace["tools"]}
    assert traced["c"]["short_circuited_by"] == "cached_weather" and "short_circuited_by" not in traced["l"]
    assert traced["c"]["ms"] < 100 <= traced["l"]["ms"]


# --- retrieval as a tool ----------------------------------------------------------------------------------


@BOTH
def test_with_retrieval_as_a_tool_the_model_searches_when_and_for_what_it_decides(
        ragchat_settings_override, product_corpus, openai_server, user, stream):
    ragchat_settings_override(PROFILES={"default": {
        "llm": "openai", "retrieval": "tool",
        "options": {"openai": {"base_url": openai_server.base_url, "max_retries": 0}}}})

    def cite(body):
        passages = tool_messages(body)[0]["content"]
        assert passages.startswith("[1] ")
        return "The Aurora X2 costs $699 [1]." if "$699" in passages else "Not found."

    openai_server.script(tool_calls(call("search_documents", query="Aurora X2 price")), cite)
    events = events_of(Conversation.objects.create(owner=user), "How much is that phone with the titanium frame?",
                       stream=stream)
    first = chats(openai_server)[0]
    assert [t["function"]["name"] for t in first["tools"]] == ["search_documents"]
    assert "Context passages" not in json.dumps(first["messages"])  # nothing retrieved before the model asked
    assert "search_documents tool" in first["messages"][0]["content"]
    types = [e["type"] for e in events]
    assert "retrieving" not in json.dumps(events)
    sources = [e for e in events if e["type"] == "sources"]
    assert sources[0]["sources"] == [] and sources[-1]["sources"]  # the passages the model may cite, once found
    assert types.index("tool_result") < types.index("sources", types.index("tool_result"))
    done = events[-1]["message"]
    assert done["content"] == "The Aurora X2 costs $699 [1]." and done["citations"][0]["index"] == 1
    assert done["sources"] and "Aurora" in done["sources"][0]["title"]
    trace = TurnTrace.objects.get(message_id=done["id"]).data
    assert [r["query"] for r in trace["retrieval"]] == ["Aurora X2 price"]
    # The search's own post-processing, tagged with its query (turn.changes).
    assert [(s["by"], s["query"]) for s in trace["postprocess"]] == [
        ("similarity_threshold", "Aurora X2 price"), ("top_k", "Aurora X2 price")]


def test_the_extractive_answerer_is_offered_no_tools_and_retrieves_as_usual(ragchat_settings_override,
                                                                           product_corpus, user):
    ragchat_settings_override(PLUGINS=PLUGINS, PROFILES={"default": {"tools": ["weather"], "retrieval": "tool"}})
    result = run_turn_sync(Conversation.objects.create(owner=user), "How much does the Aurora X2 cost?")
    assert "$699" in result.answer and result.message["tool_calls"] == []
    assert "tools" not in result.trace and "tools" not in result.trace["timings"]
    assert result.trace["retrieval"]


# --- the protocol on the websocket: events, decisions, Stop ---------------------------------------------


def socket_chat(cookie: str):
    return WebsocketCommunicator(application, "/ws/ragchat/", headers=[
        (b"origin", b"http://testserver"), (b"host", b"testserver"), (b"cookie", cookie.encode())])


async def ask_on_socket(cookie: str, conversation, content: str, **frame) -> WebsocketCommunicator:
    """A connected socket that has sent ``content`` to ``conversation`` (its ready frame read)."""
    communicator = socket_chat(cookie)
    assert (await communicator.connect())[0]
    await communicator.receive_json_from(timeout=10)  # ready
    await communicator.send_json_to({"type": "message", "content": content, "conversation_id": str(conversation.pk),
                                     **frame})
    return communicator


async def frames_until(communicator, predicate, timeout: float = 10) -> list[dict]:
    frames = []
    while not frames or not predicate(frames[-1]):
        frames.append(await communicator.receive_json_from(timeout=timeout))
    return frames


def test_a_tool_decision_frame_approves_a_call_over_the_websocket(use_tools, openai_server, user):
    use_tools(["send_email"])
    openai_server.script(tool_calls(call("send_email", to="bob@example.com", body="Hi", id="m")), echo_tool_results)
    conversation = Conversation.objects.create(owner=user)
    cookie = caller_for(user).cookie_header

    async def chat():
        communicator = await ask_on_socket(cookie, conversation, "Mail Bob.", client_id="c1")
        frames = await frames_until(communicator, lambda f: f.get("status") == "awaiting_confirmation")
        await communicator.send_json_to({"type": "tool_decision", "confirmation_id": "twelve", "approve": True})
        frames += await frames_until(communicator, lambda f: f["type"] == "error")
        await communicator.send_json_to({"type": "tool_decision", "confirmation_id": frames[-2]["confirmation_id"],
                                         "approve": True, "client_id": "d1"})
        frames += await frames_until(communicator, lambda f: f["type"] in ("done",))
        await communicator.disconnect()
        return frames

    frames = async_to_sync(chat)()
    refused = next(f for f in frames if f["type"] == "error")
    assert refused["code"] == "not_found"  # no tool call has that id, as REST's URL answers it
    decision = next(f for f in frames if f["type"] == "tool_decision")
    assert decision == {"type": "tool_decision", "confirmation_id": ToolInvocation.objects.get().pk,
                        "status": "approved", "conversation_id": str(conversation.pk), "client_id": "d1"}
    tool_frames = [(f["type"], f.get("status")) for f in frames if f["type"].startswith("tool_") and f["type"] !=
                   "tool_decision"]
    assert tool_frames == [("tool_call", "requested"), ("tool_call", "awaiting_confirmation"),
                           ("tool_call", "approved"), ("tool_result", "done")]
    assert all(f["client_id"] == "c1" for f in frames if f["type"] in ("tool_call", "tool_result"))
    assert tool_plugins.SENT == [{"to": "bob@example.com", "body": "Hi", "by": "alice"}]


@BOTH
def test_stop_during_a_tool_cancels_it_and_keeps_what_was_said(use_tools, openai_server, user, stream):
    use_tools(["slow"], stream=stream)  # the socket's turns follow the profile
    openai_server.script(tool_calls(call("slow", seconds=30, id="s"), content="Let me wait. "), "never asked")
    conversation = Conversation.objects.create(owner=user)
    cookie = caller_for(user).cookie_header

    async def chat():
        communicator = await ask_on_socket(cookie, conversation, "Wait for it.")
        frames = await frames_until(communicator, lambda f: f["type"] == "tool_call")
        started = time.monotonic()
        await communicator.send_json_to({"type": "cancel"})
        frames += await frames_until(communicator, lambda f: f["type"] == "error")
        await communicator.disconnect()
        return frames, time.monotonic() - started

    frames, stopping = async_to_sync(chat)()
    assert stopping < 3
    stopped = frames[-1]
    assert stopped["code"] == "cancelled" and stopped["assistant_message"]["status"] == "incomplete"
    assert stopped["assistant_message"]["content"] == "Let me wait. "
    assert stopped["assistant_message"]["tool_calls"][0]["status"] == "cancelled"
    assert tool_plugins.CALLS[0]["cancelled"] is True
    assert len(chats(openai_server)) == 1  # the model was not asked again
    saved = ToolInvocation.objects.get()
    assert saved.status == "cancelled" and saved.error["code"] == "cancelled"
    assert Message.objects.get(pk=stopped["assistant_message"]["id"]).status == "incomplete"


def test_stop_while_a_call_awaits_approval_cancels_it(use_tools, openai_server, user):
    use_tools(["send_email"])
    openai_server.script(tool_calls(call("send_email", to="bob@example.com", body="Hi")), "never asked")
    conversation = Conversation.objects.create(owner=user)
    cookie = caller_for(user).cookie_header

    async def chat():
        communicator = await ask_on_socket(cookie, conversation, "Mail Bob.")
        frames = await frames_until(communicator, lambda f: f.get("status") == "awaiting_confirmation")
        await communicator.send_json_to({"type": "cancel"})
        frames += await frames_until(communicator, lambda f: f["type"] == "error")
        awaiting = next(f for f in frames if f.get("status") == "awaiting_confirmation")
        await communicator.send_json_to({"type": "tool_decision", "confirmation_id": awaiting["confirmation_id"],
                                         "approve": True})
        frames += await frames_until(communicator, lambda f: f["type"] == "error")
        await communicator.disconnect()
        return frames

    frames = async_to_sync(chat)()
    assert frames[-2]["code"] == "cancelled"
    assert frames[-1]["code"] == "not_pending"  # a decision after the Stop changes nothing
    assert ToolInvocation.objects.get().status == "cancelled" and tool_plugins.SENT == []


# --- the REST API: a message's tool calls, a decision -----------------------------------------------


def test_the_rest_api_lists_a_messages_tool_calls_and_takes_decisions(use_tools, openai_server, user, other_user,
                                                                       reviewer):
    conversation, box = confirm_turn(use_tools, openai_server, user, stream=False)
    pending = pending_invocation()
    alice, bob, staff = client_for(user), client_for(other_user), client_for(reviewer)
    url = f"{API}/tool-calls/{pending.pk}/decision/"

    # While the answer is being written, the message lists its pending call.
    listed = alice.get(messages_url(conversation)).json()["results"]
    assert listed[1]["status"] == "streaming"
    assert [(t["name"], t["status"], t["confirmation_id"]) for t in listed[1]["tool_calls"]] == [
        ("send_email", "pending", pending.pk)]
    detail = alice.get(f"{API}/tool-calls/{pending.pk}/").json()
    assert (detail["id"], detail["status"], detail["arguments"], detail["conversation_id"]) == (
        pending.pk, "pending", {"to": "bob@example.com", "body": "Hello"}, str(conversation.pk))

    assert bob.get(f"{API}/tool-calls/{pending.pk}/").status_code == 404
    assert post_json(bob, url, {"approve": True}).json()["code"] == "not_found"
    refused = post_json(staff, url, {"approve": True})
    assert (refused.status_code, refused.json()["code"]) == (403, "forbidden")
    for body, code in (({}, "invalid"), ({"approve": "yes"}, "invalid"), ({"approve": 1}, "invalid"),
                       ([], "invalid_type")):  # no JSON object: as every write endpoint answers it
        bad = post_json(alice, url, body)
        assert (bad.status_code, bad.json()["code"]) == (400, code), body
    for bad_id in ("nope", "0", "-1", str(2**64), "１２", "1e3"):
        assert post_json(alice, f"{API}/tool-calls/{bad_id}/decision/", {"approve": True}).status_code == 404
        assert alice.get(f"{API}/tool-calls/{bad_id}/").status_code == 404
    assert tool_plugins.SENT == []

    approved = post_json(alice, url, {"approve": True})
    assert approved.status_code == 200 and approved.json()["status"] == "approved"
    again = post_json(alice, url, {"approve": False})
    assert (again.status_code, again.json()["code"]) == (409, "not_pending")
    box["thread"].join(10)
    assert tool_plugins.SENT == [{"to": "bob@example.com", "body": "Hello", "by": "alice"}]
    saved = alice.get(messages_url(conversation)).json()["results"][1]
    assert saved["status"] == "complete" and saved["tool_calls"][0]["status"] == "done"
    assert saved["tool_calls"] == box["result"][-1]["message"]["tool_calls"]


def test_posting_a_message_over_rest_runs_tools_as_the_poster(use_tools, openai_server, user):
    use_tools(["weather"])
    openai_server.script(tool_calls(call("weather", city="Lyon")), echo_tool_results)
    conversation = Conversation.objects.create(owner=user)
    response = post_json(client_for(user), messages_url(conversation), {"content": "Weather in Lyon?"})
    assert response.status_code == 201
    answer = response.json()["assistant_message"]
    assert '"asked_by": "alice"' in answer["content"]
    assert [(t["name"], t["status"]) for t in answer["tool_calls"]] == [("weather", "done")]


# --- cost ------------------------------------------------------------------------------------------


def test_a_turn_with_tools_issues_the_same_number_of_queries_whatever_the_history_length(
        use_tools, openai_server, product_corpus, user):
    from django.test.utils import CaptureQueriesContext

    use_tools(["weather", "audit_log", "staff_directory"])
    warm = Conversation.objects.create(owner=user)
    openai_server.script("warm", "warm")
    run_turn_sync(warm, "warm up the vector index")  # the first search loads the matrix
    run_turn_sync(warm, "and the subject names?")  # the first follow-up loads the corpus's subjects
    counts = {}
    for n in (2, 200):
        conversation = Conversation.objects.create(owner=user, last_seq=n)
        for seq in range(1, n + 1, 2):
            Message.objects.create(conversation=conversation, seq=seq, role="user", content=f"Weather {seq}?",
                                   token_count=3)
            answer = Message.objects.create(conversation=conversation, seq=seq + 1, role="assistant",
                                            content="Warm.", token_count=2)
            ToolInvocation.objects.create(message=answer, call_id=f"c{seq}", name="weather", status="done",
                                          arguments='{"city": "Lyon"}', content='{"t": 21}', token_count=12)
        openai_server.script(tool_calls(call("weather", city="Oslo")), echo_tool_results)
        with CaptureQueriesContext(connection) as queries:
            result = run_turn_sync(conversation, "And in Oslo?")
        assert result.status == "complete" and result.trace["tool_steps"] == 1
        assert any(m["role"] == "tool" for m in chats(openai_server)[-1]["messages"][:-2])  # history had calls
        counts[n] = len(queries)
        openai_server.reset()
    assert counts[2] == counts[200], counts


# --- the admin -------------------------------------------------------------------------------------


def test_the_admin_trace_shows_each_call_with_its_arguments_result_time_and_error(use_tools, openai_server, user,
                                                                                  admin_client):
    from django.urls import reverse

    xss = '<img src=x onerror="alert(1)">'
    use_tools(["weather", "explode"])
    openai_server.script(tool_calls(call("weather", city=xss, id="w"), call("explode", id="e")), echo_tool_results)
    conversation = Conversation.objects.create(owner=user)
    result = run_turn_sync(conversation, "Weather?")
    answer = Message.objects.get(pk=result.message["id"])
    pages = {
        "conversation": reverse("admin:django_ragchat_conversation_change", args=[conversation.pk]),
        "trace": reverse("admin:django_ragchat_turntrace_change", args=[answer.trace.pk]),
        "message": reverse("admin:django_ragchat_message_change", args=[answer.pk]),
        "calls": reverse("admin:django_ragchat_toolinvocation_changelist") + "?status=error",
        "call": reverse("admin:django_ragchat_toolinvocation_change",
                        args=[ToolInvocation.objects.get(name="explode").pk]),
    }
    html = {}
    for name, page in pages.items():
        response = admin_client.get(page)
        assert response.status_code == 200, name
        html[name] = response.content.decode()
        assert "<img src=x" not in html[name], name
    trace = html["trace"]
    assert "Tool calls" in trace and "<code>weather</code>" in trace and "<code>explode</code>" in trace
    assert "&quot;city&quot;: &quot;&lt;img src=x" in trace  # the arguments, pretty and escaped
    assert "&quot;temperature&quot;: 21" in trace  # the result
    assert "tool_failed: The tool failed; it could not answer this time." in trace  # the error
    assert "raised <code>RuntimeError(&#x27;secret database password in a traceback&#x27;)</code>" in trace
    assert trace.count(" ms</td>") >= 2  # the time of each
    assert "2 tool calls (1 not done)" in html["conversation"]
    listed = admin_client.get(pages["calls"]).context["cl"].result_list
    assert [call.name for call in listed] == ["explode"]
    assert "tool calls" in html["message"].lower()


def test_the_trace_keeps_the_wait_for_approval_apart_from_the_calls_own_time(use_tools, openai_server, user,
                                                                            admin_client):
    """A new user's trial: the trace gave a call that needed approval the 30 s the user took to
    approve it as its time (the tool ran in 2 ms), and the "answer written (llm)" timing
    included them, with nothing saying so."""
    from django.urls import reverse

    conversation, box = confirm_turn(use_tools, openai_server, user, stream=True)
    pending = pending_invocation()
    time.sleep(1.0)  # the user reads the call, then approves it
    decide_tool_call(pending.pk, user, None, approve=True)
    box["thread"].join(10)
    done = box["result"][-1]["message"]
    saved = TurnTrace.objects.get(message_id=done["id"])
    trace = saved.data
    [entry] = trace["tools"]
    assert entry["wait_ms"] >= 1000 and entry["ms"] < 500  # send_email itself takes a few ms
    assert 1000 <= trace["approval_wait_ms"] <= trace["timings"]["llm"]
    assert ToolInvocation.objects.get().ms < 500 and done["tool_calls"][0]["ms"] < 500  # the row, the clients
    page = admin_client.get(reverse("admin:django_ragchat_turntrace_change", args=[saved.pk])).content.decode()
    assert ">waited for approval</th>" in page
    assert f'<td class="ragchat-num ragchat-wait">{entry["wait_ms"]:.1f} ms</td>' in page
    wait = re.search(r"includes ([\d.]+) ms waiting for the user's approval \(hatched\); the model and the tools "
                     r"took ([\d.]+) ms", page)
    assert wait and float(wait.group(1)) == round(trace["approval_wait_ms"], 1), page
    assert 'class="ragchat-bar-wait"' in page
    assert "of them waiting for approval)" in admin_client.get(
        reverse("admin:django_ragchat_conversation_change", args=[conversation.pk])).content.decode()


def test_parallel_calls_waiting_for_approval_count_once_in_the_turns_wait(use_tools, openai_server, user):
    use_tools(["send_email"])
    openai_server.script(tool_calls(call("send_email", to="a@example.com", body="A", id="a"),
                                    call("send_email", to="b@example.com", body="B", id="b")), echo_tool_results)
    conversation = Conversation.objects.create(owner=user)
    box = run_in_thread(events_of, conversation, "Mail them both.", stream=True)
    deadline = time.monotonic() + 10
    while ToolInvocation.objects.filter(status="pending").count() < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.6)
    for pending in ToolInvocation.objects.filter(status="pending"):
        decide_tool_call(pending.pk, user, None, approve=True)
    box["thread"].join(10)
    trace = TurnTrace.objects.get(message_id=box["result"][-1]["message"]["id"]).data
    waits = [entry["wait_ms"] for entry in trace["tools"]]
    assert min(waits) >= 600
    assert max(waits) <= trace["approval_wait_ms"] < sum(waits)  # the turn waited once, for both


def test_the_admin_trace_says_which_stage_was_slowest_without_the_users_wait(admin_client, user):
    from django.urls import reverse

    from django_ragchat.admin import views as admin_views

    view = admin_views.build_trace_view({
        "timings": {"retrieval": 400.0, "llm": 30300.0, "total": 30800.0}, "approval_wait_ms": 30000.0,
        "tools": [{"step": 1, "name": "cancel_order", "status": "done", "ms": 2.1, "confirmation_id": 7,
                   "wait_ms": 30000.0}]}, {})
    slowest = [t.stage for t in view.timings if t.slowest]
    assert slowest == ["retrieval"]  # 400 ms against the model's and the tools' 300
    llm = next(t for t in view.timings if t.stage == "llm")
    assert (llm.wait_ms, llm.own_ms, llm.wait_percent) == (30000.0, 300.0, 99.0)
    assert view.summary.endswith("30,800 ms (30,000 of them waiting for approval)")
    # A trace written before the wait was kept apart says that its time includes it.
    conversation = Conversation.objects.create(owner=user)
    message = Message.objects.create(conversation=conversation, seq=2, role="assistant", content="x")
    old = TurnTrace.objects.create(message=message, profile="default", data={"tools": [
        {"step": 1, "name": "cancel_order", "status": "done", "ms": 30002.1, "confirmation_id": 7}]})
    page = admin_client.get(reverse("admin:django_ragchat_turntrace_change", args=[old.pk])).content.decode()
    assert "30002.1 ms <span class=\"ragchat-note\">(with the wait for approval" in page


# --- the terminal and the example's commands ---------------------------------------------------------


@pytest.mark.parametrize(("typed", "status"), [("y\n", "done"), ("n\n", "rejected")])
def test_the_terminal_shows_tool_calls_and_asks_for_approval(use_tools, openai_server, user, typed, status):
    import io

    from django.core.management import call_command

    use_tools(["send_email", "weather"])
    openai_server.script(tool_calls(call("weather", city="Lyon"), call("send_email", to="bob@example.com", body="Hi")),
                         echo_tool_results)
    out = io.StringIO()
    call_command("ragchat_chat", message="Weather, then mail Bob.", user="alice", stdin=io.StringIO(typed),
                 stdout=out, stderr=io.StringIO())
    printed = out.getvalue()
    assert "[Checking the weather in Lyon…]" in printed and "[Sending an e-mail to bob@example.com…]" in printed
    assert 'Sending an e-mail to bob@example.com needs your approval: send_email({"to": "bob@example.com"' in printed
    assert "[weather: done]" in printed and f"[send_email: {status}" in printed
    assert ToolInvocation.objects.get(name="send_email").status == status
    assert len(tool_plugins.SENT) == (status == "done")


def test_demo_orders_gives_a_user_orders_to_ask_about(user, other_user):
    import io

    from django.core.management import call_command

    call_command("demo_orders", "alice", stdout=io.StringIO())
    call_command("demo_orders", "bob", stdout=(out := io.StringIO()))
    assert sorted(Order.objects.filter(owner=user).values_list("number", "status")) == [
        ("ORD-17", "shipped"), ("ORD-18", "processing"), ("ORD-19", "delivered")]
    assert not Order.objects.filter(owner=other_user).exists() and "already exists (owner: alice)" in out.getvalue()


def tools_doc_block(start: str) -> str:
    """The fenced block of docs/tools.md that begins with ``start``."""
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "tools.md").read_text()
    (code,) = [code for code in re.findall(r"```\w+\n(.*?)```", text, re.S) if code.startswith(start)]
    return code


def test_the_docs_way_to_try_a_tool_on_a_site_whose_default_profile_is_extractive(
        ragchat_settings_override, openai_server, user, rf):
    """docs/tools.md, as written: try_tool_model.py's rule, the second profile and the widget
    that starts its conversations with it (an outside user's trial, a dental practice site,
    found no way to try a tool beside the extractive default)."""
    from django.contrib.sessions.backends.db import SessionStore
    from django.template import engines

    from tests.test_widget import widget_config

    model = {}
    exec(tools_doc_block("# try_tool_model.py").split("\nwith FakeOpenAIServer")[0], model)
    openai_server.when(contains="my order", reply=model["reply"])
    site = {"RAGCHAT": {"PROFILES": {"default": {"system_prompt": "You answer questions about this site."}}}}
    exec(tools_doc_block('# settings.py: "default" stays'), site)
    profiles = site["RAGCHAT"]["PROFILES"]
    assert profiles["assistant"]["options"]["openai"]["base_url"] == "http://127.0.0.1:8001/v1"  # the script's port
    profiles["assistant"]["options"]["openai"]["base_url"] = openai_server.base_url
    ragchat_settings_override(PLUGINS=PLUGINS, PROFILES=profiles)
    make_order(user, "ORD-17")

    conversation = Conversation.objects.create(owner=user, profile="assistant")
    result = run_turn_sync(conversation, "Where is my order ORD-17?", user=user)
    assert result.answer.startswith('Your order: {"number": "ORD-17", "status": "shipped"'), result.answer
    assert ToolInvocation.objects.get().name == "order_status"
    # Nothing retrieved (no documents here): "empty_context": "answer" still asks the model,
    # whose default reply repeats the prompt, as the docs say.
    assert run_turn_sync(conversation, "Do you open on Saturdays?", user=user).answer == (
        "Answer to: Do you open on Saturdays?")
    asked = len(chats(openai_server))
    default = run_turn_sync(Conversation.objects.create(owner=user), "Where is my order ORD-17?", user=user)
    assert len(chats(openai_server)) == asked and not default.answer.startswith("Your order")  # still extractive

    request = rf.get("/try-tool/")
    request.user, request.session = user, SessionStore()
    html = engines["django"].from_string(tools_doc_block("{# shop/templates/shop/try_tool.html")).render({}, request)
    assert widget_config(html)["defaultProfile"] == "assistant"
