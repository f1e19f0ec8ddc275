"""Around-advice and the other pipeline extension points: advisors (``around_turn``,
``around_llm``, ``around_llm_stream``), streamed tails of response augmenters, pluggy wrappers
on lifecycle hooks, and output guardrails that reprompt the model."""

from __future__ import annotations

import contextlib

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator

from django_ragchat.events import Delta, Replace, Retry
from django_ragchat.models import Conversation, Message, TurnTrace
from django_ragchat.profiles import get_profile
from django_ragchat.turn.context import components_for
from django_ragchat.turn.pipeline import run_turn_sync, stream_turn
from tests.live_servers import caller_for

pytestmark = pytest.mark.django_db

QUESTION = "How much does the Aurora X2 cost?"


def collect(conversation, text, **kwargs):
    async def run():
        return [event async for event in stream_turn(conversation, text, **kwargs)]

    return async_to_sync(run)()


def test_a_streamed_augmenter_tail_is_sent_as_deltas_after_the_last_token(
    ragchat_settings_override, product_corpus, user
):
    ragchat_settings_override(PLUGINS=["tests.advisor_plugins.streamed"],
                              PROFILES={"default": {"response_augmenters": ["citations", "footer", "bracket"]}})
    conversation = Conversation.objects.create(owner=user)
    events = collect(conversation, QUESTION, stream=True)
    deltas = [e.text for e in events if isinstance(e, Delta)]
    done = events[-1].to_dict()["message"]
    # footer's tail passed through bracket (after it in order); bracket's own tail comes last.
    assert deltas[-2:] == ["<\n\n(Sources: test)>", "~end~"]
    assert all(d.startswith("<") and d.endswith(">") for d in deltas[:-1])
    assert "".join(deltas) == done["content"]
    assert "$699" in done["content"] and done["citations"]


def assembled(events) -> str:
    """The answer as a client assembles it from the events (docs/protocol.md)."""
    text = ""
    for event in events:
        if isinstance(event, Delta):
            text += event.text
        elif isinstance(event, Retry):
            text = ""
        elif isinstance(event, Replace):
            text = event.text
    return text


@pytest.mark.parametrize("stream", [True, False])
def test_the_plugin_guides_sources_line_adds_its_line_once(ragchat_settings_override, product_corpus, user, stream):
    ragchat_settings_override(PLUGINS=["tests.advisor_plugins.streamed"],
                              PROFILES={"default": {"response_augmenters": ["citations", "sources_line"]}})
    conversation = Conversation.objects.create(owner=user)
    events = collect(conversation, QUESTION, stream=stream)
    saved = events[-1].to_dict()["message"]["content"]
    # The line names the prompt's documents (the trace's final documents), sorted, once, at the end.
    trace = TurnTrace.objects.get(message__conversation=conversation).data
    in_prompt = sorted({d["source"] for d in trace["documents"]})
    assert "products/aurora-x2.md" in in_prompt
    assert saved.count("(Sources: ") == 1 and saved.endswith(f"(Sources: {', '.join(in_prompt)})")
    if stream:
        assert assembled(events) == saved
        assert not any(isinstance(e, Replace) for e in events)  # the stream was right all along


# --- advisors ------------------------------------------------------------------------------------


def use(override, plugins: list[str], **profile):
    override(PLUGINS=[f"tests.advisor_plugins.{p}" for p in plugins], PROFILES={"default": profile})


def test_an_advisor_that_answers_without_calling_on_ends_the_turn_and_the_trace_says_so(
    ragchat_settings_override, product_corpus, conversation
):
    use(ragchat_settings_override, ["advisors"], advisors=["stamp", "cache"])
    result = run_turn_sync(conversation, "Is this cached?", stream=True)
    # cache (order 10) is outermost: stamp (20) never ran, and nothing after it either.
    assert result.status == "complete" and result.answer == "From the cache."
    assert result.trace["ended_by"] == {"stage": "advisors", "component": "cache", "kind": "canned",
                                        "reason": "cache hit"}
    assert result.trace["retrieval"] == [] and "memory" not in result.trace["timings"]
    assert TurnTrace.objects.get(message_id=result.message["id"]).ended_by == "advisors"


def test_an_around_turn_advisor_changes_the_answer_after_the_pipeline(
    ragchat_settings_override, product_corpus, conversation
):
    use(ragchat_settings_override, ["advisors"], advisors=["cache", "stamp"])
    events = collect(conversation, QUESTION, stream=True)
    done = events[-1].to_dict()["message"]
    assert done["content"].endswith(" [stamped]") and "$699" in done["content"]
    # The stages' events still streamed through the advisor chain, in order.
    types = [e.type for e in events]
    assert types[:4] == ["ack", "status", "sources", "status"] and types[-1] == "done"
    assert "delta" in types
    assert Message.objects.get(pk=done["id"]).content == done["content"]


def test_a_streamed_answer_an_advisor_changes_reaches_the_client_as_saved(
    ragchat_settings_override, product_corpus, conversation
):
    use(ragchat_settings_override, ["advisors"], advisors=["stamp"])
    events = collect(conversation, QUESTION, stream=True)
    done = events[-1].to_dict()["message"]
    assert [type(e) for e in events[-2:]] == [Replace, type(events[-1])]
    assert assembled(events) == done["content"] == Message.objects.get(pk=done["id"]).content
    assert done["content"].endswith(" [stamped]")


def test_a_short_circuited_streamed_answer_is_streamed_and_its_trace_lists_what_ran(
    ragchat_settings_override, product_corpus, conversation
):
    use(ragchat_settings_override, ["advisors"], advisors=["stamp", "cache"])
    events = collect(conversation, "Is this cached?", stream=True)
    assert [e.type for e in events] == ["ack", "delta", "done"]
    assert assembled(events) == "From the cache." == events[-1].to_dict()["message"]["content"]
    trace = TurnTrace.objects.get(message_id=events[-1].to_dict()["message"]["id"]).data
    # cache (outermost) answered: stamp never ran, and no stage did.
    assert trace["components"] == [{"stage": "advisor", "name": "cache", "plugin": "tests.advisor_plugins.advisors"}]


def test_an_input_guardrail_refusal_lists_only_the_guardrails_that_ran(
    ragchat_settings_override, product_corpus, conversation
):
    ragchat_settings_override(PROFILES={"default": {
        "guardrails": ["blocked_phrases", "require_citation"],
        "options": {"blocked_phrases": {"phrases": ["secret"]}}}})
    events = collect(conversation, "Tell me the secret", stream=True)
    assert [e.type for e in events] == ["ack", "delta", "done"]
    trace = TurnTrace.objects.get(message_id=events[-1].to_dict()["message"]["id"]).data
    assert [(c["stage"], c["name"]) for c in trace["components"]] == [("guardrail", "blocked_phrases")]
    complete = run_turn_sync(conversation, QUESTION)  # a whole turn lists every stage's components
    kinds = {c["stage"] for c in complete.trace["components"]}
    assert {"guardrail", "memory", "retriever", "joiner", "prompt_augmenter", "llm", "response_augmenter",
            "embedder"} <= kinds


def test_a_turn_an_input_guardrail_refused_is_left_out_of_the_history(
    ragchat_settings_override, product_corpus, conversation
):
    # A new user's trial: "Can you do my homework?", refused, became the opening message the
    # follow-up transformer carried into the next question's search; the model read it too.
    from django_ragchat.stages.memory import load_recent_messages

    ragchat_settings_override(PROFILES={"default": {
        "guardrails": ["blocked_phrases"], "options": {"blocked_phrases": {"phrases": ["homework"]}}}})
    run_turn_sync(conversation, "What is the battery life of the Aurora X2?")
    refused = run_turn_sync(conversation, "Can you do my homework?")
    assert refused.trace["ended_by"]["stage"] == "input_guardrails"

    result = run_turn_sync(conversation, "How much is it?")

    assert "homework" not in result.trace["queries"]["final"]
    history = load_recent_messages(conversation.pk, before_seq=10**6, limit=50)
    assert [m.content for m in history if m.role == "user"] == [
        "What is the battery life of the Aurora X2?", "How much is it?"]
    assert len(history) == 4 and Message.objects.filter(conversation=conversation).count() == 6  # all kept


def test_an_around_llm_advisor_changes_the_prompt_and_the_response(
    ragchat_settings_override, product_corpus, conversation, openai_server
):
    openai_server.when("", "The Aurora X2 costs $699 [1].")
    use(ragchat_settings_override, ["advisors"], advisors=["concise"], llm="openai",
        options={"openai": {"base_url": openai_server.base_url, "max_retries": 0, "timeout": 5}})
    result = run_turn_sync(conversation, QUESTION)
    assert result.answer == "THE AURORA X2 COSTS $699 [1]."
    system = openai_server.last("/chat/completions").json["messages"][0]
    assert system["role"] == "system" and system["content"].endswith("ANSWER IN ONE SENTENCE.")
    assert result.message["citations"]  # augmenters ran on the advised response


@pytest.mark.django_db(transaction=True)  # the consumer closes and reopens connections
def test_an_around_llm_stream_advisor_streams_text_after_the_models_last_piece_to_a_websocket(
    ragchat_settings_override, product_corpus, user, openai_server
):
    from tests.asgi import application

    openai_server.when("", "The Aurora X2 costs $699 [1].")
    use(ragchat_settings_override, ["advisors"], advisors=["signature"], llm="openai",
        options={"openai": {"base_url": openai_server.base_url, "max_retries": 0, "timeout": 5}})
    conversation = Conversation.objects.create(owner=user)
    caller = caller_for(user)

    async def chat():
        communicator = WebsocketCommunicator(application, "/ws/ragchat/", headers=[
            (b"origin", b"http://testserver"), (b"host", b"testserver"),
            (b"cookie", caller.cookie_header.encode()),
        ])
        connected, _ = await communicator.connect()
        assert connected
        frames = [await communicator.receive_json_from(timeout=10)]
        await communicator.send_json_to({"type": "message", "content": QUESTION,
                                         "conversation_id": str(conversation.pk)})
        while frames[-1]["type"] not in ("done", "error"):
            frames.append(await communicator.receive_json_from(timeout=10))
        await communicator.disconnect()
        return frames

    frames = async_to_sync(chat)()
    assert frames[0]["type"] == "ready" and frames[-1]["type"] == "done", frames[-1]
    deltas = [f for f in frames if f["type"] == "delta"]
    # The advisor's pieces stream as deltas after the model's (the relay may join pieces that
    # pile up into one delta: transport.relay).
    assert deltas[-1]["text"].endswith(" -- signed by the advisor.") or [d["text"] for d in deltas[-2:]] == [
        " -- signed", " by the advisor."]
    assert [d["index"] for d in deltas] == list(range(len(deltas)))
    content = frames[-1]["message"]["content"]
    assert "".join(d["text"] for d in deltas) == content
    assert content == "The Aurora X2 costs $699 [1]. -- signed by the advisor."
    assert frames[-1]["message"]["citations"]
    assert Message.objects.get(pk=frames[-1]["message"]["id"]).content == content


def test_advisors_are_listed_and_ordered_like_every_stage(ragchat_settings_override):
    use(ragchat_settings_override, ["advisors"], advisors=["stamp", "concise", "cache"])
    components = components_for(get_profile())
    assert [a.name for a in components.advisors] == ["cache", "stamp", "concise"]
    assert [a.name for a in components.turn_advisors] == ["cache", "stamp"]
    assert [a.name for a in components.llm_advisors] == ["concise"]
    assert components.stream_advisors == []


# --- output guardrails: pass, fail, reprompt ---------------------------------------------------


def openai_profile(server, **profile):
    return {"llm": "openai", "options": {"openai": {"base_url": server.base_url, "max_retries": 0, "timeout": 5}},
            **profile}


def chat_requests(server):
    return [r.json for r in server.requests if r.path.endswith("/chat/completions")]


def test_require_citation_reprompts_an_uncited_answer_once_and_the_second_answer_is_saved(
    ragchat_settings_override, product_corpus, conversation, openai_server
):
    openai_server.script("It costs $699.", "The Aurora X2 costs $699 [1].")
    ragchat_settings_override(PROFILES={"default": openai_profile(
        openai_server, guardrails=["require_citation"])})
    result = run_turn_sync(conversation, QUESTION)

    assert result.status == "complete" and result.answer == "The Aurora X2 costs $699 [1]."
    assert result.message["citations"][0]["index"] == 1
    first, second = chat_requests(openai_server)
    # The second call is the first prompt, the rejected answer and the guardrail's feedback.
    assert second["messages"][:len(first["messages"])] == first["messages"]
    assert second["messages"][-2] == {"role": "assistant", "content": "It costs $699."}
    assert second["messages"][-1]["role"] == "user" and "cite" in second["messages"][-1]["content"]
    [reprompt] = result.trace["reprompts"]
    assert reprompt["guardrail"] == "require_citation" and reprompt["rejected"] == "It costs $699."
    message = Message.objects.get(pk=result.message["id"])
    assert "uncited" not in message.metadata
    assert message.sources.filter(cited=True).exists()


def test_require_citation_saves_the_answer_marked_uncited_when_the_reprompt_cites_nothing_either(
    ragchat_settings_override, product_corpus, conversation, openai_server
):
    openai_server.script("It costs $699.", "Still $699, trust me.", "never asked")
    ragchat_settings_override(PROFILES={"default": openai_profile(
        openai_server, guardrails=["require_citation"])})
    result = run_turn_sync(conversation, QUESTION)

    assert result.status == "complete" and result.answer == "Still $699, trust me."
    assert len(chat_requests(openai_server)) == 2  # reprompted once, not more
    assert Message.objects.get(pk=result.message["id"]).metadata["uncited"] is True
    assert result.trace["reprompts"][-1] == {
        "guardrail": "require_citation", "exhausted": True, "reason": "the answer cites none of the documents"}


def test_require_citation_passes_a_cited_answer_and_is_off_by_default(
    ragchat_settings_override, product_corpus, conversation, openai_server
):
    openai_server.when("", "It costs $699.")
    ragchat_settings_override(PROFILES={"default": openai_profile(openai_server)})
    assert "require_citation" not in [g.name for g in components_for(get_profile()).guardrails]
    result = run_turn_sync(conversation, QUESTION)
    assert result.answer == "It costs $699." and len(chat_requests(openai_server)) == 1
    assert "reprompts" not in result.trace


def test_a_streamed_reprompt_sends_a_retry_event_and_the_new_answer_from_index_0(
    ragchat_settings_override, product_corpus, conversation, openai_server
):
    openai_server.script("Say it AGAIN please.", "The Aurora X2 costs $699 [1].")
    ragchat_settings_override(PLUGINS=["tests.advisor_plugins.guards"],
                              PROFILES={"default": openai_profile(openai_server, guardrails=["scripted"])})
    events = [e.to_dict() for e in collect(conversation, QUESTION, stream=True)]
    types = [e["type"] for e in events]
    retry = types.index("retry")
    assert events[retry] == {"type": "retry", "attempt": 1, "guardrail": "scripted"}
    before = [e for e in events[:retry] if e["type"] == "delta"]
    after = [e for e in events[retry:] if e["type"] == "delta"]
    assert "".join(d["text"] for d in before) == "Say it AGAIN please."
    assert [(d["index"], d["text"]) for d in after] == [(0, "The Aurora X2 costs $699 [1].")]
    assert types[-1] == "done" and events[-1]["message"]["content"] == "The Aurora X2 costs $699 [1]."
    assert events[-1]["message"]["citations"]


def test_a_guardrail_that_keeps_asking_is_bounded_by_max_reprompts_then_refuses(
    ragchat_settings_override, product_corpus, conversation, openai_server
):
    openai_server.when("", "AGAIN and again.")
    ragchat_settings_override(PLUGINS=["tests.advisor_plugins.guards"],
                              PROFILES={"default": openai_profile(openai_server, guardrails=["scripted"])})
    events = [e.to_dict() for e in collect(conversation, QUESTION, stream=True)]
    assert [e["attempt"] for e in events if e["type"] == "retry"] == [1, 2]
    assert len(chat_requests(openai_server)) == 3  # the answer and two reprompts
    done = events[-1]["message"]
    assert done["content"] == "I couldn't produce an answer that meets this site's rules."
    trace = TurnTrace.objects.get(message_id=done["id"])
    assert trace.ended_by == "output_guardrails" and trace.data["ended_by"]["kind"] == "refusal"


@pytest.mark.parametrize("reply,saved", [
    ("This would FAIL the check.", "I can't say that."),
    ("Some REDACT text [1].", "Some █ text [1]."),
    ("The Aurora X2 costs $699 [1].", "The Aurora X2 costs $699 [1]."),
])
def test_output_guardrail_fail_change_and_pass(
    ragchat_settings_override, product_corpus, conversation, openai_server, reply, saved
):
    openai_server.when("", reply)
    ragchat_settings_override(PLUGINS=["tests.advisor_plugins.guards"],
                              PROFILES={"default": openai_profile(openai_server, guardrails=["scripted"])})
    result = run_turn_sync(conversation, QUESTION)
    assert result.status == "complete" and result.answer == saved
    assert len(chat_requests(openai_server)) == 1
    assert (result.trace["ended_by"] or {}).get("stage") == ("output_guardrails" if "FAIL" in reply else None)
    assert "output_guardrails" in result.trace["timings"]


# --- lifecycle hooks through pluggy ------------------------------------------------------------


def test_lifecycle_hooks_run_through_pluggy_so_wrappers_wrap_the_other_implementations(
    ragchat_settings_override, product_corpus, conversation, caplog
):
    from tests import advisor_plugins

    advisor_plugins.CALLS.clear()
    ragchat_settings_override(PLUGINS=["tests.advisor_plugins.observer", "tests.advisor_plugins.lifecycle_wrapper"])
    result = run_turn_sync(conversation, QUESTION)
    assert result.status == "complete"
    calls = advisor_plugins.CALLS
    completed = [c for c in calls if c[0] in ("wrapper before", "observer", "wrapper after")]
    assert completed == [("wrapper before", "complete"), ("observer", "complete"), ("wrapper after", True)]
    started = [c[0] for c in calls if "observer" in c[0] or "old-style" in c[0]][:3]
    # The async observer's body runs once the hook call (and so the wrapper) has returned.
    assert started == ["old-style wrapper before", "old-style wrapper after", "async observer"]
    stages = [c[1] for c in calls if c[0] == "stage"]
    assert stages[:3] == ["input_guardrails", "memory", "query_transformers"] and "llm" in stages
    # The broken observer was logged, and did not stop the other implementations.
    assert "Plugin 'tests.advisor_plugins.observer' failed in on_stage_completed" in caplog.text


def test_an_input_guardrail_that_ends_the_turn_still_records_its_stage(
    ragchat_settings_override, product_corpus, conversation
):
    from tests import advisor_plugins

    advisor_plugins.CALLS.clear()
    ragchat_settings_override(PLUGINS=["tests.advisor_plugins.lifecycle_wrapper"], PROFILES={"default": {
        "options": {"blocked_phrases": {"phrases": ["secret"]}}}})
    result = run_turn_sync(conversation, "Tell me the secret")
    assert result.trace["ended_by"]["stage"] == "input_guardrails"
    assert set(result.trace["timings"]) == {"input_guardrails", "total"}  # jsonb keeps no key order
    assert [c for c in advisor_plugins.CALLS if c[0] == "stage"] == [("stage", "input_guardrails")]


def test_a_wrapper_on_a_registration_hook_is_a_system_check_error(ragchat_settings_override):
    from django_ragchat import checks

    ragchat_settings_override(PLUGINS=["tests.advisor_plugins.registration_wrapper"])
    errors = checks.check_registration_wrappers()
    assert [e.id for e in errors] == ["ragchat.E008"]
    assert "register_advisors" in errors[0].msg and "tests.advisor_plugins.registration_wrapper" in errors[0].msg
    assert checks.check_plugins() == []


# --- failures and cancellation through the advisor chain ---------------------------------------


def test_closing_the_stream_inside_an_around_turn_advisor_saves_the_partial_answer_as_incomplete(
    ragchat_settings_override, product_corpus, conversation
):
    use(ragchat_settings_override, ["advisors"], advisors=["stamp"])

    async def first_delta_then_close():
        events = stream_turn(conversation, QUESTION, stream=True)
        seen = []
        async for event in events:
            seen.append(event)
            if isinstance(event, Delta):
                break
        await events.aclose()
        return seen

    seen = async_to_sync(first_delta_then_close)()
    message = Message.objects.get(pk=seen[0].assistant_message_id)
    assert message.status == "incomplete" and message.content == seen[-1].text
    assert message.metadata["error"]["code"] == "cancelled"
    assert TurnTrace.objects.get(message=message).data["cancelled"] is True


class _Broken:
    from django_ragchat import hookimpl as _hookimpl

    @staticmethod
    @_hookimpl
    def register_advisors(register):
        from django_ragchat.turn.advisors import Advisor

        class Broken(Advisor):
            name = "broken"

            async def around_turn(self, turn, call_next):
                await call_next()
                raise RuntimeError("advisor bug")

        register(Broken)


def test_an_advisor_that_raises_fails_the_turn_with_the_partial_answer_saved(
    ragchat_settings_override, product_corpus, conversation
):
    from django_ragchat import plugins

    plugins.get_plugin_manager()  # built from settings; then add the broken plugin to it
    plugins.reset()
    pm = plugins.get_plugin_manager()
    pm.register(_Broken(), name="broken_advisor")
    plugins._state["registry"] = plugins.build_registry(pm)
    events = collect(conversation, QUESTION, stream=True)
    failed = events[-1].to_dict()
    assert failed["type"] == "error" and failed["code"] == "internal_error"
    saved = failed["assistant_message"]
    assert saved["status"] == "error" and "$699" in saved["content"]  # the streamed text is kept
    assert "advisor bug" in TurnTrace.objects.get(message_id=saved["id"]).data["error"]["detail"]


@pytest.mark.parametrize("stream,answer", [(False, "Canned answer about 4 documents [1]."),
                                           (True, "Canned stream [1].")])
def test_plain_function_advisors_can_answer_instead_of_the_model(
    ragchat_settings_override, product_corpus, conversation, stream, answer
):
    use(ragchat_settings_override, ["advisors"], advisors=["canned_model"], top_k=4)
    events = collect(conversation, QUESTION, stream=stream)
    done = events[-1].to_dict()["message"]
    assert done["content"] == answer and done["citations"][0]["index"] == 1
    deltas = [e.text for e in events if isinstance(e, Delta)]
    assert deltas == (["Canned ", "stream ", "[1]."] if stream else [])


def test_cancelling_a_turn_inside_an_around_turn_advisor_stops_the_model_and_saves_what_was_sent(
    ragchat_settings_override, product_corpus, conversation, openai_server
):
    import asyncio

    openai_server.token_delay = 0.05
    openai_server.when("", " ".join(f"word{i}" for i in range(200)))  # about 10 s of writing
    use(ragchat_settings_override, ["advisors"], advisors=["stamp"], **openai_profile(openai_server))

    async def cancel_after_two_deltas():
        seen = []

        async def consume():
            async for event in stream_turn(conversation, QUESTION, stream=True):
                seen.append(event)
                if sum(isinstance(e, Delta) for e in seen) == 2:
                    await asyncio.sleep(30)  # stands for a slow client; cancelled before

        task = asyncio.ensure_future(consume())
        while sum(isinstance(e, Delta) for e in seen) < 2 and not task.done():
            await asyncio.sleep(0.01)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return seen

    seen = async_to_sync(cancel_after_two_deltas)()
    message = Message.objects.get(pk=seen[0].assistant_message_id)
    assert message.status == "incomplete"
    assert message.content == "".join(e.text for e in seen if isinstance(e, Delta))
    assert message.content.startswith("word0")
