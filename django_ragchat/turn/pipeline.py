"""The turn pipeline: one user message in, one saved assistant message out.

Read ``stream_turn`` top to bottom; it is the turn:

1. validate the text and save it (with an empty assistant message marked "streaming");
2. the advisors' ``around_turn``, wrapping everything below (``django_ragchat.turn.advisors``);
3. input guardrails;
4. memory: the history the model will see, within its share of the token budget;
5. query transformers, each seeing the history (rewrite a follow-up, compress, translate);
6. query expanders (the original query plus variants);
7. every (query, retriever) pair retrieved concurrently;
8. the joiner (dedupe, rank fusion), then the document post-processors (threshold, top-k);
9. the prompt augmenter (context within the rest of the budget; the no-context policy);
10. the LLM, whole or streamed, wrapped by the advisors' ``around_llm``/``around_llm_stream``,
    with streamed response augmenters on each piece and their tails after the last; while the
    model asks for tools (at most ``max_tool_steps`` rounds), their calls run
    (``turn.tools``, each wrapped by the advisors' ``around_tool``) and the model is asked
    again with their results;
11. response augmenters (citations), output guardrails (which may reprompt the model);
12. the assistant message saved with its sources and its trace.

Each stage is a function of the turn listed in ``STAGES`` and run by ``run_stage``, which
records its timing and fires ``on_stage_completed``, also when the stage ends the turn. Any
stage may end the turn early by returning an ``EndTurn`` (a refusal, a canned answer); the
trace's ``ended_by`` says which stage and component did (``"advisors"`` when an advisor
answered without calling on). A failure keeps the partial answer, marked "error"; a
cancellation keeps it marked "incomplete". The user's message is saved before anything can
fail.

The core is async. ``run_turn_sync`` is the facade for synchronous callers (views under
WSGI, management commands); it drives the same code.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import SyncToAsync, async_to_sync, sync_to_async
from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import ImproperlyConfigured

from django_ragchat.access import principals_of_user_id, reading_as
from django_ragchat.components import Component
from django_ragchat.conf import ragchat_settings
from django_ragchat.events import (
    Accepted,
    Completed,
    Delta,
    Failed,
    Replace,
    Retry,
    SourcesFound,
    StageChanged,
    TurnEvent,
)
from django_ragchat.exceptions import InvalidMessage, ProfileUnavailable, RagchatError, SettingsInvalid
from django_ragchat.models import Chunk, Conversation, Message, TurnTrace
from django_ragchat.plugins import await_me_maybe, get_registry, notify
from django_ragchat.profiles import Profile, get_profile
from django_ragchat.search.freshness import stamps_kept
from django_ragchat.search.readings import fetching_readings
from django_ragchat.stages.expanders import ASKER_ROWS, ASKER_ROWS_MARK
from django_ragchat.stages.retrievers import EmbeddingSpaceMismatch
from django_ragchat.text import is_blank
from django_ragchat.tokens import count_tokens, tokenizer_name
from django_ragchat.tools import Tool
from django_ragchat.turn import changes, persistence, shutdown, start_gate, stops
from django_ragchat.turn.advisors import ShortCircuit, run_llm_chain, run_stream_chain, run_turn_chain
from django_ragchat.turn.context import ProfileComponents, TurnContext, components_for
from django_ragchat.turn.results import WrongResult, checked, checked_list
from django_ragchat.turn.sync_bridge import background_loop
from django_ragchat.turn.tools import offer_tools, tool_round
from django_ragchat.types import (
    Answer,
    EndTurn,
    HistoryMessage,
    LLMResponse,
    Prompt,
    Query,
    Redaction,
    Reprompt,
    RetrievedChunk,
    SkipRetrieval,
    ToolCall,
    Usage,
)

logger = logging.getLogger(__name__)


#: The settings every turn reads on its way: the message's length, the per-user limits, the
#: answer's lease and heartbeat.
TURN_SETTINGS = ("MAX_MESSAGE_CHARS", "TURNS_PER_MINUTE", "MAX_CONCURRENT_STREAMS", "STREAM_HEARTBEAT_SECONDS",
                 "STREAM_LEASE_SECONDS")


def check_turn_settings() -> None:
    """``SettingsInvalid`` when a setting of ``TURN_SETTINGS`` has a value its kind refuses,
    the settings and their values in the log. A running server runs no system check: without
    this, TURNS_PER_MINUTE="thirty" failed every message with a TypeError inside the limits,
    and TURNS_PER_MINUTE=-1 refused every one as over the limit."""
    problems = ragchat_settings.problems(TURN_SETTINGS)
    if problems:
        logger.error("ragchat refused a message: %s (manage.py check lists every such setting, ragchat.E007).",
                     "; ".join(map(str, problems)))
        raise SettingsInvalid()


def validate_user_message(text: Any) -> str:
    """Return ``text`` if it can be stored and answered; raise ``InvalidMessage`` otherwise,
    or first ``SettingsInvalid`` when no message can be (``check_turn_settings``).

    Rejected: non-strings, text that shows nothing (whitespace, zero-width and other format
    characters only: ``text.is_blank``), more than ``MAX_MESSAGE_CHARS``
    characters, NUL bytes (PostgreSQL cannot store them) and lone surrogates (not encodable
    as UTF-8).
    """
    check_turn_settings()
    if not isinstance(text, str):
        raise InvalidMessage("invalid_type", "The message (content) is required and must be a string.")
    limit = ragchat_settings.MAX_MESSAGE_CHARS
    if len(text) > limit:
        raise InvalidMessage("too_long", f"The message has {len(text):,} characters; the limit is {limit:,}.")
    if is_blank(text):
        raise InvalidMessage("empty", "The message is empty.")
    if "\x00" in text:
        raise InvalidMessage("invalid_characters", "The message contains NUL characters.")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidMessage("invalid_characters", "The message contains invalid Unicode (lone surrogates).") from None
    return text


@dataclass
class TurnResult:
    """The outcome of ``run_turn``: the saved assistant message's payload and the trace."""

    conversation_id: str
    user_message_id: int
    message: dict[str, Any]
    trace: dict[str, Any]
    error: Failed | None = None

    @property
    def answer(self) -> str:
        return self.message["content"]

    @property
    def status(self) -> str:
        return self.message["status"]


# --- Stages -----------------------------------------------------------------------------------
#
# Each stage is ``async def stage(turn) -> EndTurn | None``; ``run_stage`` times it.


def _end(turn: TurnContext, stage: str, component: Any, ending: EndTurn) -> EndTurn:
    turn.trace["ended_by"] = {
        "stage": stage, "component": getattr(component, "name", str(component)),
        "kind": ending.kind, "reason": ending.reason,
    }
    return ending


class searching_for:  # lower case: used like a function, ``with searching_for(turn):``
    """Searches inside the block (and in the tasks it starts) read as the asker
    (``access.reading_as``), fetch the chunks' stored readings only for an answerer that
    reads them (``search.readings``), and read the corpus's stamp once in the turn
    (``search.freshness``). A class, not a generator's context manager: every stage enters it."""

    __slots__ = ("turn", "entered")

    def __init__(self, turn: TurnContext):
        self.turn = turn

    def __enter__(self) -> None:
        turn = self.turn
        reading = reading_as(turn.principals)
        fetching = fetching_readings(turn.components.reads_stored_readings)
        kept = stamps_kept(turn.state.setdefault("_corpus_stamps", {}))
        for manager in (reading, fetching, kept):  # each sets a context variable (ContextVar.set)
            manager.__enter__()
        self.entered = (kept, fetching, reading)

    def __exit__(self, *exc_info: Any) -> None:
        for manager in self.entered:  # the last entered first, as ``with a, b, c`` leaves them
            manager.__exit__(*exc_info)


def begin_stage(turn: TurnContext, name: str) -> float:
    """Note that stage ``name`` runs (``components_that_ran``, and a failure's ``failed_stage``);
    its start on ``time.perf_counter``."""
    turn.state.setdefault("_stages_run", []).append(name)
    turn.state["_stage_started"] = started = time.perf_counter()
    return started


def failed_stage(turn: TurnContext) -> str:
    """The stage a failed turn was in (begun, never timed), with its time until the failure in
    the trace's timings; "" when the turn failed between stages."""
    stages = turn.state.get("_stages_run") or []
    if not stages or stages[-1] in turn.trace["timings"]:
        return ""
    turn.trace["timings"][stages[-1]] = round((time.perf_counter() - turn.state["_stage_started"]) * 1000, 3)
    return stages[-1]


async def run_stage(turn: TurnContext, name: str, stage: Callable[[TurnContext], Awaitable[Any]]) -> Any:
    """Run one stage, record its duration in the trace and fire ``on_stage_completed`` (also
    when it ends the turn; not when it raises: the turn then fails). Its components search for
    the turn (``searching_for``)."""
    started = begin_stage(turn, name)
    with searching_for(turn):
        result = await stage(turn)
    elapsed = (time.perf_counter() - started) * 1000
    turn.trace["timings"][name] = round(elapsed, 3)
    await notify("on_stage_completed", turn=turn, stage=name, elapsed_ms=elapsed)
    return result


async def check_input(turn: TurnContext) -> EndTurn | None:
    """Input guardrails, in order, each checking the question the one before left: ``None``
    lets it through, an ``EndTurn`` (a ``Refusal``) ends the turn, a ``Redaction`` replaces it
    (as may a ``Refusal``'s ``redacted``): ``redact_question``."""
    for guardrail in turn.components.guardrails:
        result = checked(guardrail, "check_input", await await_me_maybe(guardrail.check_input(turn.question, turn)),
                         (EndTurn, Redaction, type(None)), "None, a Refusal or a Redaction")
        redacted = result.text if isinstance(result, Redaction) else getattr(result, "redacted", None)
        if redacted is not None:
            if not isinstance(redacted, str) or is_blank(redacted):
                raise WrongResult(guardrail, "check_input", result, "None, a Refusal or a Redaction whose text "
                                                                   "shows something")
            await redact_question(turn, guardrail, redacted, result.reason)
        if isinstance(result, EndTurn):
            return _end(turn, "input_guardrails", guardrail, result)
    if turn.supplied_history:
        await check_supplied_history(turn)
    return None


async def check_supplied_history(turn: TurnContext) -> None:
    """The input guardrails judge each user message the caller sent with the question
    (``supplied_history``: a stateless client sends the whole exchange again with every request,
    a message they refused earlier included) as they judged the question, each in a turn of its
    own that is never saved (no query). A refused one is left out with the replies to it, as
    memory leaves a refused turn of the log out; a redacted one goes on as they left it. The
    trace says how many were left out and which guardrails refused or redacted them
    (``supplied_guardrails``), never what the messages said."""
    kept: list[HistoryMessage] = []
    refused: list[dict[str, str]] = []
    redacted: list[dict[str, str]] = []
    left_out = 0
    replies_left_out = False  # the assistant's replies to a refused message
    for message in turn.supplied_history:
        if message.role != "user":
            left_out += replies_left_out
            if not replies_left_out:
                kept.append(message)
            continue
        alone = TurnContext(conversation=turn.conversation, profile=turn.profile, components=turn.components,
                            question=message.content, user=turn.user, principals=turn.principals,
                            streaming=turn.streaming, can_approve=turn.can_approve)
        ending = await check_input(alone)
        replies_left_out = ending is not None
        if replies_left_out:
            left_out += 1
            refused.append({"by": alone.trace["ended_by"]["component"], "reason": ending.reason})
            continue
        if alone.trace.get("redactions"):
            redacted += alone.trace["redactions"]
            message = dataclasses.replace(message, content=alone.question, token_count=count_tokens(alone.question))
        kept.append(message)
    if left_out or redacted:
        turn.trace["supplied_guardrails"] = {"sent": len(turn.supplied_history), "left_out": left_out,
                                             "refused": refused, "redacted": redacted}
    turn.supplied_history = kept


async def redact_question(turn: TurnContext, guardrail: Any, text: str, reason: str) -> None:
    """An input guardrail's redaction: ``text`` is the question from now on, for the guardrails
    after it, the search and the model, and in place of the text as typed wherever the turn
    keeps it: the trace (``question``, ``queries``; ``redactions`` says who and why, never the
    text taken out) and, at once, the message's row and a title made from it
    (``persistence.redact_user_message``). Advisors' ``around_turn`` and ``on_turn_started``,
    which run before input guardrails, saw the text as typed."""
    typed, turn.question = turn.question, text
    turn.trace["question"] = text
    turn.trace.setdefault("queries", {}).update(original=text, final=text)
    turn.trace.setdefault("redactions", []).append({"by": guardrail.name, "reason": reason})
    if turn.user_message is not None:  # None: a turn made by hand, never saved (a plugin's unit test)
        await sync_to_async(persistence.redact_user_message)(turn, typed, guardrail.name)


async def select_history(turn: TurnContext) -> None:
    profile = turn.profile
    budget = max(0, profile.prompt_budget - count_tokens(profile.system_prompt)
                 - count_tokens(turn.question) - 64)  # 64: template and message framing
    history_budget = int(budget * profile.history_share)
    memory = turn.components.memory
    turn.history = checked_list(memory, "select", await await_me_maybe(memory.select(turn, history_budget)),
                                HistoryMessage, "a list of HistoryMessage")
    history_tokens = sum(m.token_count for m in turn.history)
    # The context gets what the history did not use: the history's share is reserved for it,
    # never the other way round.
    turn.context_budget = budget - history_tokens
    turn.trace["prompt"].update(budget=budget, history_budget=history_budget,
                                history_tokens=history_tokens, context_budget=turn.context_budget)
    turn.trace["history"] = {"messages": len(turn.history),
                             "seqs": [m.seq for m in turn.history[:1] + turn.history[-1:]]}
    if turn.supplied_history is not None:
        # Not in the log: the trace is the only record of what the model was shown. Bounded
        # by the history budget, so a long history sent with every request is not stored again.
        turn.trace["history"]["supplied"] = len(turn.supplied_history)
        turn.trace["supplied_history"] = [{"role": m.role, "content": m.content} for m in turn.history]


async def transform_query(turn: TurnContext) -> EndTurn | None:
    # The words of the conversation; its tool steps are for the model.
    query = Query(text=turn.question, original=turn.question,
                  history=tuple(m for m in turn.history if not m.is_tool_exchange))
    steps = turn.trace["queries"]["transformed"]
    for transformer in turn.components.query_transformers:
        result = checked(transformer, "transform", await await_me_maybe(transformer.transform(query, turn)),
                         (Query, SkipRetrieval, EndTurn), "a Query, SkipRetrieval or an EndTurn")
        if isinstance(result, EndTurn):
            return _end(turn, "query_transformers", transformer, result)
        if isinstance(result, SkipRetrieval):
            turn.retrieval_skipped = True
            steps.append({"by": transformer.name, "skip_retrieval": result.reason})
            break
        note = result.metadata.get("transform_note", "")
        steps.append({"by": transformer.name, "text": result.text, "note": note})
        query = result.replace(metadata={k: v for k, v in result.metadata.items() if k != "transform_note"})
    turn.query = query
    turn.trace["queries"]["final"] = query.text
    return None


async def expand_query(turn: TurnContext) -> EndTurn | None:
    # Keyed by text and whose rows it reads: the asker's-rows variant has the question's text.
    queries = {(turn.query.text, False): turn.query}
    for expander in turn.components.query_expanders:
        result = await await_me_maybe(expander.expand(turn.query, turn))
        if isinstance(result, EndTurn):
            return _end(turn, "query_expanders", expander, result)
        if isinstance(result, SkipRetrieval):
            turn.retrieval_skipped = True
            break
        for query in checked_list(expander, "expand", result, Query, "a list of Query, SkipRetrieval or an EndTurn"):
            queries.setdefault((query.text, bool(query.metadata.get(ASKER_ROWS))), query)
    turn.queries = list(queries.values())
    turn.trace["queries"]["expanded"] = [_traced(q) for q in turn.queries]
    return None


def _traced(query: Query) -> str:
    """A query as the trace names it: the asker's-rows variant says so."""
    return f"{query.text} {ASKER_ROWS_MARK}" if query.metadata.get(ASKER_ROWS) else query.text


async def retrieve(turn: TurnContext) -> None:
    retrievers = turn.components.retrievers
    if any(r.uses_embeddings for r in retrievers):
        await turn.embed([q.text for q in turn.queries])  # one batch for every query
    limit = asyncio.Semaphore(max(1, turn.profile.retrieval_concurrency))
    k = turn.profile.retrieval_k

    async def one(query: Query, retriever) -> tuple[Query, str, list[RetrievedChunk], float]:
        async with limit:
            t0 = time.perf_counter()
            hits = checked_list(retriever, "retrieve", await await_me_maybe(retriever.retrieve(query, turn, k)),
                                RetrievedChunk, "a list of RetrievedChunk")
            return query, retriever.name, hits, (time.perf_counter() - t0) * 1000

    results = await asyncio.gather(*(one(q, r) for q in turn.queries for r in retrievers))
    readable = await _readable_ids(turn, [h for _, _, hits, _ in results for h in hits])
    if readable is not None:
        kept = [(q, name, [h for h in hits if h.chunk_id in readable], ms) for q, name, hits, ms in results]
        _warn_dropped(turn, results, kept)
        results = kept
    turn.trace["retrieval"] = [
        {"query": _traced(q), "retriever": name, "ms": round(ms, 3),
         "hits": [{"chunk_id": h.chunk_id, "score": round(h.score, 6)} for h in hits]}
        for q, name, hits, ms in results
    ]
    turn.state["_retrieved"] = [(q, name, hits) for q, name, hits, _ in results]


def _warn_dropped(turn: TurnContext, found: list, kept: list) -> None:
    """A warning per retriever whose hits were dropped: a plugin retriever returning chunks that
    are no stored rows (an in-memory list) saw "0 hits" and a warning naming no one."""
    dropped: dict[str, int] = {}
    for (_, name, hits, _), (_, _, left, _) in zip(found, kept, strict=True):
        if len(left) < len(hits):
            dropped[name] = dropped.get(name, 0) + len(hits) - len(left)
    for name, count in dropped.items():
        turn.warn(f"retriever {name!r}: {count} chunk(s) the asker may not read, or that are no stored chunk "
                  f"(a hit's chunk_id must be a Chunk's id), were dropped")


async def _readable_ids(turn: TurnContext, chunks: list[RetrievedChunk]) -> set[int] | None:
    """The ids among ``chunks`` the asker may read, checked in one query when some were not
    found by a search that read as the asker (``RetrievedChunk.read_as``: a plugin that made
    them another way); ``None`` when every one was. What the asker may not read never reaches
    the trace, the prompt or the sources, whichever component produced it (the callers say
    how many were dropped)."""
    unchecked = {c.chunk_id for c in chunks if c.read_as is None or not turn.principals.covers(c.read_as)}
    if not unchecked:
        return None
    readable = set(await sync_to_async(_visible)(unchecked, turn.principals))
    return readable | {c.chunk_id for c in chunks if c.chunk_id not in unchecked}


def _visible(ids: set[int], principals) -> list[int]:
    return list(Chunk.objects.filter(pk__in=ids, access__visible_to=principals).values_list("pk", flat=True))


async def join(turn: TurnContext) -> None:
    joiner = turn.components.joiner
    joined = await await_me_maybe(joiner.join(turn.state.pop("_retrieved", []), turn))
    turn.documents = checked_list(joiner, "join", joined, RetrievedChunk, "a list of RetrievedChunk")


async def postprocess(turn: TurnContext) -> None:
    """The post-processors in turn; what each changed goes to ``trace["postprocess"]``
    (``changes.documents_step``), naming only chunks the asker may read."""
    documents, seen = turn.documents, list(turn.documents)
    steps = turn.trace.setdefault("postprocess", [])
    for processor in turn.components.document_postprocessors:
        before = documents
        documents = checked_list(processor, "process", await await_me_maybe(
            processor.process(turn.query, list(documents), turn)), RetrievedChunk, "a list of RetrievedChunk")
        steps.append(changes.documents_step(processor.name, before, documents))
        seen += documents
    # A joiner or post-processor may add chunks too; one check covers those the trace names.
    readable = await _readable_ids(turn, seen)
    changes.keep_readable(steps, readable)
    if readable is not None:
        dropped = len({d.chunk_id for d in documents} - readable)
        if dropped:
            turn.warn(f"{dropped} chunk(s) the asker may not read (or that do not exist) were dropped")
        documents = [d for d in documents if d.chunk_id in readable]
    turn.documents = documents


async def augment_prompt(turn: TurnContext) -> EndTurn | None:
    augmenter = turn.components.prompt_augmenter
    result = await await_me_maybe(
        augmenter.augment(turn, turn.query, turn.history, turn.documents, turn.context_budget)
    )
    if isinstance(checked(augmenter, "augment", result, (Prompt, EndTurn), "a Prompt or an EndTurn"), EndTurn):
        return _end(turn, "prompt", augmenter, result)
    turn.prompt = result
    turn.trace["prompt"]["tokens"] = result.token_count
    _trace_documents(turn, result.documents)
    return None


def _trace_documents(turn: TurnContext, documents) -> None:
    turn.trace["documents"] = [
        {"index": i, "chunk_id": d.chunk_id, "score": round(d.score, 6), "source": d.source,
         "raw_scores": {k: round(v, 6) for k, v in d.raw_scores.items()}}
        for i, d in enumerate(documents, start=1)
    ]


# The stages before the model, in order; those in RETRIEVAL_STAGES are skipped when a
# transformer returned SkipRetrieval.
STAGES: tuple[tuple[str, Callable[[TurnContext], Awaitable[EndTurn | None]]], ...] = (
    ("input_guardrails", check_input),
    ("memory", select_history),
    ("query_transformers", transform_query),
    ("query_expanders", expand_query),
    ("retrieval", retrieve),
    ("join", join),
    ("postprocess", postprocess),
    ("prompt", augment_prompt),
)
RETRIEVAL_STAGES = frozenset({"query_expanders", "retrieval", "join", "postprocess"})
# Skipped when the model searches for itself ("retrieval": "tool"): it writes the queries.
SEARCH_TOOL_SKIPS = RETRIEVAL_STAGES | {"query_transformers"}


# --- Retrieval as a tool ("retrieval": "tool") -----------------------------------------------


async def search_documents(turn: TurnContext, query: str) -> str:
    """Search the site's documents. Returns numbered passages; cite the ones you use as [n].

    Args:
        query: What to look for, as a standalone search query (names rather than pronouns).
    """
    lock = turn.state.setdefault("_search_lock", asyncio.Lock())
    async with lock:  # parallel searches share the turn's documents and numbering
        turn.query = Query(text=query, original=turn.question, history=tuple(turn.history))
        earlier = turn.trace["retrieval"]
        if await expand_query(turn) is not None:  # an expander that ends turns cannot end this one
            turn.queries = [turn.query]
        await retrieve(turn)
        turn.trace["retrieval"] = earlier + turn.trace["retrieval"]
        await join(turn)
        steps = turn.trace.setdefault("postprocess", [])
        done = len(steps)
        await postprocess(turn)
        for step in steps[done:]:  # each search's own post-processing
            step["query"] = query
        return _new_passages(turn)


def _new_passages(turn: TurnContext) -> str:
    """The documents found that the model has not seen, numbered after those it has, within
    what is left of the context budget; added to the prompt's documents (citations resolve
    against them)."""
    given = turn.prompt.documents
    seen = {d.chunk_id for d in given}
    augmenter = turn.components.prompt_augmenter
    used = turn.state.get("_search_tokens", 0)
    kept, passages = [], []
    for chunk in turn.documents:
        if chunk.chunk_id in seen:
            continue
        index = len(given) + len(kept) + 1
        passage = augmenter.passage(index, chunk) if hasattr(augmenter, "passage") else f"[{index}] {chunk.text}"
        tokens = count_tokens(passage) + 2
        if used + tokens > turn.context_budget:
            continue
        kept.append(chunk)
        passages.append(passage)
        used += tokens
    turn.state["_search_tokens"] = used
    turn.prompt = dataclasses.replace(turn.prompt, documents=(*given, *kept))
    _trace_documents(turn, turn.prompt.documents)
    return "\n\n".join(passages) if passages else "No other passage was found for this query."


# The context budget bounds what it returns, not max_result_chars.
SEARCH_TOOL = Tool(search_documents, label="Searching the documents for “{query}”…", max_result_chars=10**7)


def searches_with_a_tool(turn: TurnContext) -> bool:
    """Whether the model searches for itself: ``"retrieval": "tool"`` and a model that calls
    tools (with one that calls none, such as the extractive answerer, retrieval runs as usual)."""
    return turn.profile.retrieval == "tool" and turn.components.llm.calls_tools


async def offer(turn: TurnContext) -> None:
    """The tools stage: the tools the user may use go on the prompt."""
    tools = await offer_tools(turn, (SEARCH_TOOL,) if searches_with_a_tool(turn) else ())
    turn.prompt = dataclasses.replace(turn.prompt, tools=tuple(t.spec() for t in tools.values()))


# --- The model -------------------------------------------------------------------------------


def _record_llm(turn: TurnContext, model: str, usage: Usage | None, add: bool = False) -> None:
    turn.model = model or turn.model
    if add and usage and turn.usage:  # another step of a tool loop: the answer costs all of them
        usage = Usage(turn.usage.prompt_tokens + usage.prompt_tokens,
                      turn.usage.completion_tokens + usage.completion_tokens)
    turn.usage = usage or turn.usage
    turn.trace["model"] = turn.model
    if turn.usage:
        turn.trace["usage"] = {"prompt_tokens": turn.usage.prompt_tokens,
                               "completion_tokens": turn.usage.completion_tokens}


async def complete(turn: TurnContext, prompt: Prompt, *, add: bool = False) -> LLMResponse:
    """A whole answer from the model, through the advisors' ``around_llm``."""
    llm = turn.components.llm
    if turn.components.llm_advisors:
        response = await run_llm_chain(turn.components.llm_advisors, prompt, turn,
                                       lambda p: llm.complete(p, turn))
    else:
        response = await llm.complete(prompt, turn)
    _record_llm(turn, response.model, response.usage, add)
    return response


@dataclass
class _Answering:
    """The answer being written: its pieces so far (saved if the turn stops) and the result."""

    streaming: bool
    parts: list[str] = field(default_factory=list)
    answer: Answer | None = None
    started: float = field(default_factory=time.perf_counter)
    # Pieces the client has been given (advisors may run ahead of it by a few events).
    delivered: int = 0
    # The whole answer was saved, though the turn was cancelled meanwhile (``_save_whole``).
    saved_whole: bool = False

    def delta(self, text: str) -> Delta:
        self.parts.append(text)
        return Delta(text=text, index=len(self.parts) - 1)

    def sent(self, event: TurnEvent) -> None:
        if isinstance(event, Delta):
            self.delivered = event.index + 1
        elif isinstance(event, Retry):
            self.delivered = 0

    def partial(self) -> str:
        """The answer so far, as the client saw it (what a stopped or failed turn saves)."""
        return "".join(self.parts[:self.delivered] if self.streaming else self.parts)

    def settle(self) -> TurnEvent | None:
        """On a streamed turn, the event that makes what the client assembled the final answer:
        the whole answer as one ``delta`` when nothing was streamed (a turn ended early, an
        advisor that answered itself), a ``replace`` when the streamed text differs from it
        (changed after the model: an advisor, an output guardrail, an augmenter's rebuild)."""
        if not self.streaming or self.answer is None:
            return None
        final = self.answer.text
        if self.delivered == 0 and not self.parts:
            return self.delta(final) if final else None
        if self.partial() == final:
            return None
        self.parts[:] = [final]
        self.delivered = 1
        return Replace(text=final)


async def _stream(turn: TurnContext, run: _Answering, prompt: Prompt, calls: list[ToolCall], *,
                  add: bool = False) -> AsyncIterator[TurnEvent]:
    """One streamed model call (through the advisors' ``around_llm_stream``), each piece
    through the response augmenters' ``on_delta``; the tool calls it asks for go to ``calls``."""
    augmenters = turn.components.response_augmenters
    tallies = changes.stream_tallies(turn.state)  # what each on_delta changed
    opened: list = []
    llm = turn.components.llm
    if turn.components.stream_advisors:
        pieces = run_stream_chain(turn.components.stream_advisors, prompt, turn,
                                  lambda p: llm.stream(p, turn), opened)
    else:
        pieces = llm.stream(prompt, turn)
        opened.append(pieces)
    try:
        async for piece in pieces:
            _record_llm(turn, piece.model, piece.usage, add)
            calls.extend(piece.tool_calls)
            chunk = piece.text
            for augmenter in augmenters:
                sent = checked(augmenter, "on_delta", await await_me_maybe(augmenter.on_delta(chunk, turn)),
                               (str,), "a str")
                tallies[augmenter.name].add(chunk, sent)
                chunk = sent
            if chunk:
                yield run.delta(chunk)
    finally:
        # Outermost first: an advisor's generator closes before the stream it reads from, and
        # the model's HTTP stream is closed even if an advisor stopped reading it early.
        for stream in opened:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()


async def _tails(turn: TurnContext, run: _Answering) -> AsyncIterator[TurnEvent]:
    """After the model's last piece: each response augmenter's tail, passed through the
    augmenters after it, streams like the model's text."""
    augmenters = turn.components.response_augmenters
    tallies = changes.stream_tallies(turn.state)
    for position, augmenter in enumerate(augmenters):
        raw = chunk = checked(augmenter, "finish", await await_me_maybe(augmenter.finish(turn)),
                              (str, type(None)), "a str or None") or ""
        tallies[augmenter.name].tail += len(raw)
        for later in augmenters[position + 1:]:
            if chunk:
                sent = checked(later, "on_delta", await await_me_maybe(later.on_delta(chunk, turn)), (str,), "a str")
                tallies[later.name].add(chunk, sent)
                chunk = sent
        if chunk:
            turn.streamed_tails[augmenter.name] = (raw, chunk)  # on_complete keeps it once
            yield run.delta(chunk)


async def augment_response(turn: TurnContext, text: str, *, streamed: bool) -> Answer:
    """The response augmenters in turn; what each changed goes to ``trace["response_augmenters"]``
    (``changes.answer_step``), with its note taken out of the answer's metadata."""
    answer = Answer(text=text)
    steps = []
    tallies = changes.stream_tallies(turn.state)
    for augmenter in turn.components.response_augmenters:
        method = augmenter.on_complete if streamed else augmenter.augment
        result = checked(augmenter, method.__name__, await await_me_maybe(method(answer, turn)), (Answer,), "an Answer")
        result, note = changes.take_note(result)
        step = changes.answer_step(augmenter.name, answer, result, note)
        steps.append(changes.with_stream(step, tallies[augmenter.name]) if streamed else step)
        answer = result
    turn.trace["response_augmenters"] = steps  # a reprompted answer's replace the first's
    return answer


#: What an output guardrail's ``check_output`` (and ``exhausted``) may return.
OUTPUT_CHECKS = (type(None), Answer, Reprompt, EndTurn)


async def check_output(turn: TurnContext, answer: Answer, run: _Answering) -> AsyncIterator[TurnEvent]:
    """Output guardrails: pass, fail (a refusal is the answer) or reprompt (the model answers
    again, whole, with the guardrail's feedback; a ``retry`` event on a streamed turn).
    Sets ``run.answer``."""
    reprompts: dict[int, int] = {}
    attempts = 0
    restart = True
    while restart:
        restart = False
        for position, guardrail in enumerate(turn.components.guardrails):
            result = checked(guardrail, "check_output", await await_me_maybe(guardrail.check_output(answer, turn)),
                             OUTPUT_CHECKS, "None, an Answer, a Reprompt or an EndTurn")
            if isinstance(result, Reprompt):
                used = reprompts.get(position, 0)
                if used >= guardrail.max_reprompts:
                    turn.trace.setdefault("reprompts", []).append(
                        {"guardrail": guardrail.name, "exhausted": True, "reason": result.reason})
                    result = await await_me_maybe(guardrail.exhausted(answer, result, turn))
                    result = checked(guardrail, "exhausted", result, OUTPUT_CHECKS, "None, an Answer or an EndTurn")
                else:
                    reprompts[position] = used + 1
                    attempts += 1
                    turn.trace.setdefault("reprompts", []).append(
                        {"guardrail": guardrail.name, "attempt": attempts, "reason": result.reason,
                         "feedback": result.feedback, "rejected": answer.text[:2000]})
                    if run.streaming:
                        yield Retry(attempt=attempts, guardrail=guardrail.name)
                    prompt = dataclasses.replace(turn.prompt, messages=(
                        *turn.prompt.messages,
                        {"role": "assistant", "content": answer.text},
                        {"role": "user", "content": result.feedback},
                    ), tool_choice="none" if turn.prompt.tools else None)
                    response = await complete(turn, prompt)
                    answer = await augment_response(turn, response.text, streamed=False)
                    run.parts[:] = [answer.text]  # what a cancellation would save
                    restart = True
                    break
            if isinstance(result, EndTurn):
                _end(turn, "output_guardrails", guardrail, result)
                run.answer = Answer(text=result.answer)
                return
            if isinstance(result, Answer):
                answer = result
    if run.streaming and attempts:
        # The answer that passed after a retry, streamed as one piece from index 0.
        run.parts.clear()
        if answer.text:
            yield run.delta(answer.text)
    run.answer = answer


async def answer_stages(turn: TurnContext, run: _Answering) -> AsyncIterator[TurnEvent]:
    """Every stage after the user's message is saved, as events; sets ``run.answer``."""
    ending = None
    searching = searches_with_a_tool(turn)
    for name, stage in STAGES:
        if searching and name in SEARCH_TOOL_SKIPS:
            turn.retrieval_skipped = True
            turn.query = turn.query or Query(text=turn.question, original=turn.question, history=tuple(turn.history))
            continue
        if turn.retrieval_skipped and name in RETRIEVAL_STAGES:
            continue
        if name == "retrieval":
            yield StageChanged(stage="retrieving")
        ending = await run_stage(turn, name, stage)
        if ending is not None:
            run.answer = Answer(text=ending.answer)
            return
    if turn.profile.offers_tools and turn.components.llm.calls_tools:
        await run_stage(turn, "tools", offer)

    yield SourcesFound(sources=[d.as_source(i) for i, d in enumerate(turn.prompt.documents, start=1)])
    yield StageChanged(stage="generating")
    started = begin_stage(turn, "llm")
    async for event in generate(turn, run):
        yield event
    if run.streaming:
        async for event in _tails(turn, run):
            yield event
    elapsed = (time.perf_counter() - started) * 1000
    # The stage's whole time, its tool calls and the user's wait for approving them included
    # (that wait is trace["approval_wait_ms"]; the admin marks it): the timings add up to the total.
    turn.trace["timings"]["llm"] = round(elapsed, 3)
    await notify("on_stage_completed", turn=turn, stage="llm", elapsed_ms=elapsed)

    text = "".join(run.parts)
    answer = await run_stage(turn, "response_augmenters",
                             lambda t: augment_response(t, text, streamed=run.streaming))
    started = begin_stage(turn, "output_guardrails")
    async for event in check_output(turn, answer, run):
        yield event
    elapsed = (time.perf_counter() - started) * 1000
    turn.trace["timings"]["output_guardrails"] = round(elapsed, 3)
    await notify("on_stage_completed", turn=turn, stage="output_guardrails", elapsed_ms=elapsed)


async def generate(turn: TurnContext, run: _Answering) -> AsyncIterator[TurnEvent]:
    """The model's answer. While it asks for tools, the calls run (``tool_round``) and it is
    asked again with their results, at most ``max_tool_steps`` times; the last time it is
    asked to answer without them (``tool_choice`` ``"none"``). Its text from every step is the
    answer."""
    start_gate.model_called()  # the work before the model is done: the next turn may start
    step = 0
    if turn.tools:
        turn.trace["tool_steps"] = 0
    while True:
        prompt = turn.prompt
        final = bool(prompt.tools) and step >= turn.profile.max_tool_steps
        if final:
            prompt = dataclasses.replace(prompt, tool_choice="none")
            turn.trace["tool_step_limit_reached"] = step > 0
        first_part = len(run.parts)
        calls: list[ToolCall] = []
        if run.streaming:
            async for event in _stream(turn, run, prompt, calls, add=step > 0):
                yield event
        else:
            response = await complete(turn, prompt, add=step > 0)
            run.parts.append(response.text)
            calls = list(response.tool_calls)
        if not calls:
            break
        if final or not prompt.tools:
            why = "after its last step (max_tool_steps)" if final else "that it was not offered"
            turn.warn(f"the model asked for tools {why} ({', '.join(c.name for c in calls)}): not run")
            break
        step += 1
        turn.trace["tool_steps"] = step
        documents = len(turn.prompt.documents)
        async for event in tool_round(turn, tuple(calls), step):
            yield event
        _add_results(turn, "".join(run.parts[first_part:]), calls)
        if len(turn.prompt.documents) != documents:  # the model searched: what it may cite now
            yield SourcesFound(sources=[d.as_source(i) for i, d in enumerate(turn.prompt.documents, start=1)])
        yield StageChanged(stage="generating")


def _add_results(turn: TurnContext, text: str, calls: list[ToolCall]) -> None:
    """The model's calls and their results, appended to the prompt for its next step."""
    runs = turn.tool_runs[-len(calls):]
    assistant = {"role": "assistant", "content": text or None, "tool_calls": [c.as_openai() for c in calls]}
    tokens = count_tokens(text) + sum(r.token_count for r in runs)
    turn.prompt = dataclasses.replace(
        turn.prompt, messages=(*turn.prompt.messages, assistant, *(r.result.as_message() for r in runs)),
        token_count=turn.prompt.token_count + tokens)
    turn.trace["prompt"]["tokens"] = turn.prompt.token_count
    if turn.prompt.token_count > turn.profile.prompt_budget and not turn.state.get("_tools_over_budget"):
        turn.state["_tools_over_budget"] = True
        turn.warn(f"with the tool results the prompt has {turn.prompt.token_count} tokens, more than the "
                  f"profile's budget of {turn.profile.prompt_budget}")


async def _advised(turn: TurnContext, run: _Answering) -> AsyncIterator[TurnEvent]:
    """``answer_stages`` wrapped by the advisors' ``around_turn``.

    The advisors await an answer while the stages produce events, so the chain runs in a task
    of its own that hands the events over through a small queue (which also keeps the
    stream's back-pressure). Closing this iterator cancels the task.
    """
    queue: asyncio.Queue = asyncio.Queue(maxsize=8)

    async def innermost() -> Answer:
        async with contextlib.aclosing(answer_stages(turn, run)) as events:
            async for event in events:
                await queue.put(event)
        return run.answer

    short = ShortCircuit()
    with searching_for(turn):  # the task copies the context: advisors search for the turn too
        task = asyncio.ensure_future(run_turn_chain(turn.components.turn_advisors, turn, innermost, short))
    getter = None
    try:
        while True:
            getter = asyncio.ensure_future(queue.get())
            await asyncio.wait((getter, task), return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                yield getter.result()
                continue
            getter.cancel()
            while not queue.empty():
                yield queue.get_nowait()
            run.answer = task.result()
            break
    finally:
        if getter is not None and not getter.done():
            getter.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if short.advisor is not None:
        ending = short.ending or EndTurn(run.answer.text, kind="advisor")
        _end(turn, "advisors", short.advisor, ending)


def describe_error(exc: BaseException) -> tuple[str, str, float | None]:
    """(code, message safe to show, retry-after seconds) for an exception that ended a turn."""
    if isinstance(exc, RagchatError):
        return exc.code, exc.message, exc.retry_after
    if isinstance(exc, EmbeddingSpaceMismatch):
        return "embedding_space_mismatch", str(exc), None
    return "internal_error", "The assistant failed to answer; the error has been logged.", None


# --- The turn ---------------------------------------------------------------------------------


def _components_trace(components: ProfileComponents) -> list[dict[str, str]]:
    """Which component of which plugin runs at each stage: the trace shows what a turn ran.
    Read from the registry once per profile's components (they are built once per process)."""
    if components.trace_rows is None:
        registry = get_registry()
        rows = []
        for component in components.each():
            try:
                plugin = registry.get(component.kind, component.name).plugin
            except Exception:  # a component built outside the registry (tests, advisors)
                plugin = ""
            rows.append({"stage": component.kind, "name": component.name, "plugin": plugin})
        components.trace_rows = rows
    return [dict(row) for row in components.trace_rows]  # the turn's own: a plugin may edit its trace


def _new_trace(turn: TurnContext) -> dict[str, Any]:
    return {
        "profile": turn.profile.name,
        "components": _components_trace(turn.components),
        "question": turn.question,
        "queries": {"original": turn.question, "transformed": [], "expanded": [], "final": turn.question},
        "retrieval": [],
        "documents": [],
        "prompt": {},
        "timings": {},
        "model": "",
        "usage": None,
        "ended_by": None,
        "tokenizer": tokenizer_name(),
    }


async def stream_turn(conversation: Conversation, text: Any, *, stream: bool | None = None, client_id: str = "",
                      history: list[HistoryMessage] | None = None, origin: dict[str, Any] | None = None,
                      user: Any = None, can_approve: bool = True) -> AsyncIterator[TurnEvent]:
    """Run one turn, yielding its events (see ``django_ragchat.events``).

    Raises ``InvalidMessage``, ``SettingsInvalid``, ``TurnInProgress``, ``ProfileUnavailable`` (nothing
    saved) or ``Conversation.DoesNotExist`` before the first event; after the ``ack`` event every failure
    becomes an ``error`` event with the partial answer saved. Closing the iterator early (the client
    cancelled or went away) saves the partial answer as "incomplete", and so does a stop asked for from
    anywhere (``stops.request_stop``), which ends with an ``error`` ``cancelled``. ``stream=False`` asks
    the model for a whole answer (no ``delta`` events). ``client_id`` is the sender's idempotency key: a
    resend raises ``persistence.DuplicateMessage`` (nothing saved). ``history``: the earlier messages as
    the caller sent them, which memory reads instead of the conversation's log
    (``TurnContext.supplied_history``; a stateless client's request); they are not saved, the trace keeps
    those the model was shown. ``origin``: where the message came from, as the transport tells it (e.g.
    the API key's name), kept in the trace. ``can_approve=False``: the client cannot ask the user to
    approve a tool call (``TurnContext.can_approve``). While the answer is written a
    ``persistence.Heartbeat`` renews its lease and saves the partial text (docs/architecture.md, "Crash
    safety"). ``user`` is the asking user (the transports pass the sender): tools run as them; ``None``
    means the conversation's owner (an ``AnonymousUser`` for an anonymous conversation).
    """
    turn, run = await _begin(conversation, text, stream, client_id, history, user, can_approve)
    if origin:
        turn.trace["origin"] = dict(origin)
    finished = False
    heartbeat = persistence.Heartbeat(turn.assistant_message, run.partial).start()
    stoppable = stops.Stoppable(conversation.pk)
    try:
        with stoppable:
            # Inside the try: a client that goes away right after the ack still gets its (empty)
            # answer saved as "incomplete" instead of leaving the conversation blocked.
            yield Accepted(conversation_id=str(conversation.pk), user_message_id=turn.user_message.pk,
                           user_seq=turn.user_message.seq, assistant_message_id=turn.assistant_message.pk)
            await notify("on_turn_started", turn=turn)
            stages = _advised(turn, run) if turn.components.turn_advisors else answer_stages(turn, run)
            async with contextlib.aclosing(stages):
                async for event in stages:
                    run.sent(event)
                    yield event
        final = run.settle()
        if final is not None:
            run.sent(final)
            yield final
        payload = await _save_whole(turn, run)
        finished = True
        await notify("on_turn_completed", turn=turn, message=turn.assistant_message)
        yield Completed(message=payload)
    except (asyncio.CancelledError, GeneratorExit) as exc:
        if finished or run.saved_whole:
            raise
        stopped = await _stopped(turn, run, stoppable, exc)
        if stopped is None:
            raise
        yield stopped
    except Exception as exc:
        if finished:
            raise
        yield await _failed(turn, run, exc)
    finally:
        await heartbeat.stop()


async def _save_whole(turn: TurnContext, run: _Answering) -> dict[str, Any]:
    """``_save`` of the whole answer ("complete"). A cancellation meanwhile (the client left, the
    server is stopping) waits the save out and then goes up, ``run.saved_whole`` set: saving
    the answer again as incomplete would write its sources twice (an IntegrityError in an
    outside probe, the answer "complete" and its event "cancelled")."""
    saving = asyncio.ensure_future(_save(turn, run, run.answer, Message.Status.COMPLETE))
    try:
        return await asyncio.shield(saving)
    except asyncio.CancelledError:
        while not saving.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(saving)
        run.saved_whole = saving.exception() is None  # a failed save is a failure to report
        raise


async def _stopped(turn: TurnContext, run: _Answering, stoppable: stops.Stoppable,
                   exc: BaseException) -> Failed | None:
    """Save the partial answer of a turn stopped before its end ("incomplete"). Stopped from
    elsewhere (``stops.request_stop``), the ``error`` event that says so: the turn's own
    clients are told as of a turn that ended, not of a task they cancelled. ``None`` for a
    cancellation or a close of their own, which goes on."""
    turn.trace["cancelled"] = True
    failed_stage(turn)  # the stage it was stopped in keeps its time until the stop: the timings add up
    # Shielded: the partial answer must be saved even though this task is cancelled.
    payload = await asyncio.shield(_save(turn, run, Answer(text=run.partial()), Message.Status.INCOMPLETE,
                                         shutdown.stopped_error()))
    if not (stoppable.requested and isinstance(exc, asyncio.CancelledError)):
        return None
    asyncio.current_task().uncancel()
    error = shutdown.stopped_error()
    return Failed(code=error["code"], message=error["message"], assistant_message=payload)


def _owner(conversation: Conversation) -> Any:
    return conversation.owner


async def _asker(conversation: Conversation, user: Any) -> Any:
    """Who asks: the sender the transport names, else the conversation's owner (one query when
    it is not loaded yet), else an anonymous user."""
    if user is not None:
        return user
    if conversation.owner_id is None:
        return AnonymousUser()
    return await sync_to_async(_owner)(conversation)


def built_profile(name: str | None, refused: str) -> tuple[Profile, ProfileComponents]:
    """The profile ``name`` (the default for ``None``) and its components, or ``ProfileUnavailable``
    when it cannot be built (a component no plugin registers, values ``InvalidProfile`` refuses):
    a running server serves no system check, so the cause goes to the log, after ``refused``
    ("cannot answer in conversation ..."). The turn asks before saving anything, and so does
    ``POST conversations/`` before creating one."""
    try:
        profile = get_profile(name)
        return profile, components_for(profile)
    except ImproperlyConfigured as exc:
        logger.error("ragchat %s: its profile %r cannot be built: %s", refused, name, exc)
        raise ProfileUnavailable() from exc


async def _begin(conversation: Conversation, text: Any, stream: bool | None, client_id: str,
                 history: list[HistoryMessage] | None, user: Any = None,
                 can_approve: bool = True) -> tuple[TurnContext, _Answering]:
    """Validate the message, save it with an empty answer, and make the turn's context."""
    text = validate_user_message(text)
    profile, components = built_profile(conversation.profile, f"cannot answer in conversation {conversation.pk}")
    run = _Answering(streaming=profile.stream if stream is None else stream)
    turn = TurnContext(conversation=conversation, profile=profile, components=components, question=text,
                       streaming=run.streaming, supplied_history=None if history is None else list(history),
                       user=await _asker(conversation, user), can_approve=can_approve)
    turn.trace = _new_trace(turn)
    (turn.user_message, turn.assistant_message), turn.principals = await sync_to_async(_begin_turn)(
        conversation, text, client_id)
    return turn, run


def _begin_turn(conversation: Conversation, text: str, client_id: str):
    """Save the user's message (and the empty answer), and read the asker's principals now, so a
    change of their groups or permissions applies from this turn on (one thread hop for both)."""
    principals = principals_of_user_id(conversation.owner_id)  # first: nothing is saved if it fails
    return persistence.begin_turn(conversation.pk, text, client_id), principals


# The component kinds each stage runs (the advisors' around_turn wraps them all).
STAGE_KINDS = {
    "input_guardrails": ("guardrail",), "memory": ("memory",), "query_transformers": ("query_transformer",),
    "query_expanders": ("query_expander",), "retrieval": ("retriever",), "join": ("joiner",),
    "postprocess": ("document_postprocessor",), "prompt": ("prompt_augmenter",), "llm": ("llm",),
    "response_augmenters": ("response_augmenter",), "output_guardrails": ("guardrail",),
}


def components_that_ran(turn: TurnContext) -> list[dict[str, str]]:
    """The trace's ``components`` cut to what the turn ran: the stages it reached (a turn ended
    early, a retrieval skipped, a failure, ran fewer), within the stage that ended it only the
    components up to the one that did, the embedder if anything was embedded, the advisors of
    the calls that happened."""
    stages = turn.state.get("_stages_run", [])
    kinds = {kind for stage in stages for kind in STAGE_KINDS.get(stage, ())}
    if turn.embedded:
        kinds.add("embedder")
    advising = {id(a) for a in turn.components.turn_advisors}
    if "llm" in stages:
        advising |= {id(a) for a in (*turn.components.llm_advisors, *turn.components.stream_advisors)}
    ended = turn.trace.get("ended_by") or {}
    # Within the stage that ended the turn, the components after the one that ended it did not
    # run (output guardrails excepted: every guardrail ran on the input before).
    ending_kinds = () if ended.get("stage") == "output_guardrails" else STAGE_KINDS.get(ended.get("stage"), ())
    if ended.get("stage") == "advisors":  # the advisors inside the one that answered did not run
        chain = turn.components.turn_advisors
        names = [a.name for a in chain]
        if ended.get("component") in names:
            advising -= {id(a) for a in chain[names.index(ended["component"]) + 1:]}
    rows, cut = [], False
    for component, row in zip(turn.components.each(), turn.trace["components"]):
        if component.kind == "advisor":
            keep = id(component) in advising
        else:
            keep = component.kind in kinds and not (cut and component.kind in ending_kinds)
            cut = cut or (component.kind in ending_kinds and component.name == ended.get("component"))
        if keep:
            rows.append(row)
    return rows


async def _save(turn: TurnContext, run: _Answering, answer: Answer, status: str,
                error: dict | None = None) -> dict[str, Any]:
    """Save the answer with its sources and trace; its payload for the ``done`` event."""
    turn.trace["timings"]["total"] = round((time.perf_counter() - run.started) * 1000, 3)
    if turn.tool_runs:  # also when the turn failed or stopped between its calls
        turn.trace["tools"] = [r.trace() for r in turn.tool_runs]
    turn.trace["components"] = components_that_ran(turn)
    message = await sync_to_async(persistence.finish_turn)(turn, answer, status, error)
    tool_calls = [r.payload() for r in turn.tool_runs]
    return persistence.message_payload(message, answer, turn.prompt.documents if turn.prompt else (), tool_calls)


def raised_by(exc: BaseException) -> str:
    """The component whose code raised ``exc`` ("document_postprocessor 'drop_returns' of plugin
    'shop.ragchat'"): the innermost frame of a component's method in its traceback; "" if none."""
    found = exc.component if isinstance(exc, WrongResult) else None
    tb = exc.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if isinstance(owner, Component) and owner.kind:
            found = owner
        tb = tb.tb_next
    if found is None:
        return ""
    try:
        plugin = f" of plugin {get_registry().get(found.kind, found.name).plugin!r}"
    except ImproperlyConfigured:  # a component built outside the registry (a test's, a plugin's own)
        plugin = ""
    return f"{found.kind} {found.name!r}{plugin}"


async def _failed(turn: TurnContext, run: _Answering, exc: Exception) -> Failed:
    """Save the partial answer of a failed turn; the ``error`` event that says so."""
    code, message, retry_after = describe_error(exc)
    where = raised_by(exc)
    logger.exception("ragchat turn in conversation %s failed (%s)%s", turn.conversation.pk, code,
                     f" in the {where}" if where else "")
    stage = failed_stage(turn)
    turn.trace["error"] = {"code": code, "detail": repr(exc)[:2000], **({"stage": stage} if stage else {}),
                           **({"raised_by": where} if where else {})}
    error = {"code": code, "message": message}
    try:
        payload = await _save(turn, run, Answer(text=run.partial()), Message.Status.ERROR, error)
    except persistence.ConversationGone:
        raise
    except Exception:  # noqa: BLE001  (saving failed too: the answer must not hold the conversation)
        logger.exception("ragchat could not save the failed answer in conversation %s; saved without its "
                         "sources and trace", turn.conversation.pk)
        saved = await sync_to_async(persistence.release_answer)(turn, run.partial(), error)
        payload = persistence.message_payload(saved)
    await notify("on_turn_failed", turn=turn, error=exc)
    return Failed(code=code, message=message, assistant_message=payload, retry_after=retry_after)


async def run_turn(conversation: Conversation, text: Any, *, stream: bool = False,
                   client_id: str = "", user: Any = None) -> TurnResult:
    """Run one turn to the end and return its result (see ``stream_turn`` for the errors)."""
    accepted = final = None
    events = stream_turn(conversation, text, stream=stream, client_id=client_id, user=user)
    async with contextlib.aclosing(events) as events:
        async for event in events:
            if isinstance(event, Accepted):
                accepted = event
            elif isinstance(event, (Completed, Failed)):
                final = event
    if isinstance(final, Completed):
        message, error = final.message, None
    else:
        message, error = final.assistant_message, final
    trace = await sync_to_async(_load_trace)(message["id"])
    return TurnResult(conversation_id=accepted.conversation_id, user_message_id=accepted.user_message_id,
                      message=message, trace=trace, error=error)


def _load_trace(message_id: int) -> dict[str, Any]:
    return TurnTrace.objects.filter(message_id=message_id).values_list("data", flat=True).first() or {}


def run_turn_sync(conversation: Conversation, text: Any, *, stream: bool = False,
                  client_id: str = "", user: Any = None) -> TurnResult:
    """``run_turn`` for synchronous callers (WSGI views, management commands, tests).

    The turn runs on the process's one background event loop (the one WSGI streams use,
    ``sync_bridge.background_loop``), so its model clients and their connection pools are
    made once per process, not per turn. Its database work still runs in the calling thread,
    as with a plain ``async_to_sync``: asgiref hands a coroutine to a parent loop named in
    ``SyncToAsync.threadlocal`` and serves the coroutine's thread-sensitive calls from this
    thread meanwhile (the mechanism it uses for sync code called from async code).

    It passes the start gate (``start_gate``) of that loop, as the streamed turns do: at a
    burst of whole-answer requests (the REST API under WSGI threads), they reach their model in
    arrival order, at most ``STARTING_TURNS`` at once."""

    threadlocal = SyncToAsync.threadlocal
    saved = getattr(threadlocal, "main_event_loop", None), getattr(threadlocal, "main_event_loop_pid", None)
    threadlocal.main_event_loop, threadlocal.main_event_loop_pid = background_loop(), os.getpid()
    try:
        return async_to_sync(_gated_turn)(conversation, text, stream=stream, client_id=client_id, user=user)
    finally:
        threadlocal.main_event_loop, threadlocal.main_event_loop_pid = saved


async def _gated_turn(conversation: Conversation, text: Any, **options: Any) -> TurnResult:
    async with start_gate.passing():  # given back at the model call (``generate``) or the end
        return await run_turn(conversation, text, **options)
