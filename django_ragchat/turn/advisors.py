"""Advisors: around-advice for the turn and for the model call.

An advisor wraps part of the turn the way a middleware wraps a request (Spring AI's advisors,
pytest's ``wrapper=True`` hooks). It implements any of three methods; each receives
``call_next``, which runs the rest of the chain (the inner advisors, then the pipeline itself):

``around_turn(turn, call_next) -> Answer``
    Wraps everything after the user's message is saved: input guardrails, memory, retrieval,
    the model, response augmenters and output guardrails. Change ``turn`` before
    ``await call_next()``, change the returned ``Answer`` after it, or return an answer
    without calling it at all (a cache hit, an FAQ): the turn ends there and the trace's
    ``ended_by`` names the advisor. It may return an ``Answer``, a string or an ``EndTurn``.
    ``call_next`` may be called once.

``around_llm(prompt, turn, call_next) -> LLMResponse``
    Wraps a whole-answer model call (``await call_next(prompt)``): change the prompt, retry,
    cache, change the response. It may return an ``LLMResponse`` or a string. Output
    guardrails' reprompts go through it too.

``around_llm_stream(prompt, turn, call_next) -> async iterator``
    Wraps a streamed model call: ``call_next(prompt)`` returns the async iterator of the
    model's pieces (``LLMDelta``); return an iterator of your own (an ``async def`` generator
    is the natural shape). It may change pieces as they pass, hold some back, and yield more
    after the model's last piece, which then streams to the client like any text. It may
    yield ``LLMDelta`` objects or strings; it may also return a plain list (a cached answer).

``around_tool(call, turn, call_next) -> ToolResult``
    Wraps one tool call the model asked for (``django_ragchat.types.ToolCall``: ``id``,
    ``name``, ``arguments`` as the model wrote them): validation, the permission check, the
    user's approval when the tool needs it, the run and its timeout are all inside
    ``await call_next(call)``. Change the call first (``call.with_arguments({...})``), change
    the ``ToolResult`` after, or return one without calling on (a cached lookup, a refusal of
    your own): the tool does not run, and the trace marks the call ``short_circuited``. It may
    return a ``ToolResult``, a string (the result the model reads) or any JSON value.
    Parallel calls are wrapped one by one, concurrently.

The first advisor in ``order`` is the outermost: it sees the request first and the answer
last. Every method may be ``async def`` or a plain function (a plain ``around_turn`` can
short-circuit or ``return call_next()``; to work after the answer it must be ``async``).
Advisors see, and may change, the same ``turn`` object as every stage.

Register them with the ``register_advisors`` hook; a profile selects them with its
``advisors`` list (default: every advisor whose ``enabled_by_default`` is true).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from django_ragchat.components import Component
from django_ragchat.plugins import await_me_maybe
from django_ragchat.types import Answer, EndTurn, LLMDelta, LLMResponse, Prompt, ToolCall, ToolResult

if TYPE_CHECKING:
    from django_ragchat.turn.context import TurnContext


class Advisor(Component):
    """Base class. Override any of ``around_turn``, ``around_llm``, ``around_llm_stream``,
    ``around_tool``; a method left as inherited is skipped (the chain does not even call it)."""

    kind = "advisor"

    def around_turn(self, turn: TurnContext, call_next: Callable[[], Awaitable[Answer]]):
        return call_next()

    def around_llm(self, prompt: Prompt, turn: TurnContext,
                   call_next: Callable[[Prompt], Awaitable[LLMResponse]]):
        return call_next(prompt)

    def around_llm_stream(self, prompt: Prompt, turn: TurnContext,
                          call_next: Callable[[Prompt], AsyncIterator[LLMDelta]]):
        return call_next(prompt)

    def around_tool(self, call: ToolCall, turn: TurnContext,
                    call_next: Callable[[ToolCall], Awaitable[ToolResult]]):
        return call_next(call)


def advising(advisors: list, method: str) -> list:
    """The advisors that override ``method``, outermost first."""
    base = getattr(Advisor, method)
    return [a for a in advisors if getattr(type(a), method, base) is not base]


# --- Running the chains ------------------------------------------------------------------------


class ShortCircuit:
    """What ``run_turn_chain`` learned: which advisor, if any, answered without ``call_next``."""

    def __init__(self) -> None:
        self.advisor: Any = None
        self.ending: EndTurn | None = None


def as_answer(result: Any, advisor: Any) -> tuple[Answer, EndTurn | None]:
    if isinstance(result, Answer):
        return result, None
    if isinstance(result, EndTurn):
        return Answer(text=result.answer), result
    if isinstance(result, str):
        return Answer(text=result), None
    raise TypeError(f"Advisor {getattr(advisor, 'name', advisor)!r} returned {type(result).__name__} from "
                    f"around_turn; return an Answer, a string or an EndTurn.")


async def run_turn_chain(advisors: list, turn: TurnContext, innermost: Callable[[], Awaitable[Answer]],
                         short: ShortCircuit) -> Answer:
    """``innermost()`` wrapped by each advisor's ``around_turn``, the first outermost."""

    async def call(position: int) -> Answer:
        if position == len(advisors):
            return await innermost()
        advisor = advisors[position]
        called = False

        async def call_next() -> Answer:
            nonlocal called
            if called:
                raise RuntimeError(f"Advisor {advisor.name!r} called call_next() twice in around_turn.")
            called = True
            return await call(position + 1)

        answer, ending = as_answer(await await_me_maybe(advisor.around_turn(turn, call_next)), advisor)
        if not called and short.advisor is None:
            short.advisor = advisor
            short.ending = ending
        return answer

    return await call(0)


def as_response(result: Any, advisor: Any) -> LLMResponse:
    if isinstance(result, LLMResponse):
        return result
    if isinstance(result, str):
        return LLMResponse(text=result)
    raise TypeError(f"Advisor {getattr(advisor, 'name', advisor)!r} returned {type(result).__name__} from "
                    f"around_llm; return an LLMResponse or a string.")


async def run_llm_chain(advisors: list, prompt: Prompt, turn: TurnContext,
                        innermost: Callable[[Prompt], Awaitable[LLMResponse]]) -> LLMResponse:
    """``innermost(prompt)`` wrapped by each advisor's ``around_llm``, the first outermost."""

    async def call(position: int, prompt: Prompt) -> LLMResponse:
        if position == len(advisors):
            return await innermost(prompt)
        advisor = advisors[position]

        def call_next(prompt: Prompt) -> Awaitable[LLMResponse]:
            return call(position + 1, prompt)

        return as_response(await await_me_maybe(advisor.around_llm(prompt, turn, call_next)), advisor)

    return await call(0, prompt)


async def _pieces(result: Any, advisor: Any) -> AsyncIterator[LLMDelta]:
    """Whatever ``around_llm_stream`` returned, as an async iterator of ``LLMDelta``."""
    if inspect.isawaitable(result):
        result = await result
    if hasattr(result, "__aiter__"):
        async for piece in result:
            yield piece if isinstance(piece, LLMDelta) else LLMDelta(text=str(piece))
    elif hasattr(result, "__iter__") and not isinstance(result, (str, bytes)):
        for piece in result:
            yield piece if isinstance(piece, LLMDelta) else LLMDelta(text=str(piece))
    else:
        raise TypeError(f"Advisor {getattr(advisor, 'name', advisor)!r} returned {type(result).__name__} from "
                        f"around_llm_stream; return an async iterator (or a list) of LLMDelta or strings.")


def run_stream_chain(advisors: list, prompt: Prompt, turn: TurnContext,
                     innermost: Callable[[Prompt], AsyncIterator[LLMDelta]], opened: list) -> AsyncIterator[LLMDelta]:
    """``innermost(prompt)`` wrapped by each advisor's ``around_llm_stream``, the first outermost.

    Every iterator made on the way is appended to ``opened`` so the caller can close them all
    (stopping the model's stream) when the turn is cancelled.
    """

    def call(position: int, prompt: Prompt) -> AsyncIterator[LLMDelta]:
        if position == len(advisors):
            stream = innermost(prompt)
        else:
            advisor = advisors[position]
            stream = _pieces(advisor.around_llm_stream(prompt, turn, lambda p: call(position + 1, p)), advisor)
        opened.append(stream)
        return stream

    return call(0, prompt)


class ToolShortCircuit:
    """What ``run_tool_chain`` learned: which advisor, if any, answered a call without ``call_next``."""

    def __init__(self) -> None:
        self.advisor: Any = None


def as_tool_result(result: Any, call: ToolCall, advisor: Any, *, content: Callable[[Any], str]) -> ToolResult:
    """What an advisor's ``around_tool`` returned, as a ``ToolResult`` (``content`` turns a
    value into the text the model reads)."""
    if isinstance(result, ToolResult):
        return result
    try:
        return ToolResult(call_id=call.id, name=call.name, content=content(result))
    except (TypeError, ValueError):
        raise TypeError(f"Advisor {getattr(advisor, 'name', advisor)!r} returned {type(result).__name__} from "
                        f"around_tool; return a ToolResult, a string or a JSON value.") from None


async def run_tool_chain(advisors: list, call: ToolCall, turn: TurnContext,
                         innermost: Callable[[ToolCall], Awaitable[ToolResult]], short: ToolShortCircuit, *,
                         content: Callable[[Any], str]) -> ToolResult:
    """``innermost(call)`` wrapped by each advisor's ``around_tool``, the first outermost."""

    async def call_at(position: int, call: ToolCall) -> ToolResult:
        if position == len(advisors):
            return await innermost(call)
        advisor = advisors[position]
        called = False

        async def call_next(changed: ToolCall) -> ToolResult:
            nonlocal called
            called = True
            return await call_at(position + 1, changed)

        result = as_tool_result(await await_me_maybe(advisor.around_tool(call, turn, call_next)), call, advisor,
                                content=content)
        if not called and short.advisor is None:
            short.advisor = advisor
        return result

    return await call_at(0, call)
