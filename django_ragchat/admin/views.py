"""What the admin shows beyond Django's defaults: transcripts with turn traces, and one user's chat data.

* ``transcript(conversation, page_number)`` loads one page of a conversation's messages with
  their sources, traces, feedback and the chunks the traces mention, in a fixed number of
  queries whatever the page's length, and turns each trace into a ``TraceView`` a template can
  render for people (labels, titles, headings and snippets instead of ids).
* ``UserChatData`` counts, exports (JSON) and erases everything one user left in the chat:
  conversations, messages, sources, tool calls, traces, memory records, feedback and API keys;
  and counts what erasing leaves, the documents indexed for that user (the site's data).

Everything here is data for templates; all text (questions, answers, document text, comments)
is untrusted and left to the templates' autoescaping.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from django.core.paginator import Paginator
from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.db.models import Count, Prefetch, Q
from django.utils.translation import ngettext

from django_ragchat.access import UNRESTRICTED, Principals, principals_of_user_id
from django_ragchat.admin.answerer_why import answerer_sentence
from django_ragchat.models import (
    ApiKey,
    Chunk,
    Conversation,
    Document,
    Feedback,
    MemoryRecord,
    Message,
    MessageSource,
    ToolInvocation,
    TurnTrace,
)
from django_ragchat.stages.expanders import ASKER_ROWS_MARK
from django_ragchat.text import shorten

# The follow-up transformer's raw rule at the end of its note ("subject none, attribute new
# (take)"), which ``followup_sentence`` says in words.
_FOLLOWUP_RULE_RE = re.compile(r"(?:^|;\s*)subject (?:set|kept|replaced|fresh|none)(?: \([^)]*\))?"
                               r", attribute (?:new|inherited|none)(?: \([^)]*\))?$")

#: Messages per page of a conversation's transcript in the admin.
TRANSCRIPT_PAGE_SIZE = 200
#: Characters of a chunk's text shown as a snippet (cut back to a word boundary).
SNIPPET_CHARS = 240
#: Trace keys ``TraceView`` renders itself; any other key is shown under "Other details".
KNOWN_TRACE_KEYS = frozenset({
    "profile", "question", "queries", "retrieval", "documents", "prompt", "timings", "model",
    "usage", "ended_by", "tokenizer", "history", "warnings", "error", "cancelled", "components",
    "origin", "supplied_history", "supplied_guardrails", "postprocess", "response_augmenters", "redactions",
    "tools", "tools_offered", "tool_steps", "tool_step_limit_reached", "approval_wait_ms", "answerer",
})


def snippet(text: str, limit: int = SNIPPET_CHARS) -> str:
    """``text`` on one line, cut at a word boundary near ``limit`` characters, with "…" when cut."""
    return shorten(text, limit)


def short_heading(heading: str, title: str) -> str:
    """A chunk's heading without its document's title in front ("Aurora X2 > Pricing" -> "Pricing")."""
    heading = heading or ""
    if title and heading.startswith(title + " > "):
        return heading[len(title) + 3:]
    return "" if heading == title else heading


def chunk_snippet(chunk: Chunk) -> str:
    """The chunk's text without the heading line it starts with, as a snippet."""
    text = chunk.text or ""
    if chunk.heading and text.startswith(chunk.heading):
        text = text[len(chunk.heading):]
    return snippet(text)


def _as_dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _as_list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def pretty_json(value: Any) -> str:
    """Indented JSON for a ``<pre>`` (escaped by the template like any other text)."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, cls=DjangoJSONEncoder, default=str)


@dataclass
class Hit:
    """One retrieved chunk, as a person reads it."""

    chunk_id: Any
    score: float | None
    title: str = ""
    heading: str = ""
    snippet: str = ""
    source: str = ""
    seen: bool = False  # the model was given it
    cited: bool = False  # the answer cited it
    missing: bool = False  # the chunk is gone (re-ingested or deleted since)
    # The chunk is there, but the asker or the member of staff may not read it now; or it is gone
    # and the access saved with the answer did not let them.
    hidden: bool = False
    hidden_reason: str = ""  # which of them: "you may not read it", "the asker may not read it now"


#: What each stage of the turn does, as the stage timings name it for staff (the stage's own
#: name is shown beside it); a stage a plugin adds keeps its name.
STAGE_LABELS = {
    "input_guardrails": "checks on the question", "memory": "earlier messages read",
    "query_transformers": "question rewritten", "query_expanders": "more queries made",
    "retrieval": "passages searched", "join": "results merged", "postprocess": "passages filtered",
    "prompt": "prompt built", "llm": "answer written", "response_augmenters": "answer completed",
    "output_guardrails": "checks on the answer",
}


@dataclass
class Timing:
    stage: str
    ms: float
    percent: float
    slowest: bool = False
    # Of ``ms``, the time spent waiting for the user to approve tool calls (the ``llm`` stage's,
    # which runs the calls): the user's time, not the model's or the tools'.
    wait_ms: float | None = None

    @property
    def label(self) -> str:
        return STAGE_LABELS.get(self.stage, self.stage)

    @property
    def own_ms(self) -> float:
        """The stage's time without the wait for approval."""
        return max(self.ms - (self.wait_ms or 0.0), 0.0)

    @property
    def wait_percent(self) -> float:
        """The wait's share of the stage's bar."""
        return min(100.0, round(100 * (self.wait_ms or 0.0) / self.ms, 1)) if self.ms else 0.0


def indented_lines(text: str) -> list[tuple[str, str]]:
    """``text`` (pretty JSON, or any text) as its lines, each split into its leading spaces and
    the rest, for a ``<pre>`` that wraps a long line under its own start (admin.css,
    ``.ragchat-lines``): a long string value in JSON continues beside its key, not under the
    opening brace."""
    return [(line[:len(line) - len(line.lstrip(" "))], line.lstrip(" ")) for line in text.split("\n")]


#: The statuses of a tool call that never ran (``ToolInvocation.Status``).
NOT_RUN = frozenset({"rejected", "abandoned", "cancelled"})


@dataclass
class ToolCallView:
    """One tool call of a turn, as a person reads it."""

    step: Any
    name: str
    status: str
    arguments: str  # pretty JSON (or the text the model wrote, when it is not JSON)
    result: str  # pretty JSON when the result is JSON
    ms: float | None  # its own time, without the wait for the user's approval
    error: dict = field(default_factory=dict)
    confirmation_id: Any = None
    wait_ms: float | None = None  # how long it waited for the user's approval (None: not asked, or not timed)
    short_circuited_by: str = ""
    raised: str = ""  # what a tool that raised raised (staff only; the model read tool_failed)

    @property
    def failed(self) -> bool:
        return self.status not in ("done", "")

    @property
    def argument_lines(self) -> list[tuple[str, str]]:
        return indented_lines(self.arguments)

    @property
    def result_lines(self) -> list[tuple[str, str]]:
        return indented_lines(self.result)

    @property
    def ran(self) -> bool:
        """Whether the tool ran: a call rejected, abandoned or cancelled before it ran has no time
        of its own (its 0.0 ms read as a call that ran in no time)."""
        return self.status not in NOT_RUN


def _pretty(value: Any) -> str:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return value
    return pretty_json(value)


@dataclass
class TraceView:
    """A turn trace prepared for the admin's template. ``data`` keeps the raw dictionary."""

    data: dict
    question: str = ""
    #: The input guardrails that replaced the question (``{"by", "reason"}``): ``question`` is
    #: what the last one left, not what was typed.
    redactions: list[dict] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)
    final_query: str = ""
    followup: str = ""  # how the follow-up transformer read the question (``followup_sentence``)
    expanded: list[str] = field(default_factory=list)
    retrieval: list[dict] = field(default_factory=list)
    documents: list[Hit] = field(default_factory=list)
    timings: list[Timing] = field(default_factory=list)
    total_ms: float | None = None
    model: str = ""
    usage: dict = field(default_factory=dict)
    prompt: str = ""  # the prompt's size against its budget, as a sentence (``prompt_sentence``)
    history: str = ""  # the earlier messages the model was shown (``history_sentence``)
    answerer: str = ""  # why the offline answerer answered or declined (``answerer_sentence``)
    ended_by: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    error: dict = field(default_factory=dict)
    cancelled: bool = False
    components: list[dict] = field(default_factory=list)  # {"stage", "name", "plugin"} per component run
    # Where the message came from (the OpenAI-compatible endpoint: which API key, which model).
    origin: list[tuple[str, str]] = field(default_factory=list)
    # The earlier messages a stateless client sent with the message and the model was shown
    # (not in the log): {"role", "content"}.
    supplied_history: list[dict] = field(default_factory=list)
    # What the input guardrails did to them (``supplied_guardrails_sentence``); "" when nothing.
    supplied_guardrails: str = ""
    # What each document post-processor did to the passages (``_read_changes``): {"by", "query",
    # "in", "out", "dropped", "added", "order" (Hits), "reordered", "rescored"}.
    postprocess: list[dict] = field(default_factory=list)
    # What each response augmenter did to the answer: {"by", "did" (``answer_change_sentence``), "note"}.
    augmenters: list[dict] = field(default_factory=list)
    # The same two stages in a few words, for the one-line summary ("" when they changed nothing):
    # ``postprocess_summary`` and ``augmenters_summary``.
    passages_changed: str = ""
    answer_changed: str = ""
    tools: list[ToolCallView] = field(default_factory=list)
    tools_offered: list[str] = field(default_factory=list)
    tool_step_limit_reached: bool = False
    # How long the turn waited for the user to approve tool calls (parallel waits once), which
    # the llm stage's time includes; None when nothing waited (or a trace from before it was kept).
    approval_wait_ms: float | None = None
    other: list[tuple[str, str]] = field(default_factory=list)

    @property
    def tools_asked_approval(self) -> bool:
        """Whether a call asked the user's approval: the tool calls table shows the waits."""
        return any(t.confirmation_id is not None for t in self.tools)

    @property
    def rewritten(self) -> bool:
        return bool(self.final_query) and self.final_query != self.question

    @property
    def summary(self) -> str:
        """One line: how the turn went, for the collapsed trace."""
        parts = []
        if self.rewritten:
            parts.append("query rewritten")
        hits = sum(len(r["hits"]) for r in self.retrieval)
        if self.retrieval:
            parts.append(f"{hits} hit{'s' if hits != 1 else ''} from {len(self.retrieval)} search"
                         f"{'es' if len(self.retrieval) != 1 else ''}")
        if self.passages_changed:
            parts.append(self.passages_changed)
        parts.append(f"{len(self.documents)} document{'s' if len(self.documents) != 1 else ''} given")
        cited = sum(1 for d in self.documents if d.cited)
        if cited:
            parts.append(f"{cited} cited")
        if self.answer_changed:
            parts.append(self.answer_changed)
        if self.ended_by:
            parts.append(f"ended by {self.ended_by.get('stage') or '?'}")
        if self.tools:
            failed = sum(1 for t in self.tools if t.failed)
            parts.append(f"{len(self.tools)} tool call{'s' if len(self.tools) != 1 else ''}"
                         + (f" ({failed} not done)" if failed else ""))
        if self.error:
            parts.append(f"error {self.error.get('code', '')}".strip())
        if self.warnings:
            parts.append(f"{len(self.warnings)} warning{'s' if len(self.warnings) != 1 else ''}")
        if self.total_ms is not None:
            waited = f" ({self.approval_wait_ms:,.0f} of them waiting for approval)" if self.approval_wait_ms else ""
            parts.append(f"{self.total_ms:,.0f} ms{waited}")
        return " · ".join(parts)


def trace_chunk_ids(data: dict) -> set:
    """Every chunk id a trace mentions (retrieval hits, documents given, and those the
    post-processors dropped, added or moved)."""
    found = [_as_dict(hit).get("chunk_id") for search in _as_list(data.get("retrieval"))
             for hit in _as_list(_as_dict(search).get("hits"))]
    found += [_as_dict(document).get("chunk_id") for document in _as_list(data.get("documents"))]
    found += [chunk_id for step in _as_list(data.get("postprocess"))
              for key in ("dropped", "added", "order") for chunk_id in _as_list(_as_dict(step).get(key))]
    return {i for i in found if isinstance(i, int) and not isinstance(i, bool)}


#: Why a chunk is hidden, by who may not read it now (the asker, the member of staff looking).
HIDDEN_REASONS = {
    (True, False): "the asker may not read it now",
    (False, True): "you may not read it",
    (True, True): "neither the asker nor you may read it now",
}


class LoadedChunks(dict):
    """Chunk id -> ``Chunk`` (``load_chunks``), and the ids of the chunks left out that still
    exist (``hidden``): a chunk is shown as gone only when it is. ``hidden_reason`` says which
    reader may not read each (``HIDDEN_REASONS``)."""

    hidden: frozenset[int] = frozenset()

    def __init__(self, *args, readers: tuple[Principals, ...] = (), **kwargs):
        super().__init__(*args, **kwargs)
        self.hidden_reasons: dict[int, str] = {}
        self.readers = readers

    def hidden_reason(self, chunk_id) -> str:
        return self.hidden_reasons.get(chunk_id, "the asker or you may not read it now")

    def saved_hidden_reason(self, access) -> str:
        """Why a source whose chunk is gone since is not named, from the access saved with the
        answer (``MessageSource.access``: a cancelled booking stays the customer's); "" when
        every reader may read it."""
        if not access:  # saved before sources kept their access (migration 0011): no one's to name
            return "gone since; saved without who could read it"
        who = tuple(not reader.may_read(access) for reader in self.readers)
        if not any(who):
            return ""
        return f"gone since; {HIDDEN_REASONS.get(who, 'the asker or you may not read it')}"


def load_chunks(ids, *readers: Principals) -> LoadedChunks:
    """The chunks with these ids that every one of ``readers`` may read now (the admin passes
    the asker of the conversation and the member of staff looking), with their documents'
    titles, in one query (no embeddings); a second, only when some are left out, says which of
    those still exist: they show as hidden, the others as gone."""
    loaded = LoadedChunks(readers=readers)
    if not ids:
        return loaded
    chunks = Chunk.objects.filter(pk__in=list(ids))
    for principals in readers:
        chunks = chunks.filter(access__visible_to=principals)
    chunks = (chunks.select_related("document")
              .only("id", "heading", "text", "document__id", "document__title", "document__source"))
    loaded.update((c.pk, c) for c in chunks)
    left_out = set(ids) - loaded.keys()
    if left_out:
        loaded.hidden = frozenset(Chunk.objects.filter(pk__in=left_out).values_list("pk", flat=True))
    if loaded.hidden and len(readers) == 2:
        # A second query per reader, only for the hidden: say whose access hides each.
        readable = [set(Chunk.objects.filter(pk__in=loaded.hidden, access__visible_to=principals)
                        .values_list("pk", flat=True)) for principals in readers]
        for chunk_id in loaded.hidden:
            who = (chunk_id not in readable[0], chunk_id not in readable[1])
            if who in HIDDEN_REASONS:
                loaded.hidden_reasons[chunk_id] = HIDDEN_REASONS[who]
    return loaded


@dataclass
class _Hits:
    """Makes the ``Hit`` of a chunk id, with what the message's sources say about it."""

    chunks: dict[int, Chunk]
    sources: tuple

    def __post_init__(self) -> None:
        self.by_rank = {s.rank: s for s in self.sources}
        self.seen = {s.chunk_id for s in self.sources if s.chunk_id is not None}
        self.cited = {s.chunk_id for s in self.sources if s.cited and s.chunk_id is not None}

    def name_saved(self, hit: Hit, title: str, source: str, access=None) -> None:
        """The document's name saved with the answer, for a chunk replaced since, when the access
        saved with it (``access``; ``None``: no source row, only the trace's source path) lets
        the asker and the member of staff read it; a hidden chunk's name is not shown."""
        if hit.hidden:
            return
        reason = self.chunks.saved_hidden_reason(access) if hit.missing and access is not None else ""
        if reason:
            hit.hidden, hit.hidden_reason = True, reason
            return
        hit.title = hit.title or title or source
        hit.source = hit.source or source

    def hit(self, chunk_id, score) -> Hit:
        chunk = self.chunks.get(chunk_id)
        hidden = chunk is None and chunk_id in getattr(self.chunks, "hidden", ())
        hit = Hit(chunk_id=chunk_id, score=_number(score), seen=chunk_id in self.seen,
                  cited=chunk_id in self.cited, missing=chunk is None and not hidden, hidden=hidden,
                  hidden_reason=self.chunks.hidden_reason(chunk_id) if hidden else "")
        if chunk is not None:
            hit.title = chunk.document.title or chunk.document.source
            hit.source = chunk.document.source
            hit.heading = short_heading(chunk.heading, chunk.document.title)
            hit.snippet = chunk_snippet(chunk)
        return hit


def _read_queries(view: TraceView, data: dict) -> None:
    queries = _as_dict(data.get("queries"))
    view.question = str(data.get("question") or queries.get("original") or "")
    view.redactions = [{"by": str(r.get("by") or ""), "reason": str(r.get("reason") or "")}
                       for r in map(_as_dict, _as_list(data.get("redactions")))]
    before = view.question
    for step in _as_list(queries.get("transformed")):
        step = _as_dict(step)
        view.steps.append({
            "by": str(step.get("by", "")), "text": step.get("text"), "note": step.get("note", ""),
            "skip_retrieval": step.get("skip_retrieval"),
            "unchanged": step.get("text") == before,  # "Left as it was by": its note says why
        })
        before = step.get("text")
    view.final_query = str(queries.get("final") or "")
    view.followup = followup_sentence(_as_dict(queries.get("followup")))
    if view.followup:  # said in words below: its raw rule ("subject none, attribute new") is no help,
        for step in view.steps:  # what it did ("added the opening message ...") still is
            if step["by"] == "followup":
                step["note"] = _FOLLOWUP_RULE_RE.sub("", str(step["note"])).strip()
    view.expanded = [_own_rows_said(str(q)) for q in _as_list(queries.get("expanded")) if str(q) != view.final_query]


def followup_sentence(followup: dict) -> str:
    """The follow-up transformer's reading (``queries.followup``) for staff: "Stays on Loyalty
    card; asks what the question before asked (delivery)." instead of its rule names; "" when
    there is none."""
    if not followup:
        return ""
    subject, before = followup.get("subject"), followup.get("previous_subject")
    subject_rule, attribute = followup.get("subject_rule"), followup.get("attribute")
    said = {
        "set": f"Names {subject}", "kept": f"Stays on {subject}", "fresh": "Starts afresh: nothing carried",
        "replaced": f"Moves from {before} to {subject}",
    }.get(subject_rule, "No subject of the site's pages in play")
    if subject_rule == "fresh" and subject:
        said = f"Starts afresh on {subject}: nothing carried"
    asks = {"new": f"asks about: {attribute}", "inherited": f"asks what the question before asked ({attribute})"}
    part = asks.get(followup.get("attribute_rule")) if attribute else None
    return f"{said}; {part}." if part else f"{said}."


OWN_ROWS_SAID = "among only the rows shared with the asker by name (asker_rows)"


def _own_rows(query: str) -> tuple[str, bool]:
    """A traced query's text and whether it is the asker_rows expander's search (the trace marks
    it after the text: the mark says among whose rows, it was not searched for)."""
    mark = " " + ASKER_ROWS_MARK
    return (query[:-len(mark)], True) if query.endswith(mark) else (query, False)


def _own_rows_said(query: str) -> str:
    """An expanded query as staff read it: the asker_rows variant's mark said in words."""
    text, own = _own_rows(query)
    return f"“{text}” {OWN_ROWS_SAID}" if own else text


def _read_retrieval(view: TraceView, data: dict, hits: _Hits) -> None:
    for search in _as_list(data.get("retrieval")):
        search = _as_dict(search)
        query, own = _own_rows(str(search.get("query", "")))
        view.retrieval.append({
            "retriever": str(search.get("retriever", "")), "query": query,
            "among": OWN_ROWS_SAID if own else "",
            "ms": _number(search.get("ms")),
            "hits": [hits.hit(_as_dict(h).get("chunk_id"), _as_dict(h).get("score"))
                     for h in _as_list(search.get("hits"))],
        })
    for document in _as_list(data.get("documents")):
        document = _as_dict(document)
        hit = hits.hit(document.get("chunk_id"), document.get("score"))
        hit.seen = True
        source = hits.by_rank.get(document.get("index"))
        if source is not None:
            hit.cited = source.cited
            hits.name_saved(hit, source.title, source.source, source.access)
        else:
            hits.name_saved(hit, "", str(document.get("source", "")))
        view.documents.append(hit)
    if not view.documents and hits.sources:  # an older trace without "documents": the sources say it
        for source in hits.sources:
            hit = hits.hit(source.chunk_id, source.score)
            hit.seen, hit.cited = True, source.cited
            hits.name_saved(hit, source.title, source.source, source.access)
            view.documents.append(hit)


def _read_changes(view: TraceView, data: dict, hits: _Hits) -> None:
    """What the post-processors did to the passages and the response augmenters to the answer."""
    for step in _as_list(data.get("postprocess")):
        step = _as_dict(step)
        view.postprocess.append({
            "by": str(step.get("by", "")), "query": str(step.get("query") or ""),
            "in": _figure(step.get("in", "?")), "out": _figure(step.get("out", "?")),
            "reordered": bool(step.get("reordered")), "rescored": _figure(step.get("rescored") or ""),
            **{key: [hits.hit(i, None) for i in _as_list(step.get(key))] for key in ("dropped", "added", "order")},
        })
    for step in _as_list(data.get("response_augmenters")):
        step = _as_dict(step)
        view.augmenters.append({"by": str(step.get("by", "")), "did": answer_change_sentence(step),
                                "note": str(step.get("note") or "")})
    view.passages_changed = postprocess_summary(_as_list(data.get("postprocess")))
    view.answer_changed = augmenters_summary(_as_list(data.get("response_augmenters")))


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _changed_passages(step: dict) -> bool:
    return any(step.get(key) for key in ("dropped", "added", "reordered", "rescored")) or step.get("in") != step.get("out")


def postprocess_summary(steps: list) -> str:
    """What the post-processors did to the passages, for the trace's one line: "post-processing
    kept 4 of 7"; "" when none changed anything. Each chain (a search tool's own is tagged with
    its query) counts from its first post-processor's passages to its last's."""
    steps = [_as_dict(step) for step in steps]
    if not any(_changed_passages(step) for step in steps):
        return ""
    chains: dict[str, list[dict]] = {}
    for step in steps:
        chains.setdefault(str(step.get("query") or ""), []).append(step)
    came = [_count(chain[0].get("in")) for chain in chains.values()]
    left = [_count(chain[-1].get("out")) for chain in chains.values()]
    if None in came or None in left:  # a trace of another shape: say no number rather than a wrong one
        return "post-processing changed the passages"
    came_in, kept = sum(came), sum(left)
    if kept < came_in and not any(step.get("added") for step in steps):
        return f"post-processing kept {kept:,} of {came_in:,}"
    if kept != came_in:
        return f"post-processing: {came_in:,} → {kept:,} passages"
    for did in ("reordered", "rescored"):
        if any(step.get(did) for step in steps):
            return f"post-processing {did} the passages"
    return "post-processing changed the passages"


#: The most augmenters the one-line summary names; more are counted.
AUGMENTERS_NAMED = 2


def augmenters_summary(steps: list) -> str:
    """The response augmenters that changed the answer's text, for the trace's one line: "answer
    changed by references"; "" when none did. Citations alone do not count: the ``citations``
    augmenter sets them on every turn, so the line would say it every time."""
    names = [str(step.get("by") or "?") for step in map(_as_dict, steps) if "text" in _as_list(step.get("changed"))]
    if not names:
        return ""
    return "answer changed by " + (", ".join(names) if len(names) <= AUGMENTERS_NAMED else f"{len(names)} augmenters")


def _characters(count: Any) -> str:
    return f"{_figure(count)} character{'' if count == 1 else 's'}"


def text_change_sentence(text: dict) -> str:
    """A response augmenter's change of the text (``changes.text_change``) for a person:
    "added 42 characters at the end (120 -> 162 characters)"."""
    at, removed, inserted = text.get("at"), text.get("removed"), text.get("inserted")
    before, after = text.get("before"), text.get("after")
    if not all(isinstance(n, int) for n in (at, removed, inserted, before, after)):
        return "changed the text"
    if not removed:
        where = "at the end" if at == before else "at the start" if at == 0 else f"at character {at:,}"
        said = f"added {_characters(inserted)} {where}"
    elif not inserted:
        where = "from the end" if at + removed == before else f"at character {at:,}"
        said = f"removed {_characters(removed)} {where}"
    else:
        said = f"replaced {_characters(removed)} with {_characters(inserted)} at character {at:,}"
    return f"{said} ({before:,} → {after:,} characters)"


def answer_change_sentence(step: dict) -> str:
    """What one response augmenter did to the answer (a ``trace["response_augmenters"]`` entry),
    in words: "added 42 characters at the end (120 → 162 characters); citations changed"."""
    changed = [str(f) for f in _as_list(step.get("changed"))]
    parts = []
    text, streamed = _as_dict(step.get("text")), _as_dict(step.get("streamed"))
    if text:
        parts.append(text_change_sentence(text))
    if streamed.get("changed"):
        parts.append(f"changed the text as it streamed ({_figure(streamed.get('in'))} → "
                     f"{_figure(streamed.get('out'))} characters)")
    if streamed.get("tail"):
        parts.append(f"streamed {_characters(streamed['tail'])} after the model's last piece")
    if "text" in changed and not parts:
        parts.append("changed the text")
    parts += [f"{name} changed" for name in changed if name != "text"]
    return "; ".join(parts) or "no change"


def _read_timings(view: TraceView, data: dict) -> None:
    timings = {str(k): _number(v) for k, v in _as_dict(data.get("timings")).items()}
    view.total_ms = timings.pop("total", None)
    view.approval_wait_ms = _number(data.get("approval_wait_ms")) or None
    # In the pipeline's order: PostgreSQL's jsonb keeps keys by length, not as written ("llm",
    # "join", "memory"...); a stage a plugin adds follows the built-in ones, as recorded.
    order = {stage: i for i, stage in enumerate(STAGE_LABELS)}
    stages = sorted(((k, v) for k, v in timings.items() if v is not None), key=lambda kv: order.get(kv[0], len(order)))
    scale = view.total_ms or max((v for _, v in stages), default=0) or 1
    view.timings = [Timing(stage=k, ms=v, percent=min(100.0, round(100 * v / scale, 1)),
                           wait_ms=view.approval_wait_ms if k == "llm" else None) for k, v in stages]
    if view.timings:  # the slowest by its own time: waiting for the user is not the pipeline's
        max(view.timings, key=lambda t: t.own_ms).slowest = True


def _figure(value: Any) -> str:
    """An int with thousands separators; anything else as text."""
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def _rest(data: dict, said: tuple[str, ...]) -> list[str]:
    """What a sentence did not say, as "key: value" (a trace written by another version)."""
    return [f"{key}: {_figure(value)}" for key, value in data.items() if key not in said]


def prompt_sentence(prompt: dict) -> str:
    """A trace's ``prompt`` for a person: "1,210 tokens (budget 7,089); history 640 of its
    2,481; passages may fill 6,449 (the budget less the history); 1 passage dropped for the
    budget". ``context_budget`` is what the passages may fill, not what the prompt left unused:
    "6,449 left for the passages" after "1,210 tokens" read as the latter."""
    n = {key: _figure(value) for key, value in prompt.items()}
    parts = []
    if "tokens" in n or "budget" in n:
        parts.append(" ".join(filter(None, [f"{n['tokens']} tokens" if "tokens" in n else "",
                                            f"(budget {n['budget']})" if "budget" in n else ""])))
    if "history_tokens" in n:
        parts.append(f"history {n['history_tokens']}" + (f" of its {n['history_budget']}" if "history_budget" in n
                                                         else ""))
    if "context_budget" in n:
        parts.append(f"passages may fill {n['context_budget']} (the budget less the history)")
    if prompt.get("documents_dropped_for_budget"):
        dropped = prompt["documents_dropped_for_budget"]
        parts.append(f"{_figure(dropped)} passage{'s' if dropped != 1 else ''} dropped for the budget")
    said = ("tokens", "budget", "history_tokens", "history_budget", "context_budget", "documents_dropped_for_budget")
    return "; ".join(parts + _rest(prompt, said))


def history_sentence(history: dict) -> str:
    """A trace's ``history`` for a person: "4 earlier messages (#3 to #10)", and those a
    stateless client supplied."""
    parts = []
    count, seqs = history.get("messages"), history.get("seqs")
    if isinstance(count, int):
        span = (f" (#{seqs[0]}" + (f" to #{seqs[-1]})" if seqs[-1] != seqs[0] else ")")
                if isinstance(seqs, list) and seqs and count else "")
        parts.append(f"{count} earlier message{'s' if count != 1 else ''}{span}")
    if "supplied" in history:
        parts.append(f"{_figure(history['supplied'])} supplied by the client")
    return "; ".join(parts + _rest(history, ("messages", "seqs", "supplied")))


def supplied_guardrails_sentence(judged: dict) -> str:
    """A trace's ``supplied_guardrails`` for a person: "The input guardrails left out 1 of the 4
    supplied messages (refused by pii_guard: a card number) and redacted 1 (pii_guard: an email
    address)". Never the messages' text: the trace holds none."""
    if not judged:
        return ""

    def by_whom(entries: Any) -> str:
        named = [f"{e.get('by', '')}: {e.get('reason', '')}".strip(": ") for e in _as_list(entries)
                 if isinstance(e, dict)]
        return "; ".join(dict.fromkeys(filter(None, named)))

    sent, left_out = judged.get("sent"), judged.get("left_out") or 0
    redacted, refused = _as_list(judged.get("redacted")), by_whom(judged.get("refused"))
    parts = [f"left out {_figure(left_out)} of the {_figure(sent)} supplied messages"
             + (f" (refused by {refused})" if refused else "")] if left_out else []
    if redacted:
        parts.append(f"redacted {_figure(len(redacted))} ({by_whom(redacted)})")
    said = "The input guardrails " + " and ".join(parts) if parts else ""
    return "; ".join(filter(None, [said, *_rest(judged, ("sent", "left_out", "refused", "redacted"))]))


def _read_outcome(view: TraceView, data: dict) -> None:
    view.model = str(data.get("model") or "")
    view.usage = _as_dict(data.get("usage"))
    view.prompt = prompt_sentence(_as_dict(data.get("prompt")))
    view.history = history_sentence(_as_dict(data.get("history")))
    view.answerer = answerer_sentence(_as_dict(data.get("answerer")), passages={
        n: " — ".join(filter(None, [hit.title, short_heading(hit.heading, hit.title)]))
        for n, hit in enumerate(view.documents, start=1) if not (hit.hidden or hit.missing) and hit.title})
    ended_by = data.get("ended_by")
    view.ended_by = ended_by if isinstance(ended_by, dict) else ({"stage": str(ended_by)} if ended_by else {})
    warnings = data.get("warnings")
    view.warnings = [w if isinstance(w, str) else pretty_json(w)
                     for w in (warnings if isinstance(warnings, list) else [warnings] if warnings else [])]
    error = data.get("error")
    view.error = error if isinstance(error, dict) else ({"detail": str(error)} if error else {})
    view.cancelled = bool(data.get("cancelled"))
    components = data.get("components")
    view.components = [{key: str(row.get(key) or "") for key in ("stage", "name", "plugin")}
                       for row in (components if isinstance(components, list) else []) if isinstance(row, dict)]


def _read_request(view: TraceView, data: dict) -> None:
    view.origin = [(str(k), v if isinstance(v, (str, int, float)) else pretty_json(v))
                   for k, v in _as_dict(data.get("origin")).items()]
    view.supplied_history = [{"role": str(m.get("role") or ""), "content": str(m.get("content") or "")}
                             for m in _as_list(data.get("supplied_history")) if isinstance(m, dict)]
    view.supplied_guardrails = supplied_guardrails_sentence(_as_dict(data.get("supplied_guardrails")))


def _read_tools(view: TraceView, data: dict) -> None:
    view.tools_offered = [str(name) for name in _as_list(data.get("tools_offered"))]
    view.tool_step_limit_reached = bool(data.get("tool_step_limit_reached"))
    for entry in _as_list(data.get("tools")):
        entry = _as_dict(entry)
        view.tools.append(ToolCallView(
            step=entry.get("step"), name=str(entry.get("name", "")), status=str(entry.get("status", "")),
            arguments=_pretty(entry.get("arguments", "")), result=_pretty(entry.get("result", "")),
            ms=_number(entry.get("ms")), error=_as_dict(entry.get("error")),
            confirmation_id=entry.get("confirmation_id"), wait_ms=_number(entry.get("wait_ms")),
            short_circuited_by=str(entry.get("short_circuited_by") or ""), raised=str(entry.get("raised") or ""),
        ))


def build_trace_view(data: Any, chunks: dict[int, Chunk], sources=()) -> TraceView:
    """A ``TraceView`` of one trace dictionary.

    ``chunks`` maps chunk ids to loaded chunks (see ``load_chunks``); ``sources`` are the
    message's ``MessageSource`` rows, which say what the model saw and cited even when the
    chunk has since been replaced. Keys this function does not know (added by plugins or later
    versions) are listed under ``other``; values of an unexpected shape are shown raw, never an
    error.
    """
    data = _as_dict(data)
    view = TraceView(data=data)
    _read_queries(view, data)
    hits = _Hits(chunks, tuple(sources))
    _read_retrieval(view, data, hits)
    _read_changes(view, data, hits)
    _read_timings(view, data)
    _read_outcome(view, data)
    _read_request(view, data)
    _read_tools(view, data)
    view.other = [(str(k), pretty_json(v)) for k, v in data.items() if k not in KNOWN_TRACE_KEYS]
    return view


@dataclass
class Turn:
    """One message of a transcript with what the admin shows beside it."""

    message: Message
    sources: list[MessageSource]
    feedback: list[Feedback]
    trace: TraceView | None
    trace_id: int | None


def transcript(conversation: Conversation, page_number: Any = 1, per_page: int = TRANSCRIPT_PAGE_SIZE, *,
               viewer: Principals = UNRESTRICTED):
    """(page, turns) of ``conversation``'s messages in order: five queries whatever the page's size.

    The queries: the count, the page of messages with their traces, their sources (with their
    chunks' headings), their feedback (with the raters), the asker's principals (two), and the
    chunks the traces and sources mention that the asker and ``viewer`` may read now (the
    others show no passage and no heading).
    """
    messages = (Message.objects.filter(conversation=conversation).order_by("seq")
                .select_related("trace")
                .prefetch_related(
                    Prefetch("sources", queryset=MessageSource.objects.order_by("rank")
                             .select_related("chunk").defer("chunk__embedding", "chunk__metadata")),
                    Prefetch("feedback", queryset=Feedback.objects.select_related("user").order_by("created_at")),
                ))
    page = Paginator(messages, per_page).get_page(page_number)
    rows = list(page.object_list)
    traces = {}
    for message in rows:
        trace = getattr(message, "trace", None) if _has_trace(message) else None
        if trace is not None:
            traces[message.pk] = trace
    ids = set().union(*(trace_chunk_ids(_as_dict(t.data)) for t in traces.values()))
    ids |= {s.chunk_id for m in rows for s in m.sources.all() if s.chunk_id is not None}
    chunks = load_chunks(ids, principals_of_user_id(conversation.owner_id), viewer)
    turns = []
    for message in rows:
        sources = list(message.sources.all())
        for source in sources:  # what the template shows: a hidden chunk's name is not shown
            readable = source.chunk_id in chunks
            if source.chunk_id is None:  # gone since: its saved access says whether to name it
                source.hidden_reason = chunks.saved_hidden_reason(source.access)
            else:
                source.hidden_reason = "" if readable else chunks.hidden_reason(source.chunk_id)
            source.hidden = bool(source.hidden_reason)
            source.display_heading = short_heading(source.chunk.heading, source.title) if readable else ""
        trace = traces.get(message.pk)
        turns.append(Turn(
            message=message, sources=sources, feedback=list(message.feedback.all()),
            trace=build_trace_view(trace.data, chunks, sources) if trace else None,
            trace_id=trace.pk if trace else None,
        ))
    return page, turns


def _has_trace(message: Message) -> bool:
    try:
        message.trace  # noqa: B018 - loaded by select_related; raises when there is none
    except TurnTrace.DoesNotExist:
        return False
    return True


# --- One user's chat data -------------------------------------------------------------------


#: What a person calls one and several rows of each kind ``UserChatData.counts`` counts.
KINDS = {
    "conversations": ("conversation", "conversations"),
    "messages": ("message", "messages"),
    "sources": ("source", "sources"),
    "tool calls": ("tool call", "tool calls"),
    "traces": ("trace", "traces"),
    "memory records": ("memory record", "memory records"),
    "feedback": ("feedback rating", "feedback ratings"),
    "API keys": ("API key", "API keys"),
}


def counted(counts: dict[str, int]) -> str:
    """``UserChatData.counts`` for people: "1 conversation, 4 messages, 1 API key" (Django's
    ``ngettext``; it said "1 conversations"); kinds with none left out; "no chat data" for none."""
    said = [f"{n:,} {ngettext(*KINDS[kind], n)}" for kind, n in counts.items() if n]
    return ", ".join(said) or "no chat data"


class UserChatData:
    """Everything the chat stored about one user: counted, exported and erased together.

    What belongs to the user: their conversations and, through them, the messages, the
    messages' sources, tool calls and traces, the memory records of those conversations and the
    feedback anyone gave on those messages; plus memory records about the user, feedback the user
    gave elsewhere, and their API keys of the OpenAI-compatible endpoint (exported without their
    secret; erased, they stop working).

    What stays: the account, and the documents indexed for the user (``documents_for_user``):
    the site's data, not the chat's, which follows the rows it was indexed from.
    """

    def __init__(self, user):
        self.user = user

    def conversations(self):
        return Conversation.objects.filter(owner=self.user)

    def messages(self):
        return Message.objects.filter(conversation__owner=self.user)

    def sources(self):
        return MessageSource.objects.filter(message__conversation__owner=self.user)

    def traces(self):
        return TurnTrace.objects.filter(message__conversation__owner=self.user)

    def tool_calls(self):
        return ToolInvocation.objects.filter(message__conversation__owner=self.user)

    def memories(self):
        return MemoryRecord.objects.filter(Q(user=self.user) | Q(conversation__owner=self.user))

    def feedback(self):
        return Feedback.objects.filter(Q(user=self.user) | Q(message__conversation__owner=self.user))

    def api_keys(self):
        return ApiKey.objects.filter(user=self.user)

    def documents_for_user(self):
        """The documents (and so the chunks) given to this user by name, access ``user:<pk>``
        (docs/sources.md): a model source's index of the site's own rows (a booking, an order),
        or a file or upload ingested for them. Erasing leaves them: they are the site's data,
        and a model source's follow its rows (gone when the row is deleted or no longer theirs)."""
        return Document.objects.filter(access__visible_to=Principals(frozenset({f"user:{self.user.pk}"})))

    def documents_kept(self) -> dict[str, int]:
        """How many of ``documents_for_user`` each model source indexed, by its name, sorted; ``""``:
        files and uploads. One query."""
        rows = self.documents_for_user().order_by().values_list("origin").annotate(n=Count("pk"))
        return dict(sorted(rows))

    def counts(self) -> dict[str, int]:
        """How many rows of each kind would be erased (eight queries)."""
        return {
            "conversations": self.conversations().count(),
            "messages": self.messages().count(),
            "sources": self.sources().count(),
            "tool calls": self.tool_calls().count(),
            "traces": self.traces().count(),
            "memory records": self.memories().count(),
            "feedback": self.feedback().count(),
            "API keys": self.api_keys().count(),
        }

    def export(self) -> dict[str, Any]:
        """The user's chat data as a JSON-ready dictionary (eight queries)."""
        messages: dict[Any, list] = {}
        by_id = {}
        for row in self.messages().order_by("conversation_id", "seq").values(
                "id", "conversation_id", "seq", "role", "status", "content", "prompt_tokens",
                "completion_tokens", "metadata", "created_at"):
            row["sources"], row["tool_calls"], row["trace"] = [], [], None
            messages.setdefault(row["conversation_id"], []).append(row)
            by_id[row["id"]] = row
        for source in self.sources().order_by("message_id", "rank").values(
                "message_id", "rank", "score", "cited", "source", "title", "chunk_id"):
            by_id[source.pop("message_id")]["sources"].append(source)
        for call in self.tool_calls().order_by("message_id", "step", "index").values(
                "message_id", "step", "index", "call_id", "name", "arguments", "status", "content", "error",
                "requires_confirmation", "decided_at", "created_at"):
            by_id[call.pop("message_id")]["tool_calls"].append(call)
        for message_id, data in self.traces().values_list("message_id", "data"):
            by_id[message_id]["trace"] = data
        conversations = []
        for conversation in self.conversations().order_by("created_at").values(
                "id", "profile", "title", "metadata", "created_at", "updated_at"):
            conversation["messages"] = [
                {k: v for k, v in m.items() if k != "conversation_id"}
                for m in messages.get(conversation["id"], [])
            ]
            conversations.append(conversation)
        user = self.user
        return {
            "user": {"id": user.pk, "username": user.get_username()},
            "conversations": conversations,
            "memory": list(self.memories().order_by("created_at").values(
                "id", "kind", "content", "conversation_id", "covers_until_seq", "metadata",
                "created_at", "updated_at")),
            "feedback": [
                {**row, "given_by_this_user": row["user_id"] == user.pk}
                for row in self.feedback().order_by("created_at").values(
                    "id", "message_id", "user_id", "rating", "comment", "created_at", "updated_at")
            ],
            # The key itself is never stored; its prefix says which one it was.
            "api_keys": list(self.api_keys().order_by("created_at").values(
                "id", "name", "prefix", "created_at", "last_used_at", "expires_at", "revoked_at")),
        }

    def export_json(self) -> str:
        return json.dumps(self.export(), cls=DjangoJSONEncoder, ensure_ascii=False, indent=2)

    def erase(self) -> dict[str, int]:
        """Delete all of it in one transaction; returns what was there (as ``counts``)."""
        with transaction.atomic():
            counts = self.counts()
            self.feedback().delete()
            self.memories().delete()
            self.api_keys().delete()
            self.conversations().delete()  # cascades to messages, sources, tool calls and traces
        return counts
