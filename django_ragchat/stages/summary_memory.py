"""Summary memory: older turns folded into a rolling summary that the model sees instead.

A built-in plugin: a profile opts in with ``"memory": "summary"``. What the model sees each turn:

1. a *memory message*: the conversation's summary (and the user's long-term facts, see below)
   as a user message, followed by a short assistant acknowledgement;
2. the newest whole turns after the part of the log the summary covers, as many as fit the
   rest of the history budget; on a profile that offers tools, with their tool calls and
   results (as the token-window memory sends them). The turns folded into the summary are its
   words only.

The pair is a user/assistant exchange rather than a second system message on purpose: the
summary is derived from what users wrote, so it must not gain the authority of the system
prompt (the same rule as for retrieved text, see ``prompts``), and strict chat templates
(Mistral, Llama) reject a system message anywhere but first and require roles to alternate.
The system prompt itself is still read from the profile at call time, never stored.

**When summaries are written.** Summarising is a model call, so it is kept off the hot path:
when a turn completes (the ``on_turn_completed`` hook) and the messages not yet summarised no
longer fit beside a full-size summary, a *fold* is enqueued as the ``fold_summary`` task on
Django's tasks framework (``django_ragchat.tasks``). It reads the unsummarised messages, keeps
the newest turns worth ``keep_share`` of the budget (their tool calls counted), folds the older
ones into the summary (in batches of ``max_fold_tokens`` for long backlogs, with the
synchronous client) and saves it. The next turn uses it. On a backend with a worker
(``django_tasks_db`` and ``db_worker``) the fold runs there; on Django's default immediate
backend it runs as the turn completes, after the answer is saved and before the ``done`` event,
in a thread off the event loop — a site that uses summary memory with a remote model should run
a worker. Until a fold lands (or when it
fails: the model is down) the prompt still stays within budget: the oldest unsummarised turns
are left out, and the trace's ``memory.not_shown`` says how many.

**Where summaries live.** One ``MemoryRecord(kind="summary", conversation=...)`` per
conversation, ``covers_until_seq`` the last message it stands for; the message log itself is
never changed. Staff read and correct it in the admin (the conversation page); the next fold
starts from the corrected text. A fold that finds the record changed while it was running
(staff edited it, another process folded) discards its result.

**Long-term facts.** Facts about a user are ``MemoryRecord(kind="fact", user=...)`` rows
(``conversation`` empty: they follow the user into every conversation; set: only that one).
No hook is needed to contribute them: a plugin creates the rows, e.g. from its own
``on_turn_completed`` implementation, and this strategy shows the newest ``max_facts`` of them
in the memory message (``include_facts``).

**Cost per turn.** Two SQL queries whatever the conversation's length: the summary and facts,
then the unsummarised messages (the newest ``fetch_limit``); one more for their tool calls on a
profile that offers tools.

Options: ``summary_share`` (0.25, the share of the history budget the memory message may
take; longer summaries are cut), ``keep_share`` (0.3, the newest turns a fold leaves
unsummarised; a fold runs about every ``(1 - summary_share - keep_share)`` of the budget's
worth of conversation),
``max_fold_tokens`` (3000, transcript tokens per summarising call), ``include_facts`` (True),
``max_facts`` (20), ``fetch_limit`` (200), the templates ``instructions`` and ``prompt`` (the
summarising call: ``{max_words}``; ``{summary}``, ``{messages}``), ``summary_template``
(``{summary}``), ``facts_template`` (``{facts}``), ``acknowledgement``, and the model options of
``backends.openai.chat_model_from_options`` (the summarising model defaults to the profile's).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.db.models import Case, IntegerField, Q, Value, When
from django.utils import timezone

from django_ragchat import hookimpl, tasks
from django_ragchat.backends.openai import chat_model_from_options
from django_ragchat.exceptions import LLMError
from django_ragchat.models import MemoryRecord, Message
from django_ragchat.stages.llm_transformers import PromptedModel, is_refusal
from django_ragchat.stages.memory import (
    MemoryStrategy,
    newest_turns_within,
    split_turns,
    tool_exchanges,
    turns_left_out,
)
from django_ragchat.tokens import count_tokens
from django_ragchat.types import HistoryMessage

if TYPE_CHECKING:
    from django_ragchat.turn.context import TurnContext

logger = logging.getLogger(__name__)

STATE_KEY = "summary_memory"

DEFAULT_INSTRUCTIONS = (
    "You maintain the running summary of a conversation between a user and an assistant. Merge the "
    "previous summary and the new messages into one updated summary. Keep names, numbers, products, "
    "decisions, open questions and the user's stated preferences; drop greetings and small talk. "
    "Write plain prose of at most {max_words} words. Reply with the summary only."
)
DEFAULT_PROMPT = "Previous summary:\n{summary}\n\nNew messages:\n{messages}\n\nUpdated summary:"
DEFAULT_SUMMARY_TEMPLATE = "Summary of our conversation so far (older messages are not shown):\n{summary}"
DEFAULT_FACTS_TEMPLATE = "Facts about me:\n{facts}"
DEFAULT_ACKNOWLEDGEMENT = "Understood."


# --- Reading the memory ------------------------------------------------------------------------


def _visible(qs):
    return qs.exclude(status__in=[Message.Status.ERROR, Message.Status.STREAMING])


#: What ``_history`` reads of each message (``memory.turns_left_out`` reads the stage that ended it).
_FIELDS = ("pk", "role", "content", "seq", "token_count", "trace__ended_by")


def _history(rows, *, with_tools: bool = False) -> list[HistoryMessage]:
    """The messages of ``rows`` (``_FIELDS``, oldest first) the model may see; ``with_tools``:
    each answer preceded by its tool calls and results (``memory.tool_exchanges``, one query)."""
    rows = list(rows)
    left_out = turns_left_out(rows)
    exchanges = tool_exchanges([pk for pk, role, *_ in rows if role == Message.Role.ASSISTANT]) if with_tools else {}
    messages = []
    for pk, role, content, seq, tokens, _ in rows:
        if seq not in left_out:
            messages += exchanges.get(pk, ())
            messages.append(HistoryMessage(role=role, content=content, seq=seq, token_count=tokens))
    return messages


def _said(messages: list[HistoryMessage]) -> int:
    """How many of ``messages`` are words of the user or the answer (not tool steps)."""
    return sum(1 for m in messages if not m.is_tool_exchange)


def _cut_to_tokens(text: str, tokens: int) -> str:
    """``text`` shortened (at a word boundary, with "…") to at most ``tokens`` tokens."""
    if count_tokens(text) <= tokens:
        return text
    while text and count_tokens(text + " …") > tokens:
        cut = text[: int(len(text) * max(0.0, tokens) / count_tokens(text + " …") * 0.95)]
        text = cut.rsplit(" ", 1)[0] if " " in cut.strip() else cut
    return text + " …" if text else ""


class SummaryMemory(MemoryStrategy):
    """A rolling summary of older turns plus the newest turns; see the module docstring."""

    name = "summary"

    def __init__(self, profile, *, summary_share: float = 0.25, keep_share: float = 0.3,
                 max_fold_tokens: int = 3000, include_facts: bool = True, max_facts: int = 20,
                 instructions: str | None = None, prompt: str | None = None,
                 summary_template: str = DEFAULT_SUMMARY_TEMPLATE, facts_template: str = DEFAULT_FACTS_TEMPLATE,
                 acknowledgement: str = DEFAULT_ACKNOWLEDGEMENT, **options: Any):
        chat = chat_model_from_options(profile, options, max_tokens=500)
        super().__init__(profile, **options)
        if not (0 < summary_share < 1 and 0 < keep_share < 1 and summary_share + keep_share < 1):
            raise ImproperlyConfigured(
                "summary memory: summary_share and keep_share must be between 0 and 1 and add up to less than 1 "
                "(the rest is how much conversation accumulates between two folds)."
            )
        self.summary_share = summary_share
        self.keep_share = keep_share
        self.max_fold_tokens = max_fold_tokens
        self.include_facts = include_facts
        self.max_facts = max_facts
        self.summary_template = summary_template
        self.facts_template = facts_template
        self.acknowledgement = acknowledgement
        self.connection = chat.connection
        self.model = PromptedModel(self.name, chat, instructions=instructions or DEFAULT_INSTRUCTIONS,
                                   prompt=prompt or DEFAULT_PROMPT, fields=("max_words", "summary", "messages"))
        for option, template, field in (("summary_template", summary_template, "summary"),
                                         ("facts_template", facts_template, "facts")):
            if "{" + field + "}" not in template:
                raise ImproperlyConfigured(f"summary memory: {option} must contain {{{field}}}.")

    def memory_cap(self, budget_tokens: int) -> int:
        """Tokens the memory message (summary and facts, with the acknowledgement) may take."""
        return int(budget_tokens * self.summary_share)

    def load(self, conversation, before_seq: int, supplied: list[HistoryMessage] | None = None, *,
             with_tools: bool = False) -> tuple[dict | None, list[str], list[HistoryMessage], bool]:
        """(summary row, facts, unsummarised messages before ``before_seq`` (the newest
        ``fetch_limit``, oldest first), whether that limit cut them). Two queries; with
        ``with_tools`` each answer comes after its tool calls and results, as the token-window
        memory sends them (one query more). The summary folds words only: the calls of the
        messages it covers are not sent.

        With ``supplied`` (the messages a stateless caller sent, ``TurnContext.supplied_history``)
        those are the messages and there is no summary: one query, for the facts."""

        kinds = Q(conversation_id=conversation.pk, kind=MemoryRecord.Kind.SUMMARY)
        if self.include_facts:
            scope = Q(conversation_id=conversation.pk)
            if conversation.owner_id is not None:
                scope |= Q(user_id=conversation.owner_id, conversation__isnull=True)
            kinds |= Q(kind=MemoryRecord.Kind.FACT) & scope
        summary_first = Case(When(kind=MemoryRecord.Kind.SUMMARY, then=Value(0)), default=Value(1),
                             output_field=IntegerField())
        records = list(
            MemoryRecord.objects.filter(kinds)
            .order_by(summary_first, "-covers_until_seq", "-updated_at")
            .values("kind", "content", "covers_until_seq")[: self.max_facts + 1]
        )
        summary = records[0] if records and records[0]["kind"] == MemoryRecord.Kind.SUMMARY else None
        facts = [r["content"] for r in records if r["kind"] == MemoryRecord.Kind.FACT][: self.max_facts]
        if supplied is not None:
            return None, facts, supplied[-self.fetch_limit:], len(supplied) >= self.fetch_limit
        covers = (summary or {}).get("covers_until_seq") or 0
        rows = list(
            _visible(Message.objects.filter(conversation_id=conversation.pk, seq__gt=covers, seq__lt=before_seq))
            .order_by("-seq").values_list(*_FIELDS)[: self.fetch_limit]
        )
        return summary, facts, _history(reversed(rows), with_tools=with_tools), len(rows) >= self.fetch_limit

    def memory_messages(self, summary: dict | None, facts: list[str], cap: int) -> list[HistoryMessage]:
        """The user/assistant pair carrying the summary and facts, within ``cap`` tokens."""
        parts = []
        if facts:
            parts.append(self.facts_template.format(facts="\n".join(f"- {f.strip()}" for f in facts)))
        if summary and summary["content"].strip():
            parts.append(self.summary_template.format(summary=summary["content"].strip()))
        if not parts:
            return []
        acknowledgement_tokens = count_tokens(self.acknowledgement)
        text = _cut_to_tokens("\n\n".join(parts), cap - acknowledgement_tokens)
        if not text:
            return []
        seq = (summary or {}).get("covers_until_seq") or 0
        return [HistoryMessage(role="user", content=text, seq=seq, token_count=count_tokens(text), from_memory=True),
                HistoryMessage(role="assistant", content=self.acknowledgement, seq=seq,
                               token_count=acknowledgement_tokens, from_memory=True)]

    async def select(self, turn: TurnContext, budget_tokens: int) -> list[HistoryMessage]:
        summary, facts, messages, cut = await sync_to_async(self.load)(
            turn.conversation, turn.user_message.seq, turn.supplied_history, with_tools=self.sends_tool_calls(turn))
        memory = self.memory_messages(summary, facts, self.memory_cap(budget_tokens))
        memory_tokens = sum(m.token_count for m in memory)
        recent = newest_turns_within(split_turns(messages), max_tokens=budget_tokens - memory_tokens)
        turn.state[STATE_KEY] = {"budget": budget_tokens, "cut": cut,
                                 "unsummarized_tokens": sum(m.token_count for m in messages)}
        turn.trace["memory"] = {
            "strategy": self.name,
            "summary_covers_until_seq": (summary or {}).get("covers_until_seq"),
            "memory_tokens": memory_tokens,
            "facts": len(facts),
            "unsummarized_messages": _said(messages),
            # Older than the summary's end yet not shown: a fold is late or failed.
            "not_shown": _said(messages) - _said(recent),
        }
        return memory + recent

    # --- Folding -------------------------------------------------------------------------------

    async def after_turn(self, turn: TurnContext, message) -> None:
        """Enqueue a fold (the ``fold_summary`` task) when the unsummarised messages no longer
        fit beside a full summary."""
        state = turn.state.get(STATE_KEY)
        if not state or turn.supplied_history is not None:
            return  # nothing to fold: the caller keeps the history, the log does not hold it
        budget = state["budget"]
        unsummarized = state["unsummarized_tokens"] + turn.user_message.token_count + message.token_count
        if self.sends_tool_calls(turn):  # the next turn sends this one's calls too
            unsummarized += sum(run.token_count for run in turn.tool_runs)
        if state["cut"] or unsummarized > budget - self.memory_cap(budget):
            # Off the event loop: on the immediate backend the fold (a model call) runs right
            # here; on any other backend this is one INSERT or queue push.
            await sync_to_async(self._enqueue_fold)(tasks, str(turn.conversation.pk), budget, message.seq)

    def _enqueue_fold(self, tasks, conversation_id: str, budget: int, until_seq: int) -> None:
        try:
            result = tasks.enqueue(tasks.fold_summary, self.profile.name, conversation_id, budget, until_seq)
        except Exception:
            # A fold is an optimisation: until one lands, the prompt stays within budget by
            # leaving the oldest turns out (the trace's memory.not_shown).
            logger.exception("Folding the summary of conversation %s failed", conversation_id)
            return
        if result.status == tasks.TaskResultStatus.FAILED:
            logger.error("Folding the summary of conversation %s failed: %s", conversation_id,
                         result.errors[-1].traceback if result.errors else "no traceback")

    def fold(self, conversation_id, budget_tokens: int, *, until_seq: int):
        """Fold the unsummarised messages up to ``until_seq``, except the newest turns worth
        ``keep_share`` of the budget, into the conversation's summary. Synchronous (it runs on
        the ``fold_summary`` task); returns the saved ``MemoryRecord`` or None."""

        record = (MemoryRecord.objects.filter(conversation_id=conversation_id, kind=MemoryRecord.Kind.SUMMARY)
                  .order_by("-covers_until_seq", "-updated_at").first())
        covers = (record.covers_until_seq or 0) if record else 0
        # The turns kept are sent with their tool calls (``load``): they count in what is kept.
        # The summary folds words only. A profile without tools has no calls to read.
        messages = _history(
            _visible(Message.objects.filter(conversation_id=conversation_id, seq__gt=covers, seq__lte=until_seq))
            .order_by("seq").values_list(*_FIELDS), with_tools=self.profile.offers_tools,
        )
        kept = newest_turns_within(split_turns(messages), max_tokens=int(budget_tokens * self.keep_share))
        first_kept = kept[0].seq if kept else until_seq + 1
        to_fold = [m for m in messages if m.seq < first_kept and not m.is_tool_exchange]
        if not to_fold:
            return None
        cap = self.memory_cap(budget_tokens)
        summary = record.content.strip() if record else ""
        for batch in self._batches(to_fold):
            summary = self.summarize(summary, batch, cap)
            if summary is None:
                return None
        folded_until = to_fold[-1].seq
        metadata = {"model": self.model.chat.model, "folded_messages": len(to_fold),
                    "updated_by": "summary memory"}
        if record is None:
            return MemoryRecord.objects.create(conversation_id=conversation_id, kind=MemoryRecord.Kind.SUMMARY,
                                               content=summary, covers_until_seq=folded_until, metadata=metadata)
        changed = MemoryRecord.objects.filter(pk=record.pk, updated_at=record.updated_at).update(
            content=summary, covers_until_seq=folded_until, metadata={**record.metadata, **metadata},
            updated_at=timezone.now(),
        )
        if not changed:
            logger.info("The summary of conversation %s changed while it was being folded; the new one is discarded",
                        conversation_id)
            return None
        record.refresh_from_db()
        return record

    def _batches(self, messages: list[HistoryMessage]) -> list[list[HistoryMessage]]:
        batches: list[list[HistoryMessage]] = [[]]
        tokens = 0
        for message in messages:
            if batches[-1] and tokens + message.token_count > self.max_fold_tokens:
                batches.append([])
                tokens = 0
            batches[-1].append(message)
            tokens += message.token_count
        return batches

    def summarize(self, previous: str, messages: list[HistoryMessage], cap_tokens: int) -> str | None:
        """The summary of ``previous`` and ``messages`` from the model, or None when the call
        failed or the reply is not a summary (empty, a refusal); logged either way."""
        max_chars = self.max_fold_tokens * 4
        transcript = "\n".join(
            f"{'User' if m.role == 'user' else 'Assistant'}: {m.content[:max_chars]}" for m in messages
        )
        fields = {"max_words": max(20, int(cap_tokens * 0.6)), "summary": previous or "(none yet)",
                  "messages": transcript}
        request = [{"role": "system", "content": self.model.instructions.format(**fields)},
                   {"role": "user", "content": self.model.prompt.format(**fields)}]
        try:
            response = self.model.chat.complete_sync(request, max_tokens=cap_tokens)
        except LLMError as exc:
            logger.warning("Summarising conversation messages %d-%d failed (%s); will retry after the next turn",
                           messages[0].seq, messages[-1].seq, exc.code)
            return None
        text = response.text.strip()
        if not text or is_refusal(text):
            logger.warning("The summarising model replied %r, which is not a summary; the summary is unchanged",
                           text[:200])
            return None
        return text


@hookimpl
def register_memory_strategies(register):
    register(SummaryMemory)


@hookimpl
async def on_turn_completed(turn, message):
    memory = turn.components.memory
    if isinstance(memory, SummaryMemory):
        await memory.after_turn(turn, message)
