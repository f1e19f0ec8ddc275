"""Running the tools the model asks for: the turn's side of tool calling (docs/tools.md).

``offer_tools`` decides which of the profile's tools the turn offers: those the asking user
may use (each tool's ``permission``, checked once per turn). ``tool_round`` runs one round of
the model's calls, concurrently, and yields their events; for each call, inside the advisors'
``around_tool``:

1. the tool is looked up among those offered (an unknown tool, or one the user may not use,
   is an error result: it never runs);
2. the arguments are validated against its schema and converted (bad ones are an error the
   model reads, so it can correct itself);
3. a tool that ``requires_confirmation`` waits for the user's decision
   (``turn.confirmations``): rejected or abandoned, it does not run. On a turn whose client
   cannot ask the user (``TurnContext.can_approve`` false: the OpenAI-compatible endpoint) it
   fails at once, ``approval_unavailable``, and does not run;
4. it runs, as the asking user, within its timeout; what it raises becomes an error result
   (a ``ToolError``'s message is shown to the model, anything else is logged);
5. its return value becomes the text the model reads (JSON, cut at ``max_result_chars``).

Nothing here fails the turn: every outcome is a ``ToolResult`` the model sees. Stopping the
turn cancels the calls still running (an ``async`` tool is cancelled where it awaits; a sync
tool's thread cannot be interrupted and finishes unheard) and cancels the pending approvals.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async

from django_ragchat.events import ToolCallFinished, ToolCallUpdate, TurnEvent
from django_ragchat.plugins import get_tools
from django_ragchat.tokens import count_tokens
from django_ragchat.tools import Tool, ToolArgumentsError, ToolError
from django_ragchat.turn import confirmations, persistence, stops
from django_ragchat.turn.advisors import ToolShortCircuit, run_tool_chain
from django_ragchat.types import ToolCall, ToolResult

if TYPE_CHECKING:
    from django_ragchat.turn.context import TurnContext

logger = logging.getLogger(__name__)

#: What the model reads for each way a call can fail, by error code (docs/tools.md lists them).
ERROR_MESSAGES = {
    "unknown_tool": "There is no tool with this name; use one of the tools offered.",
    "forbidden": "This tool is not available to this user.",
    "invalid_arguments": "The arguments do not fit the tool's parameters: {detail}",
    "tool_failed": "The tool failed; it could not answer this time.",
    "timeout": "The tool did not answer within {seconds:g} seconds.",
    "bad_result": "The tool's result could not be read.",
    "rejected": "The user declined this action; it was not carried out.",
    "abandoned": "The user did not confirm this action in time; it was not carried out.",
    "approval_unavailable": ("This action needs the user's approval, which the app they are using cannot ask for; "
                             "it was not carried out. They can ask for it in the site's own chat, where they can "
                             "approve it."),
    "cancelled": "The answer was stopped before this action finished.",
}


@dataclasses.dataclass
class ToolRun:
    """One call of the turn, and what became of it (saved as a ``ToolInvocation``)."""

    step: int
    index: int
    call: ToolCall
    label: str = ""
    result: ToolResult | None = None
    requires_confirmation: bool = False
    invocation_id: int | None = None  # saved at once when it awaits the user's decision
    short_circuited_by: str = ""
    # The call as the user was asked to approve it (an advisor may have changed the model's).
    confirmed: ToolCall | None = None
    # What a tool that raised raised (``repr``, cut): for staff in the trace, never the model
    # or the user, who read ``tool_failed``.
    raised: str = ""
    # How long it waited for the user's decision (milliseconds; ``None``: it was not asked):
    # apart from ``result.ms``, the call's own time, which a 30-second wait would drown.
    wait_ms: float | None = None

    @property
    def shown(self) -> ToolCall:
        """The call as it is shown and kept: as the user approved it, else as the model wrote it."""
        return self.confirmed or self.call

    @property
    def arguments_for_people(self) -> Any:
        parsed = self.shown.parsed_arguments
        return parsed if parsed is not None else self.shown.arguments

    @property
    def token_count(self) -> int:
        content = self.result.content if self.result else ""
        return count_tokens(self.call.arguments) + count_tokens(content) + count_tokens(self.call.name) + 8

    def payload(self) -> dict[str, Any]:
        """The JSON form clients receive (as ``ToolInvocation.payload``)."""
        result = self.result
        return {
            "id": self.call.id, "name": self.call.name, "label": self.label, "arguments": self.arguments_for_people,
            "step": self.step, "status": result.status if result else "cancelled",
            "content": result.content if result else "", "error": result.error if result else None,
            "ms": round(result.ms, 3) if result else 0.0,
            "confirmation_id": self.invocation_id if self.requires_confirmation else None,
        }

    def trace(self) -> dict[str, Any]:
        result = self.result
        entry: dict[str, Any] = {
            "step": self.step, "index": self.index, "id": self.call.id, "name": self.call.name,
            "arguments": self.arguments_for_people, "status": result.status if result else "cancelled",
            "ms": round(result.ms, 3) if result else 0.0,
            "result": (result.content if result else "")[:4000],
        }
        if result is not None and result.error:
            entry["error"] = result.error
        if self.requires_confirmation:
            entry["confirmation_id"] = self.invocation_id
        if self.wait_ms is not None:
            entry["wait_ms"] = round(self.wait_ms, 3)
        if self.short_circuited_by:
            entry["short_circuited_by"] = self.short_circuited_by
        if self.raised:
            entry["raised"] = self.raised
        return entry


def error_result(call: ToolCall, code: str, **details: Any) -> ToolResult:
    """The ``ToolResult`` of a call that failed with ``code``: the model reads the code and
    a sentence about it."""
    message = ERROR_MESSAGES[code].format(**details)
    status = code if code in ("rejected", "abandoned", "cancelled") else "error"
    content = json.dumps({"error": code, "message": message}, ensure_ascii=False)
    return ToolResult(call_id=call.id, name=call.name, content=content, status=status,
                      error={"code": code, "message": message})


def _offered(tools: list[Tool], turn: TurnContext) -> list[Tool]:
    return [t for t in tools if t.allowed(turn)]


async def offer_tools(turn: TurnContext, built_in: tuple[Tool, ...] = ()) -> dict[str, Tool]:
    """The tools this turn offers, by name: the profile's tools the asking user may use, and
    ``built_in`` ones (the search tool). Sets ``turn.tools`` and notes them in the trace."""
    registry = get_tools()
    named = []
    for name in turn.profile.tools:
        found = registry.get(name)
        if found is None:
            turn.warn(f"the profile offers a tool {name!r} that no plugin registered")  # ragchat.E002 too
        else:
            named.append(found)
    if any(t.permission is not None for t in named):
        named = await sync_to_async(_offered)(named, turn)  # permission checks may query the database
    turn.tools = {t.name: t for t in (*built_in, *named)}
    turn.trace["tools_offered"] = list(turn.tools)
    return turn.tools


def _refused(turn: TurnContext, call: ToolCall) -> ToolResult:
    """The result of a call to a tool the turn did not offer: ``forbidden`` when the profile
    has it but the user may not use it, ``unknown_tool`` otherwise."""
    if call.name in turn.profile.tools and get_tools().get(call.name) is not None:
        return error_result(call, "forbidden")
    return error_result(call, "unknown_tool")


async def _confirmed(turn: TurnContext, run: ToolRun, call: ToolCall, emit: Callable[[TurnEvent], None]) -> str:
    """Save the call as pending, tell the client, and wait for the user's decision."""
    run.requires_confirmation, run.confirmed = True, call
    if tool := turn.tools.get(call.name):
        run.label = tool.describe(call.parsed_arguments)  # what the user approves is what runs
    run.invocation_id = await sync_to_async(persistence.save_pending_tool_call)(turn.assistant_message.pk, run)
    emit(_update(run, call, "awaiting_confirmation"))
    with _awaiting_decision(turn, run):
        decision = await confirmations.wait_for_decision(run.invocation_id, turn.profile.tool_confirmation_timeout)
    if decision == confirmations.Status.APPROVED:
        emit(_update(run, call, "approved"))
    return decision


@contextlib.contextmanager
def _awaiting_decision(turn: TurnContext, run: ToolRun):
    """Time the block, the call waiting for the user's decision: ``run.wait_ms``, and the
    turn's ``trace["approval_wait_ms"]``, the time during which at least one of its calls
    waited (parallel waits counted once), which the ``llm`` stage's timing includes."""
    started = time.perf_counter()
    waiting = turn.state.setdefault("_approval_waits", {"calls": 0, "since": started})
    if not waiting["calls"]:
        waiting["since"] = started
    waiting["calls"] += 1
    try:
        yield
    finally:  # also when the wait is cancelled (the answer stopped)
        ended = time.perf_counter()
        run.wait_ms = (ended - started) * 1000
        waiting["calls"] -= 1
        if not waiting["calls"]:
            total = turn.trace.get("approval_wait_ms", 0.0) + (ended - waiting["since"]) * 1000
            turn.trace["approval_wait_ms"] = round(total, 3)


def _not_approved(turn: TurnContext, call: ToolCall, decision: str) -> ToolResult:
    """The result of a call the user did not approve. Cancelled: its answer was asked to stop
    from another process while it waited (``stops.request_stop``), so the turn stops now."""
    if decision == confirmations.Status.CANCELLED:
        stops.stop_here(turn.conversation.pk)
        return error_result(call, "cancelled")
    return error_result(call, str(decision) if decision in ("rejected", "abandoned") else "abandoned")


async def _invoke(turn: TurnContext, run: ToolRun, call: ToolCall, emit: Callable[[TurnEvent], None]) -> ToolResult:
    """The innermost of a call's chain: look up, validate, confirm, run, serialise."""
    tool = turn.tools.get(call.name)
    if tool is None:
        return _refused(turn, call)
    try:
        arguments = tool.bind(call.arguments)
    except ToolArgumentsError as exc:
        return error_result(call, "invalid_arguments", detail=exc.message)
    if tool.requires_confirmation and not turn.can_approve:
        # Nobody could decide (an OpenAI client has no way to): waiting would hold the request
        # for tool_confirmation_timeout to end "abandoned". The model reads why, at once.
        run.requires_confirmation = True
        return error_result(call, "approval_unavailable")
    if tool.requires_confirmation:
        decision = await _confirmed(turn, run, call, emit)
        if decision != confirmations.Status.APPROVED:
            return _not_approved(turn, call, decision)
    seconds = tool.timeout or turn.profile.tool_timeout
    try:
        value = await asyncio.wait_for(tool.run(turn, arguments), seconds)
    except TimeoutError:
        return error_result(call, "timeout", seconds=seconds)
    except ToolError as exc:
        content = json.dumps({"error": "tool_error", "message": str(exc)}, ensure_ascii=False)
        return ToolResult(call_id=call.id, name=call.name, content=content, status="error",
                          error={"code": "tool_error", "message": str(exc)})
    except Exception as exc:
        logger.exception("ragchat tool %r failed in conversation %s", call.name, turn.conversation.pk)
        run.raised = repr(exc)[:500]
        return error_result(call, "tool_failed")
    try:
        content = tool.result_text(value)
    except (TypeError, ValueError):
        logger.exception("ragchat tool %r returned a value JSON cannot carry", call.name)
        return error_result(call, "bad_result")
    return ToolResult(call_id=call.id, name=call.name, content=content)


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


async def _run_one(turn: TurnContext, run: ToolRun, emit: Callable[[TurnEvent], None]) -> None:
    started = time.perf_counter()
    advisors = turn.components.tool_advisors
    short = ToolShortCircuit()
    try:
        if advisors:
            result = await run_tool_chain(advisors, run.call, turn, lambda c: _invoke(turn, run, c, emit), short,
                                          content=_as_text)
        else:
            result = await _invoke(turn, run, run.call, emit)
    except Exception:  # an advisor failed: the call failed, the turn goes on
        logger.exception("ragchat: an advisor failed around tool %r", run.call.name)
        result = error_result(run.call, "tool_failed")
    run.short_circuited_by = getattr(short.advisor, "name", "") if short.advisor is not None else ""
    # The call's own time: the wait for the user's decision is the user's, kept apart (wait_ms).
    own = (time.perf_counter() - started) * 1000 - (run.wait_ms or 0.0)
    run.result = dataclasses.replace(result, call_id=run.call.id, ms=max(own, 0.0))


def _update(run: ToolRun, call: ToolCall, status: str) -> ToolCallUpdate:
    return ToolCallUpdate(id=run.call.id, name=call.name, arguments=run.arguments_for_people, label=run.label,
                          step=run.step, status=status, confirmation_id=run.invocation_id)


def _finished(run: ToolRun) -> ToolCallFinished:
    result = run.result
    return ToolCallFinished(id=run.call.id, name=run.call.name, status=result.status, content=result.content,
                            error=result.error, ms=round(result.ms, 3))


def _label(turn: TurnContext, call: ToolCall) -> str:
    tool = turn.tools.get(call.name)
    return tool.describe(call.parsed_arguments) if tool is not None else f"Using {call.name}…"


async def tool_round(turn: TurnContext, calls: tuple[ToolCall, ...], step: int) -> AsyncIterator[TurnEvent]:
    """Run one round of the model's calls concurrently, yielding their events: a
    ``tool_call`` for each at once, then, as they come, approvals asked for and each call's
    ``tool_result``. The runs (``ToolRun``, with their results) are added to
    ``turn.tool_runs``. Closing the iterator early cancels the calls still running."""
    runs = [ToolRun(step=step, index=i, call=call, label=_label(turn, call)) for i, call in enumerate(calls)]
    turn.tool_runs.extend(runs)
    for run in runs:
        yield _update(run, run.call, "requested")
    queue: asyncio.Queue[TurnEvent] = asyncio.Queue()
    tasks = {asyncio.ensure_future(_run_one(turn, run, queue.put_nowait)): run for run in runs}
    pending, getter = set(tasks), None
    try:
        while pending:
            getter = asyncio.ensure_future(queue.get())
            done, _ = await asyncio.wait(pending | {getter}, return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                yield getter.result()
            else:
                getter.cancel()
            while not queue.empty():
                yield queue.get_nowait()
            for task in done - {getter}:
                pending.discard(task)
                task.result()  # _run_one turns every failure into a result; a bug surfaces here
                yield _finished(tasks[task])
    finally:
        if getter is not None and not getter.done():
            getter.cancel()
        await _cancel(tasks, pending)


async def _cancel(tasks: dict[asyncio.Future, ToolRun], pending: set[asyncio.Future]) -> None:
    """Cancel the calls still running (the turn stopped) and mark them so."""
    for task in pending:
        task.cancel()
    for task in pending:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        run = tasks[task]
        if run.result is None:
            run.result = error_result(run.call, "cancelled")
