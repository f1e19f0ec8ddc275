"""Prompt augmenters: build what the model sees from the system prompt, the history, the
retrieved documents and the question, within the token budget.

Built in: ``context``. The system message carries only the profile's system prompt; retrieved
text goes into the user turn, numbered, so the model can cite ``[1]`` and retrieved text never
gains the authority of the system role. The history is the user's original words (never
earlier prompts' retrieved context). Documents are added best first while they fit the context
budget; the ones that don't fit are dropped whole and counted in the trace.

When nothing was retrieved the profile's ``empty_context`` policy applies: ``"decline"``
(default, as Spring AI's ``allowEmptyContext=false``) ends the turn with the profile's
``no_context_answer`` without calling the model; ``"answer"`` lets the model answer from the
history alone. A turn whose retrieval was skipped on purpose (``SkipRetrieval``), and a turn
whose model is offered tools (it may answer with one), always go to the model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django_ragchat import hookimpl
from django_ragchat.components import Component
from django_ragchat.tokens import count_tokens
from django_ragchat.types import CannedAnswer, EndTurn, HistoryMessage, Prompt, Query, RetrievedChunk

if TYPE_CHECKING:
    from django_ragchat.turn.context import TurnContext

DEFAULT_CONTEXT_TEMPLATE = (
    "Context passages (cite them as [n]):\n\n{context}\n\n"
    "Answer using only the passages above when they are relevant.\n\nQuestion: {question}"
)
DEFAULT_PASSAGE_TEMPLATE = "[{index}] {label}\n{text}"


class PromptAugmenter(Component):
    """Base class: ``augment(turn, query, history, documents, budget)`` returns a ``Prompt``
    or an ``EndTurn``. ``budget`` is the number of tokens left for the retrieved context."""

    kind = "prompt_augmenter"

    def augment(self, turn: TurnContext, query: Query, history: list[HistoryMessage],
                documents: list[RetrievedChunk], budget: int) -> Prompt | EndTurn:
        raise NotImplementedError


class ContextPromptAugmenter(PromptAugmenter):
    """Numbered passages in the user turn. Options: ``template`` (with ``{context}`` and
    ``{question}``), ``passage_template`` (with ``{index}``, ``{label}``, ``{text}``)."""

    name = "context"

    def __init__(self, profile, *, template: str = DEFAULT_CONTEXT_TEMPLATE,
                 passage_template: str = DEFAULT_PASSAGE_TEMPLATE, **options: Any):
        super().__init__(profile, **options)
        self.template = template
        self.passage_template = passage_template

    def passage(self, index: int, chunk: RetrievedChunk) -> str:
        label = " — ".join(part for part in (chunk.title, chunk.source) if part)
        text = chunk.text
        return self.passage_template.format(index=index, label=label, text=text)

    def fit_documents(self, documents: list[RetrievedChunk], budget: int) -> tuple[list[RetrievedChunk], list[str], int]:
        kept, passages, used = [], [], 0
        for chunk in documents:
            passage = self.passage(len(kept) + 1, chunk)
            tokens = count_tokens(passage) + 2
            if used + tokens > budget:
                continue  # a smaller, lower-ranked passage may still fit
            kept.append(chunk)
            passages.append(passage)
            used += tokens
        return kept, passages, used

    def augment(self, turn, query, history, documents, budget):
        question = query.original or query.text
        # A model offered tools may answer with one what no document says ("When is my next
        # appointment?"): the profile's tools are the site's own data (an outside user's trial).
        declines = self.profile.empty_context == "decline" and not (
            self.profile.offers_tools and turn.components.llm.calls_tools)
        if not documents and not turn.retrieval_skipped and declines:
            return CannedAnswer(self.profile.no_context_answer, reason="no documents retrieved")
        kept, passages, used = self.fit_documents(documents, budget)
        turn.trace["prompt"]["documents_dropped_for_budget"] = len(documents) - len(kept)
        if documents and not kept and declines:
            return CannedAnswer(self.profile.no_context_answer,
                                reason="no retrieved document fits the context budget")
        if kept:
            user_content = self.template.format(context="\n\n".join(passages), question=question)
        else:
            user_content = question
        messages = [{"role": "system", "content": self.profile.system_prompt}]
        messages += [m.as_message() for m in history if m.role in ("user", "assistant", "tool")]
        messages.append({"role": "user", "content": user_content})
        # A tool step's tokens were counted when it was saved (its calls are not "content").
        token_count = sum(count_tokens(m["content"]) + 4 for m in messages if not _is_tool_step(m)) + sum(
            m.token_count + 4 for m in history if m.is_tool_exchange)
        return Prompt(messages=tuple(messages), question=question, search_query=query.text,
                      documents=tuple(kept), token_count=token_count, asker_names=asker_names(turn.user))


def asker_names(user) -> tuple[str, ...]:
    """How the asking user may name themselves: their username, first name and full name (not
    the last name alone: "Smith's order" may be a relative's); none for a visitor."""
    if not getattr(user, "is_authenticated", False):
        return ()
    full_name = user.get_full_name() if hasattr(user, "get_full_name") else ""
    found = (user.get_username(), getattr(user, "first_name", ""), full_name)
    return tuple(dict.fromkeys(name.strip() for name in found if isinstance(name, str) and name.strip()))


def _is_tool_step(message: dict) -> bool:
    return message["role"] == "tool" or "tool_calls" in message


@hookimpl
def register_prompt_augmenters(register):
    register(ContextPromptAugmenter)
