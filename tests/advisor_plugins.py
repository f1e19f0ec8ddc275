"""Plugins for tests/test_advisors.py: advisors, a streamed footer, reprompting guardrails and
a pluggy wrapper on a lifecycle hook. Each is loaded only by the tests that list it in
``RAGCHAT["PLUGINS"]``, and each component is off unless the test's profile names it."""

from __future__ import annotations

from django_ragchat import hookimpl
from django_ragchat.stages.responses import ResponseAugmenter


class Footer(ResponseAugmenter):
    """Streams a sources line after the model's last piece."""

    name = "footer"
    enabled_by_default = False

    def on_delta(self, text, turn):
        turn.state.setdefault("footer_saw", []).append(text)
        return text

    async def finish(self, turn):
        return "\n\n(Sources: test)"


class Bracket(ResponseAugmenter):
    """Runs after ``footer``: wraps every piece it is given, the footer's tail included."""

    name = "bracket"
    order = 200
    enabled_by_default = False

    def on_delta(self, text, turn):
        return f"<{text}>"

    def finish(self, turn):
        return "~end~"


class SourcesLine(ResponseAugmenter):
    """docs/plugins.md's example, word for word: a tail on streamed answers, the same line
    added by ``augment`` to whole ones."""

    name = "sources_line"
    enabled_by_default = False

    def finish(self, turn):
        names = sorted({d.source for d in (turn.prompt.documents if turn.prompt else ())})
        return f"\n\n(Sources: {', '.join(names)})" if names else ""

    def augment(self, answer, turn):  # the same line on a whole answer
        return answer.replace(text=answer.text + self.finish(turn))


class Streamed:
    @hookimpl
    def register_response_augmenters(self, register):
        register(Footer)
        register(Bracket)
        register(SourcesLine)


streamed = Streamed()


# --- Advisors ----------------------------------------------------------------------------------

from django_ragchat.stages.guardrails import Guardrail  # noqa: E402
from django_ragchat.turn.advisors import Advisor  # noqa: E402
from django_ragchat.types import Answer, CannedAnswer, LLMDelta, Refusal, Reprompt  # noqa: E402


class Cache(Advisor):
    """A sync ``around_turn`` that answers "cached" questions itself (a short-circuit), and
    otherwise hands on (returning the awaitable ``call_next()`` gives)."""

    name = "cache"
    order = 10
    enabled_by_default = False

    def around_turn(self, turn, call_next):
        if "cached" in turn.question:
            return CannedAnswer("From the cache.", reason="cache hit")
        return call_next()


class Stamp(Advisor):
    """An async ``around_turn`` that works on both sides of ``call_next``."""

    name = "stamp"
    order = 20
    enabled_by_default = False

    async def around_turn(self, turn, call_next):
        turn.state["stamp_before"] = turn.question
        answer = await call_next()
        return answer.replace(text=answer.text + " [stamped]")


class Concise(Advisor):
    """An async ``around_llm`` that changes the prompt before the model."""

    name = "concise"
    enabled_by_default = False

    async def around_llm(self, prompt, turn, call_next):
        system, *rest = prompt.messages
        changed = {**system, "content": system["content"] + "\nANSWER IN ONE SENTENCE."}
        response = await call_next(prompt.__class__(**{**prompt.__dict__, "messages": (changed, *rest)}))
        return response.text.upper()


class Signature(Advisor):
    """An ``around_llm_stream`` that holds back the model's last piece, changes it, and streams
    a signature after the model has finished."""

    name = "signature"
    enabled_by_default = False

    async def around_llm_stream(self, prompt, turn, call_next):
        held = None
        async for piece in call_next(prompt):
            if held is not None:
                yield held
            held = piece
        if held is not None:
            yield LLMDelta(text=held.text, model=held.model, usage=held.usage)
        yield " -- signed"
        yield LLMDelta(text=" by the advisor.")


class CannedModel(Advisor):
    """Plain (sync) ``around_llm`` and ``around_llm_stream`` that answer instead of the model."""

    name = "canned_model"
    enabled_by_default = False

    def around_llm(self, prompt, turn, call_next):
        return f"Canned answer about {len(prompt.documents)} documents [1]."

    def around_llm_stream(self, prompt, turn, call_next):
        return ["Canned ", LLMDelta(text="stream "), "[1]."]


class Advisors:
    @hookimpl
    def register_advisors(self, register):
        for cls in (Cache, Stamp, Concise, Signature, CannedModel):
            register(cls)


advisors = Advisors()


# --- Guardrails ---------------------------------------------------------------------------------


class Scripted(Guardrail):
    """An output guardrail whose verdict the answer text chooses: "FAIL" refuses, "AGAIN" asks
    for another answer (twice at most), "REDACT" is passed changed."""

    name = "scripted"
    enabled_by_default = False
    max_reprompts = 2

    def check_output(self, answer, turn):
        if "FAIL" in answer.text:
            return Refusal("I can't say that.", reason="scripted fail")
        if "AGAIN" in answer.text:
            return Reprompt("Please answer without the word again.", reason="scripted reprompt")
        if "REDACT" in answer.text:
            return Answer(text=answer.text.replace("REDACT", "█"), citations=answer.citations)
        return None


class Guards:
    @hookimpl
    def register_guardrails(self, register):
        register(Scripted)


guards = Guards()


# --- pluggy wrappers ---------------------------------------------------------------------------

CALLS: list = []


class LifecycleWrapper:
    """A ``wrapper=True`` implementation of a lifecycle hook around a plain one."""

    @hookimpl(wrapper=True)
    def on_turn_completed(self, turn, message):
        CALLS.append(("wrapper before", message.status))
        results = yield
        CALLS.append(("wrapper after", "observed" in results))
        return results

    @hookimpl
    def on_stage_completed(self, turn, stage, elapsed_ms):
        CALLS.append(("stage", stage))

    @hookimpl(hookwrapper=True)
    def on_turn_started(self, turn):
        CALLS.append(("old-style wrapper before", turn.question))
        yield
        CALLS.append(("old-style wrapper after", turn.question))


class Observer:
    @hookimpl
    def on_turn_completed(self, turn, message):
        CALLS.append(("observer", message.status))
        return "observed"

    @hookimpl
    async def on_turn_started(self, turn):
        CALLS.append(("async observer", turn.question))

    @hookimpl
    def on_stage_completed(self, turn, stage, elapsed_ms):
        raise RuntimeError("a broken observer must not break the turn")


lifecycle_wrapper = LifecycleWrapper()
observer = Observer()


class RegistrationWrapper:
    @hookimpl(wrapper=True)
    def register_advisors(self, register):
        register(Cache)
        return (yield)


registration_wrapper = RegistrationWrapper()
