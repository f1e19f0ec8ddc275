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
from django_ragchat.models import Message
from django_ragchat.types import HistoryMessage

if TYPE_CHECKING:
    from django_ragchat.turn.context import TurnContext


def load_recent_messages(conversation_id, before_seq: int, limit: int) -> list[HistoryMessage]:
    """The last ``limit`` messages before ``before_seq`` that the model may see, oldest first.

    Failed assistant messages are left out (their partial text would mislead the model);
    incomplete ones (cancelled by the user) are kept, as the user saw them.
    """

    rows = (
        Message.objects.filter(conversation_id=conversation_id, seq__lt=before_seq)
        .exclude(status__in=[Message.Status.ERROR, Message.Status.STREAMING])
        .order_by("-seq")
        .values_list("role", "content", "seq", "token_count")[:limit]
    )
    return [HistoryMessage(role=r, content=c, seq=s, token_count=t) for r, c, s, t in reversed(rows)]


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
        if tokens + turn_tokens > max_tokens:
            break
        if max_messages is not None and messages + len(turn) > max_messages:
            break
        kept.append(turn)
        tokens += turn_tokens
        messages += len(turn)
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
        (one query), or the ones the caller sent with the message (``turn.supplied_history``,
        no query)."""
        if turn.supplied_history is not None:
            return turn.supplied_history[-self.fetch_limit:] if self.fetch_limit > 0 else []
        return await sync_to_async(load_recent_messages)(
            turn.conversation.pk, turn.user_message.seq, self.fetch_limit
        )

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
