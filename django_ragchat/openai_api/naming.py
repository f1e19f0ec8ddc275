"""How the endpoint names a conversation it starts: once its answer is saved, never before.

A request without a conversation starts a new one holding only its last message, the question
(``views._events``); the earlier messages a stateless client sends again are its history. The
conversation is named after the request's *first* user message ("Tell me about the Aurora X2."
says more in the admin's and the API's lists than the stored "And how much is it?"), as the
chat widget names its conversations: once the answer is saved, and never after a message an
input guardrail refused (``models.naming_questions``). So a conversation whose question is
refused stays untitled, and a refused message a stateless client sends again at the head of its
next request's history names nothing: that message is checked by the profile's input guardrails
as a question would be (``transport.turns.as_input_guardrails_leave``), and names the
conversation as they leave it (redacted, if they redact); refused, the question it stored names
it instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import sync_to_async

from django_ragchat.events import Accepted, Completed, TurnEvent
from django_ragchat.models import Conversation, naming_questions
from django_ragchat.text import question_label
from django_ragchat.transport import turns as transport


async def named_once_answered(events: AsyncIterator[TurnEvent], first: str | None,
                              user: Any) -> AsyncIterator[TurnEvent]:
    """The events of a new conversation's turn, the conversation named (``name``) once its
    answer is saved, before the ``done`` event is passed on: a client that reads the
    conversation after the answer finds its name. ``first``: the request's first user message
    when it is an earlier one than the question (``None``: the question is the first)."""
    accepted = None
    async with contextlib.aclosing(events):
        async for event in events:
            if isinstance(event, Accepted):
                accepted = event
            elif isinstance(event, Completed) and accepted is not None and not accepted.replayed:
                await name(accepted, first, user)  # a resend's (replayed) was named by its first attempt
            yield event


async def name(accepted: Accepted, first: str | None, user: Any) -> None:
    """Title the conversation ``accepted`` started, unless its question was refused or it has a
    title already: after ``first`` as the input guardrails leave it, else (``None``, or refused)
    after the question as stored."""
    stored = await sync_to_async(_stored_question)(accepted)
    if stored is None:  # an input guardrail refused the question: nothing names the conversation
        return
    kept = None
    if first is not None:  # only then is the conversation needed: its profile's guardrails check ``first``
        conversation = await Conversation.objects.aget(pk=accepted.conversation_id)
        kept = await transport.as_input_guardrails_leave(conversation, first, user)
    title = question_label(kept or stored)
    if title:
        await sync_to_async(Conversation.objects.filter(pk=accepted.conversation_id, title="").update)(title=title)


def _stored_question(accepted: Accepted) -> str | None:
    """The question as saved (as an input guardrail's redaction left it), or ``None`` when an
    input guardrail refused it. One query."""
    return naming_questions().filter(pk=accepted.user_message_id).values_list("content", flat=True).first()
