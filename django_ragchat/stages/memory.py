"""Memory strategies: which earlier messages of a conversation the model sees.

The message log is never changed by memory; a strategy reads the recent part of it (one query,
bounded by ``fetch_limit``, so a turn's cost does not grow with the conversation) and returns
whole turns that fit the history token budget. A turn is a user message with the replies that
follow it; cutting only at turn boundaries means the model never sees an answer without its
question.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async

from django_ragchat import hookimpl
from django_ragchat.components import Component
from django_ragchat.models import Message, ToolInvocation
from django_ragchat.types import HistoryMessage

if TYPE_CHECKING:
    from django_ragchat.turn.context import TurnContext


def load_recent_messages(conversation_id, before_seq: int, limit: int, *,
                         with_tools: bool = False) -> list[HistoryMessage]:
    """The last ``limit`` messages before ``before_seq`` that the model may see, oldest first.

    Failed assistant messages are left out (their partial text would mislead the model);
    incomplete ones (cancelled by the user) are kept, as the user saw them. ``with_tools``
    adds each answer's tool calls and results before it, in the OpenAI format (one more
    query, whatever the number of messages).
    """

    rows = list(
        Message.objects.filter(conversation_id=conversation_id, seq__lt=before_seq)
        .exclude(status__in=[Message.Status.ERROR, Message.Status.STREAMING])
        .order_by("-seq")
        .values_list("pk", "role", "content", "seq", "token_count", "trace__ended_by")[:limit]
    )
    rows.reverse()
    left_out = turns_left_out(rows)
    exchanges = tool_exchanges([pk for pk, role, *_ in rows if role == Message.Role.ASSISTANT]) if with_tools else {}
    messages = []
    for pk, role, content, seq, tokens, _ended_by in rows:
        if seq in left_out:
            continue
        messages += exchanges.get(pk, ())
        messages.append(HistoryMessage(role=role, content=content, seq=seq, token_count=tokens))
    return messages


#: The stage (``turn.pipeline.STAGES``) whose refusal leaves its turn out of the history.
REFUSED_INPUT_STAGE = "input_guardrails"


def turns_left_out(rows) -> set[int]:
    """The seqs of the messages the model and the query transformers never read again, of rows
    ``(..., role, content, seq, token_count, ended_by)`` in order (failed answers already left
    out): the turns an input guardrail refused, the user's message and the refusal (a refused
    injection, or a refused question carried as the conversation's opening); and a question
    whose answer failed, which is left without a reply (its retry asks it again, and the model
    would otherwise read it twice or answer it late)."""
    left_out = set()
    for row, after in zip(rows, [*rows[1:], None], strict=False):
        *_, role, _content, seq, _tokens, ended_by = row
        if role == Message.Role.ASSISTANT and ended_by == REFUSED_INPUT_STAGE:
            left_out.add(seq)
        if role == Message.Role.USER and (after is None or after[-5] == Message.Role.USER
                                          or after[-1] == REFUSED_INPUT_STAGE):
            left_out.add(seq)
    return left_out


#: What the model reads of a call whose answer ended before it had a result.
NOT_RUN = '{"error": "not_run", "message": "The answer ended before this call had a result."}'


def tool_exchanges(message_ids: list[int]) -> dict[int, list[HistoryMessage]]:
    """The tool calls of these assistant messages, as the history messages that go before
    each: per step, an assistant message with its ``tool_calls``, then one ``tool`` message
    per result. A result's tokens count on its ``tool`` message. One query."""
    if not message_ids:
        return {}
    steps: dict[tuple[int, int], list] = {}
    for row in (ToolInvocation.objects.filter(message_id__in=message_ids).order_by("message_id", "step", "index")
                .values_list("message_id", "step", "call_id", "name", "arguments", "content", "token_count")):
        steps.setdefault(row[:2], []).append(row)
    found: dict[int, list[HistoryMessage]] = {}
    for (message_id, _), calls in steps.items():
        exchange = found.setdefault(message_id, [])
        exchange.append(HistoryMessage(role="assistant", content="", token_count=4, tool_calls=tuple(
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments or "{}"}}
            for _, _, call_id, name, arguments, _, _ in calls)))
        exchange += [HistoryMessage(role="tool", content=content or NOT_RUN, tool_call_id=call_id, token_count=tokens)
                     for _, _, call_id, _, _, content, tokens in calls]
    return found


def split_turns(messages: list[HistoryMessage]) -> list[list[HistoryMessage]]:
    """Group messages into turns, each starting at a user message.

    Replies at the start with no question before them (the window began mid-turn) are dropped.
    """
    turns: list[list[HistoryMessage]] = []
    for message in messages:
        if message.role == "user":
            turns.append([message])
        elif turns:
            turns[-1].append(message)
    return turns


def newest_turns_within(turns: list[list[HistoryMessage]], *, max_tokens: int,
                        max_messages: int | None = None) -> list[HistoryMessage]:
    """The newest whole turns whose messages fit both limits, oldest first."""
    kept: list[list[HistoryMessage]] = []
    tokens = messages = 0
    for turn in reversed(turns):
        turn_tokens = sum(m.token_count for m in turn)
        said = sum(1 for m in turn if not m.is_tool_exchange)  # tool steps count by tokens, not as messages
        if tokens + turn_tokens > max_tokens:
            break
        if max_messages is not None and messages + said > max_messages:
            break
        kept.append(turn)
        tokens += turn_tokens
        messages += said
    return [m for turn in reversed(kept) for m in turn]


class MemoryStrategy(Component):
    """Base class: choose the history the model sees for this turn.

    ``select`` receives the turn and the history token budget and returns ``HistoryMessage``
    objects, oldest first. ``fetch_limit`` bounds how many recent messages are read. A strategy
    that reads the log itself instead of through ``recent`` must use ``turn.supplied_history``
    when it is set (see ``TurnContext``).
    """

    kind = "memory"

    def __init__(self, profile, *, fetch_limit: int = 200, **options: Any):
        super().__init__(profile, **options)
        self.fetch_limit = fetch_limit

    async def recent(self, turn: TurnContext) -> list[HistoryMessage]:
        """The newest ``fetch_limit`` messages before this turn's, oldest first: from the log
        (one query, none for a conversation's first message; with their tool calls when the
        profile offers tools: a model offered none may refuse a history that has them), or the
        ones the caller sent with the message (``turn.supplied_history``, no query)."""
        if turn.supplied_history is not None:
            return turn.supplied_history[-self.fetch_limit:] if self.fetch_limit > 0 else []
        if turn.user_message.seq <= 1:  # the conversation's first message: nothing before it
            return []
        return await sync_to_async(load_recent_messages)(
            turn.conversation.pk, turn.user_message.seq, self.fetch_limit, with_tools=self.sends_tool_calls(turn)
        )

    @staticmethod
    def sends_tool_calls(turn: TurnContext) -> bool:
        """Whether the history carries the earlier answers' tool calls and results: only to a
        profile that offers tools, and whose model calls them (a model offered none may refuse
        a request with tool messages)."""
        return turn.profile.offers_tools and turn.components.llm.calls_tools

    async def select(self, turn: TurnContext, budget_tokens: int) -> list[HistoryMessage]:
        raise NotImplementedError


class MessageWindowMemory(MemoryStrategy):
    """The last ``max_messages`` messages (default 20), in whole turns, within the budget."""

    name = "message_window"

    def __init__(self, profile, *, max_messages: int = 20, **options: Any):
        super().__init__(profile, **options)
        self.max_messages = max_messages

    async def select(self, turn, budget_tokens):
        messages = await self.recent(turn)
        return newest_turns_within(
            split_turns(messages), max_tokens=budget_tokens, max_messages=self.max_messages
        )


class TokenWindowMemory(MemoryStrategy):
    """As many of the newest whole turns as fit the history budget (or ``max_tokens``)."""

    name = "token_window"

    def __init__(self, profile, *, max_tokens: int | None = None, **options: Any):
        super().__init__(profile, **options)
        self.max_tokens = max_tokens

    async def select(self, turn, budget_tokens):
        limit = budget_tokens if self.max_tokens is None else min(budget_tokens, self.max_tokens)
        messages = await self.recent(turn)
        return newest_turns_within(split_turns(messages), max_tokens=limit)


@hookimpl
def register_memory_strategies(register):
    register(MessageWindowMemory)
    register(TokenWindowMemory)
