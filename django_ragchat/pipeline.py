"""The turn pipeline: one user message in, one saved assistant message out.

Read ``stream_turn`` top to bottom; it is the turn:

1. validate the text and save it (with an empty assistant message marked "streaming");
2. input guardrails;
3. memory: the history the model will see, within its share of the token budget;
4. query transformers, each seeing the history (rewrite a follow-up, compress, translate);
5. query expanders (the original query plus variants);
6. every (query, retriever) pair retrieved concurrently;
7. the joiner (dedupe, rank fusion), then the document post-processors (threshold, top-k);
8. the prompt augmenter (context within the rest of the budget; the no-context policy);
9. the LLM, whole or streamed, with streamed response augmenters on each piece;
10. response augmenters (citations), output guardrails;
11. the assistant message saved with its sources and its trace.

Any stage may end the turn early by returning an ``EndTurn`` (a refusal, a canned answer);
the trace's ``ended_by`` says which stage and component did. A failure keeps the partial
answer, marked "error"; a cancellation keeps it marked "incomplete". The user's message is
saved before anything can fail.

The core is async. ``run_turn_sync`` is the facade for synchronous callers (views under
WSGI, management commands); it drives the same code.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from asgiref.sync import async_to_sync, sync_to_async

from django_ragchat import persistence
from django_ragchat.conf import ragchat_settings
from django_ragchat.events import Accepted, Completed, Delta, Failed, SourcesFound, StageChanged, TurnEvent
from django_ragchat.llms import LLMError
from django_ragchat.models import Conversation, Message
from django_ragchat.plugins import await_me_maybe, get_registry, instance_cache, notify
from django_ragchat.profiles import Profile, get_profile
from django_ragchat.retrievers import EmbeddingSpaceMismatch
from django_ragchat.tokens import count_tokens, tokenizer_name
from django_ragchat.types import (
    Answer, EndTurn, HistoryMessage, Prompt, Query, RetrievedChunk, SkipRetrieval, Usage,
)

logger = logging.getLogger(__name__)

TurnInProgress = persistence.TurnInProgress


class InvalidMessage(ValueError):
    """The user's text cannot be accepted; nothing was saved. ``code`` is stable."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def validate_user_message(text: Any) -> str:
    """Return ``text`` if it can be stored and answered; raise ``InvalidMessage`` otherwise.

    Rejected: non-strings, empty or whitespace-only text, more than ``MAX_MESSAGE_CHARS``
    characters, NUL bytes (PostgreSQL cannot store them) and lone surrogates (not encodable
    as UTF-8).
    """
    if not isinstance(text, str):
        raise InvalidMessage("invalid_type", "The message must be a string.")
    limit = ragchat_settings.MAX_MESSAGE_CHARS
    if len(text) > limit:
        raise InvalidMessage("too_long", f"The message has {len(text):,} characters; the limit is {limit:,}.")
    if not text.strip():
        raise InvalidMessage("empty", "The message is empty.")
    if "\x00" in text:
        raise InvalidMessage("invalid_characters", "The message contains NUL characters.")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidMessage("invalid_characters", "The message contains invalid Unicode (lone surrogates).") from None
    return text


@dataclass
class ProfileComponents:
    """The component instances one profile runs, each list in call order."""

    memory: Any
    guardrails: list
    query_transformers: list
    query_expanders: list
    retrievers: list
    joiner: Any
    document_postprocessors: list
    prompt_augmenter: Any
    llm: Any
    embedder: Any
    response_augmenters: list


def components_for(profile: Profile) -> ProfileComponents:
    """Build (once per process and profile) the components ``profile`` selects."""
    cache = instance_cache()
    if profile.name not in cache:
        registry = get_registry()

        def build(kind, names):
            return [reg.cls(profile, **profile.options_for(reg.name)) for reg in registry.ordered(kind, names)]

        def one(kind, name):
            return build(kind, [name])[0]

        cache[profile.name] = ProfileComponents(
            memory=one("memory", profile.memory),
            guardrails=build("guardrail", profile.guardrails),
            query_transformers=build("query_transformer", profile.query_transformers),
            query_expanders=build("query_expander", profile.query_expanders),
            retrievers=build("retriever", profile.retrievers),
            joiner=one("joiner", profile.joiner),
            document_postprocessors=build("document_postprocessor", profile.document_postprocessors),
            prompt_augmenter=one("prompt_augmenter", profile.prompt_augmenter),
            llm=one("llm", profile.llm),
            embedder=one("embedder", profile.embedder),
            response_augmenters=build("response_augmenter", profile.response_augmenters),
        )
    return cache[profile.name]


@dataclass(eq=False)
class TurnContext:
    """Everything about the turn in progress; every component receives it.

    ``state`` is free scratch space for plugins (keyed by plugin name, by convention).
    ``trace`` becomes the saved ``TurnTrace.data``.
    """

    conversation: Conversation
    profile: Profile
    components: ProfileComponents
    question: str
    user_message: Message | None = None
    assistant_message: Message | None = None
    history: list[HistoryMessage] = field(default_factory=list)
    query: Query | None = None
    queries: list[Query] = field(default_factory=list)
    documents: list[RetrievedChunk] = field(default_factory=list)
    prompt: Prompt | None = None
    retrieval_skipped: bool = False
    context_budget: int = 0
    usage: Usage | None = None
    model: str = ""
    state: dict[str, Any] = field(default_factory=dict)
    trace: dict[str, Any] = field(default_factory=dict)
    _embeddings: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    def warn(self, message: str) -> None:
        """Record a warning in the trace (and the log)."""
        logger.warning("ragchat turn %s: %s", self.conversation.pk, message)
        self.trace.setdefault("warnings", []).append(message)

    async def embed(self, texts: list[str]) -> np.ndarray:
        """Embeddings of ``texts`` in the profile's space, computed once per text per turn."""
        missing = [t for t in dict.fromkeys(texts) if t not in self._embeddings]
        if missing:
            vectors = await self.components.embedder.aembed(missing)
            self._embeddings.update(zip(missing, vectors))
        return np.vstack([self._embeddings[t] for t in texts])


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


async def _timed(turn: TurnContext, stage: str, started: float) -> None:
    elapsed = (time.perf_counter() - started) * 1000
    turn.trace["timings"][stage] = round(elapsed, 3)
    await notify("on_stage_completed", turn=turn, stage=stage, elapsed_ms=elapsed)


def _end(turn: TurnContext, stage: str, component: Any, ending: EndTurn) -> EndTurn:
    turn.trace["ended_by"] = {
        "stage": stage, "component": getattr(component, "name", str(component)),
        "kind": ending.kind, "reason": ending.reason,
    }
    return ending


async def check_input(turn: TurnContext) -> EndTurn | None:
    started = time.perf_counter()
    for guardrail in turn.components.guardrails:
        result = await await_me_maybe(guardrail.check_input(turn.question, turn))
        if isinstance(result, EndTurn):
            return _end(turn, "input_guardrails", guardrail, result)
    await _timed(turn, "input_guardrails", started)
    return None


async def select_history(turn: TurnContext) -> None:
    started = time.perf_counter()
    profile = turn.profile
    budget = max(0, profile.prompt_budget - count_tokens(profile.system_prompt)
                 - count_tokens(turn.question) - 64)  # 64: template and message framing
    history_budget = int(budget * profile.history_share)
    turn.history = list(await await_me_maybe(turn.components.memory.select(turn, history_budget)))
    history_tokens = sum(m.token_count for m in turn.history)
    # The context gets what the history did not use: the history's share is reserved for it,
    # never the other way round.
    turn.context_budget = budget - history_tokens
    turn.trace["prompt"].update(budget=budget, history_budget=history_budget,
                                history_tokens=history_tokens, context_budget=turn.context_budget)
    turn.trace["history"] = {"messages": len(turn.history),
                             "seqs": [m.seq for m in turn.history[:1] + turn.history[-1:]]}
    await _timed(turn, "memory", started)


async def transform_query(turn: TurnContext) -> EndTurn | None:
    started = time.perf_counter()
    query = Query(text=turn.question, original=turn.question, history=tuple(turn.history))
    steps = turn.trace["queries"]["transformed"]
    for transformer in turn.components.query_transformers:
        result = await await_me_maybe(transformer.transform(query, turn))
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
    await _timed(turn, "query_transformers", started)
    return None


async def expand_query(turn: TurnContext) -> EndTurn | None:
    started = time.perf_counter()
    queries = {turn.query.text: turn.query}
    for expander in turn.components.query_expanders:
        result = await await_me_maybe(expander.expand(turn.query, turn))
        if isinstance(result, EndTurn):
            return _end(turn, "query_expanders", expander, result)
        if isinstance(result, SkipRetrieval):
            turn.retrieval_skipped = True
            break
        for query in result:
            queries.setdefault(query.text, query)
    turn.queries = list(queries.values())
    turn.trace["queries"]["expanded"] = [q.text for q in turn.queries]
    await _timed(turn, "query_expanders", started)
    return None


async def retrieve(turn: TurnContext) -> None:
    started = time.perf_counter()
    retrievers = turn.components.retrievers
    if any(r.uses_embeddings for r in retrievers):
        await turn.embed([q.text for q in turn.queries])  # one batch for every query
    limit = asyncio.Semaphore(max(1, turn.profile.retrieval_concurrency))
    k = turn.profile.retrieval_k

    async def one(query: Query, retriever) -> tuple[Query, str, list[RetrievedChunk], float]:
        async with limit:
            t0 = time.perf_counter()
            hits = list(await await_me_maybe(retriever.retrieve(query, turn, k)))
            return query, retriever.name, hits, (time.perf_counter() - t0) * 1000

    results = await asyncio.gather(*(one(q, r) for q in turn.queries for r in retrievers))
    turn.trace["retrieval"] = [
        {"query": q.text, "retriever": name, "ms": round(ms, 3),
         "hits": [{"chunk_id": h.chunk_id, "score": round(h.score, 6)} for h in hits]}
        for q, name, hits, ms in results
    ]
    await _timed(turn, "retrieval", started)

    started = time.perf_counter()
    documents = await await_me_maybe(
        turn.components.joiner.join([(q, name, hits) for q, name, hits, _ in results], turn)
    )
    await _timed(turn, "join", started)

    started = time.perf_counter()
    for processor in turn.components.document_postprocessors:
        documents = await await_me_maybe(processor.process(turn.query, list(documents), turn))
    turn.documents = list(documents)
    await _timed(turn, "postprocess", started)


async def augment_prompt(turn: TurnContext) -> EndTurn | None:
    started = time.perf_counter()
    augmenter = turn.components.prompt_augmenter
    result = await await_me_maybe(
        augmenter.augment(turn, turn.query, turn.history, turn.documents, turn.context_budget)
    )
    if isinstance(result, EndTurn):
        return _end(turn, "prompt", augmenter, result)
    turn.prompt = result
    turn.trace["prompt"]["tokens"] = result.token_count
    turn.trace["documents"] = [
        {"index": i, "chunk_id": d.chunk_id, "score": round(d.score, 6), "source": d.source,
         "raw_scores": {k: round(v, 6) for k, v in d.raw_scores.items()}}
        for i, d in enumerate(result.documents, start=1)
    ]
    await _timed(turn, "prompt", started)
    return None


async def finish_answer(turn: TurnContext, text: str, *, streamed: bool) -> Answer:
    """Response augmenters, then output guardrails."""
    started = time.perf_counter()
    answer = Answer(text=text)
    for augmenter in turn.components.response_augmenters:
        method = augmenter.on_complete if streamed else augmenter.augment
        answer = await await_me_maybe(method(answer, turn))
    await _timed(turn, "response_augmenters", started)
    for guardrail in turn.components.guardrails:
        result = await await_me_maybe(guardrail.check_output(answer, turn))
        if isinstance(result, EndTurn):
            _end(turn, "output_guardrails", guardrail, result)
            return Answer(text=result.answer)
        if isinstance(result, Answer):
            answer = result
    return answer


def _record_llm(turn: TurnContext, model: str, usage: Usage | None) -> None:
    turn.model = model or turn.model
    turn.usage = usage or turn.usage
    turn.trace["model"] = turn.model
    if turn.usage:
        turn.trace["usage"] = {"prompt_tokens": turn.usage.prompt_tokens,
                               "completion_tokens": turn.usage.completion_tokens}


def describe_error(exc: BaseException) -> tuple[str, str, float | None]:
    """(code, message safe to show, retry-after seconds) for an exception that ended a turn."""
    if isinstance(exc, LLMError):
        return exc.code, exc.user_message, exc.retry_after
    if isinstance(exc, EmbeddingSpaceMismatch):
        return "embedding_space_mismatch", str(exc), None
    return "internal_error", "The assistant failed to answer; the error has been logged.", None


# --- The turn ---------------------------------------------------------------------------------


def _new_trace(turn: TurnContext) -> dict[str, Any]:
    return {
        "profile": turn.profile.name,
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


async def stream_turn(conversation: Conversation, text: Any, *, stream: bool | None = None) -> AsyncIterator[TurnEvent]:
    """Run one turn, yielding its events (see ``django_ragchat.events``).

    Raises ``InvalidMessage`` (nothing saved), ``TurnInProgress`` (nothing saved) or
    ``Conversation.DoesNotExist`` before the first event; after the ``ack`` event every failure
    becomes an ``error`` event with the partial answer saved. Closing the iterator early (the
    client cancelled or went away) saves the partial answer as "incomplete".
    ``stream=False`` asks the model for a whole answer (no ``delta`` events).
    """
    text = validate_user_message(text)
    profile = get_profile(conversation.profile)
    components = components_for(profile)
    streaming = profile.stream if stream is None else stream
    turn = TurnContext(conversation=conversation, profile=profile, components=components, question=text)
    turn.trace = _new_trace(turn)
    turn_started = time.perf_counter()
    turn.user_message, turn.assistant_message = await sync_to_async(persistence.begin_turn)(conversation.pk, text)

    parts: list[str] = []
    finished = False

    async def save(answer: Answer, status: str, error: dict | None = None) -> dict[str, Any]:
        turn.trace["timings"]["total"] = round((time.perf_counter() - turn_started) * 1000, 3)
        message = await sync_to_async(persistence.finish_turn)(turn, answer, status, error)
        return persistence.message_payload(message, answer, turn.prompt.documents if turn.prompt else ())

    try:
        # Inside the try: a client that goes away right after the ack still gets its (empty)
        # answer saved as "incomplete" instead of leaving the conversation blocked.
        yield Accepted(conversation_id=str(conversation.pk), user_message_id=turn.user_message.pk,
                       user_seq=turn.user_message.seq, assistant_message_id=turn.assistant_message.pk)
        await notify("on_turn_started", turn=turn)
        ending = await check_input(turn)
        if ending is None:
            await select_history(turn)
            ending = await transform_query(turn)
        if ending is None and not turn.retrieval_skipped:
            ending = await expand_query(turn)
        if ending is None:
            if not turn.retrieval_skipped:
                yield StageChanged(stage="retrieving")
                await retrieve(turn)
            ending = await augment_prompt(turn)

        if ending is not None:
            answer = Answer(text=ending.answer)
        else:
            yield SourcesFound(sources=[d.as_source(i) for i, d in enumerate(turn.prompt.documents, start=1)])
            yield StageChanged(stage="generating")
            started = time.perf_counter()
            llm = turn.components.llm
            if streaming:
                async with contextlib.aclosing(llm.stream(turn.prompt, turn)) as pieces:
                    async for piece in pieces:
                        _record_llm(turn, piece.model, piece.usage)
                        chunk = piece.text
                        for augmenter in turn.components.response_augmenters:
                            chunk = await await_me_maybe(augmenter.on_delta(chunk, turn))
                        if chunk:
                            parts.append(chunk)
                            yield Delta(text=chunk, index=len(parts) - 1)
            else:
                response = await llm.complete(turn.prompt, turn)
                _record_llm(turn, response.model, response.usage)
                parts.append(response.text)
            await _timed(turn, "llm", started)
            answer = await finish_answer(turn, "".join(parts), streamed=streaming)

        payload = await save(answer, Message.Status.COMPLETE)
        finished = True
        await notify("on_turn_completed", turn=turn, message=turn.assistant_message)
        yield Completed(message=payload)
    except (asyncio.CancelledError, GeneratorExit):
        if not finished:
            turn.trace["cancelled"] = True
            # Shielded: the partial answer must be saved even though this task is cancelled.
            await asyncio.shield(save(Answer(text="".join(parts)), Message.Status.INCOMPLETE,
                                      {"code": "cancelled", "message": "The answer was stopped."}))
        raise
    except Exception as exc:
        if finished:
            raise
        code, message, retry_after = describe_error(exc)
        logger.exception("ragchat turn in conversation %s failed (%s)", conversation.pk, code)
        turn.trace["error"] = {"code": code, "detail": repr(exc)[:2000]}
        payload = await save(Answer(text="".join(parts)), Message.Status.ERROR, {"code": code, "message": message})
        await notify("on_turn_failed", turn=turn, error=exc)
        yield Failed(code=code, message=message, assistant_message=payload, retry_after=retry_after)


async def run_turn(conversation: Conversation, text: Any, *, stream: bool = False) -> TurnResult:
    """Run one turn to the end and return its result (see ``stream_turn`` for the errors)."""
    accepted = final = None
    async with contextlib.aclosing(stream_turn(conversation, text, stream=stream)) as events:
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
    from django_ragchat.models import TurnTrace

    return TurnTrace.objects.filter(message_id=message_id).values_list("data", flat=True).first() or {}


def run_turn_sync(conversation: Conversation, text: Any, *, stream: bool = False) -> TurnResult:
    """``run_turn`` for synchronous callers (WSGI views, management commands, tests).

    The turn runs on the process's one background event loop (the one WSGI streams use,
    ``sync_stream.background_loop``), so its model clients and their connection pools are
    made once per process, not per turn. Its database work still runs in the calling thread,
    as with a plain ``async_to_sync``: asgiref hands a coroutine to a parent loop named in
    ``SyncToAsync.threadlocal`` and serves the coroutine's thread-sensitive calls from this
    thread meanwhile (the mechanism it uses for sync code called from async code)."""
    from asgiref.sync import SyncToAsync

    from django_ragchat.sync_stream import background_loop

    threadlocal = SyncToAsync.threadlocal
    saved = getattr(threadlocal, "main_event_loop", None), getattr(threadlocal, "main_event_loop_pid", None)
    threadlocal.main_event_loop, threadlocal.main_event_loop_pid = background_loop(), os.getpid()
    try:
        return async_to_sync(run_turn)(conversation, text, stream=stream)
    finally:
        threadlocal.main_event_loop, threadlocal.main_event_loop_pid = saved
