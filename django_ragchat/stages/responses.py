"""Response augmenters: work on the answer after the model.

``augment(answer, turn)`` handles a whole answer. For a streamed answer ``on_delta(text,
turn)`` sees each piece as it passes (it runs on the event loop and must not block; return the
text to send, possibly changed), ``finish(turn)`` runs after the model's last piece and may
return text to stream after it (a footer, a sources line: it reaches the client as ``delta``
events like the model's own text), and ``on_complete(answer, turn)`` sees the assembled answer,
tails included.

Built in:

- ``citations`` (on by default): the answer builder (``django_ragchat.stages.answers.build_answer``)
  applied to the model's reply: it resolves references such as ``[1]``, ``[1, 2]`` and ``[1-3]``
  to the prompt's documents (1-based, as Haystack's AnswerBuilder), in prompt order; out-of-range
  and ``[0]`` references are skipped and reported in the trace's warnings. Its options (per
  profile) are the builder's: ``reference_pattern``, ``pattern``, ``extract_xml_tags``,
  ``return_only_referenced``.
- ``sources_filter`` (off unless a profile lists it): keeps as the message's sources only the
  prompt documents whose embedding is similar enough to the answer, and can append them as a
  "(Sources: a.md, b.md)" line, streamed as the answer's last piece.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

import numpy as np

from django_ragchat import hookimpl
from django_ragchat.components import Component
from django_ragchat.plugins import get_registry
from django_ragchat.stages.answers import (
    DEFAULT_REFERENCES,
    TagStreamFilter,
    build_answer,
    compile_answer_pattern,
    compile_reference_pattern,
    validate_xml_tags,
)
from django_ragchat.stages.embedders import HashingEmbedder
from django_ragchat.types import Answer, Citation, RetrievedChunk

if TYPE_CHECKING:
    from django_ragchat.turn.context import TurnContext

# Model output kept in the trace is capped: the trace is for reading, not an archive.
MAX_TRACE_TEXT = 20_000


class ResponseAugmenter(Component):
    """Base class; every method defaults to passing the answer through unchanged."""

    kind = "response_augmenter"

    def augment(self, answer: Answer, turn: TurnContext) -> Answer:
        return answer

    def on_delta(self, text: str, turn: TurnContext) -> str:
        return text

    def finish(self, turn: TurnContext) -> str:
        """Text to stream after the model's last piece ("" for none).

        Called once per streamed answer, in augmenter order, before ``on_complete``. The text
        passes through the ``on_delta`` of the augmenters after this one and is sent as
        ``delta`` events, so clients render it like the model's text; it is part of the saved
        answer. A whole (non-streamed) answer has no tail: ``augment`` changes its text.
        May be ``async def``.
        """
        return ""

    def on_complete(self, answer: Answer, turn: TurnContext) -> Answer:
        """The assembled streamed answer (tails included). By default ``augment``, applied as
        to a whole answer: the tail this augmenter streamed (``finish``) is taken out of the
        text first, since ``augment`` adds its own; when ``augment`` adds the very text that was
        streamed (or leaves the text alone), the text stays as the client received it. So an augmenter written as
        ``finish`` (streamed) plus ``augment`` (whole) adds its line once either way."""
        raw, sent = turn.streamed_tails.get(self.name, ("", ""))
        at = answer.text.rfind(sent) if sent else -1
        if at < 0:
            return self.augment(answer, turn)
        whole = answer.replace(text=answer.text[:at] + answer.text[at + len(sent):])
        result = self.augment(whole, turn)
        if inspect.isawaitable(result):
            return _as_streamed(result, answer, whole.text, raw)
        return _keep_streamed(result, answer, whole.text, raw)


def _keep_streamed(result: Answer, streamed: Answer, whole: str, tail: str) -> Answer:
    # augment() added what finish() streamed, or left the text alone: the text stays as the
    # client received it (the tail where the stream put it, as the later augmenters passed it).
    return result.replace(text=streamed.text) if result.text in (whole, whole + tail) else result


async def _as_streamed(result, streamed: Answer, whole: str, tail: str) -> Answer:
    return _keep_streamed(await result, streamed, whole, tail)


def _trace_warning(turn: TurnContext, message: str) -> None:
    # The answer builder has logged it already; only the trace still needs it.
    turn.trace.setdefault("warnings", []).append(message)


class CitationParser(ResponseAugmenter):
    """Builds the answer and its citations with ``django_ragchat.stages.answers.build_answer``.

    Options (``PROFILES[name]["options"]["citations"]``):

    - ``reference_pattern`` (default ``"default"``: ``[1]``, ``[1, 2]``, ``[1-3]``): ``"acm"``, a
      regular expression with at most one capture group, or ``None`` (every document cited);
    - ``pattern``: a regular expression extracting the answer from the reply (at most one group);
    - ``extract_xml_tags``: e.g. ``["answer"]``: the answer is those tags' content, the rest of
      the reply goes to the trace (``answer_builder.discarded``) and its references do not count;
    - ``return_only_referenced`` (default ``False``): ``True`` keeps only the cited documents as
      the message's sources; by default every prompt document is a source, flagged ``cited``.

    An invalid pattern is a ``ValueError`` when the component is built, so ``manage.py check``
    reports it (ragchat.E002) before any turn runs.
    """

    name = "citations"
    order = 100

    def __init__(self, profile, *, reference_pattern: str | None = DEFAULT_REFERENCES, pattern: str | None = None,
                 extract_xml_tags: list[str] | None = None, return_only_referenced: bool = False,
                 **options: Any):
        super().__init__(profile, **options)
        compile_reference_pattern(reference_pattern)
        compile_answer_pattern(pattern)
        self.extract_xml_tags = list(validate_xml_tags(extract_xml_tags)) or None
        if not isinstance(return_only_referenced, bool):
            raise ValueError(f"return_only_referenced must be true or false, not {return_only_referenced!r}")
        self.reference_pattern = reference_pattern
        self.pattern = pattern
        self.return_only_referenced = return_only_referenced

    def augment(self, answer, turn):
        documents = turn.prompt.documents if turn.prompt else ()
        built = build_answer(answer.text, documents, pattern=self.pattern,
                             reference_pattern=self.reference_pattern,
                             extract_xml_tags=self.extract_xml_tags, return_only_referenced=False)
        for message in built.warnings:
            _trace_warning(turn, message)
        if built.discarded or built.tags:
            turn.trace["answer_builder"] = {
                "discarded": built.discarded[:MAX_TRACE_TEXT],
                "tags": sorted(built.tags),
            }
        referenced = built.referenced
        changes: dict[str, Any] = {
            "text": built.text,
            # Prompt order, the order the REST API lists cited sources in.
            "citations": tuple(Citation(index=d.index, chunk_id=d.document.chunk_id) for d in referenced),
        }
        if self.return_only_referenced:
            changes["sources"] = tuple(d.document for d in referenced)
        return answer.replace(**changes)

    # Streamed, with extract_xml_tags: only the tags' content streams (a model's <thinking>
    # never reaches the client); the answer is built from the whole raw reply at the end.

    def on_delta(self, text, turn):
        if not self.extract_xml_tags:
            return text
        stream = turn.state.setdefault(self.name, {}).setdefault("tags", TagStreamFilter(self.extract_xml_tags))
        return stream.feed(text)

    def finish(self, turn):
        stream = turn.state.get(self.name, {}).get("tags")
        return stream.close() if stream is not None else ""

    def on_complete(self, answer, turn):
        stream = turn.state.get(self.name, {}).pop("tags", None)
        if stream is not None:
            # Build from what the model said, not from the filtered pieces. What follows the
            # filtered text (tails of later augmenters) stays after it: outside the tags, it is
            # discarded from the answer, and an augmenter that wants its tail kept (the sources
            # filter) adds it back in its own on_complete.
            rest = answer.text[len(stream.emitted):] if answer.text.startswith(stream.emitted) else ""
            answer = answer.replace(text=stream.raw + rest)
        return self.augment(answer, turn)


def cosine_similarities(vector: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """Cosine similarity of ``vector`` to each row of ``matrix`` (0 where a norm is 0)."""
    norms = np.linalg.norm(matrix, axis=1) * float(np.linalg.norm(vector))
    dots = matrix @ vector
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(norms > 0, dots / np.where(norms > 0, norms, 1.0), 0.0)


class SourcesFilter(ResponseAugmenter):
    """Keeps as the message's sources the documents similar to the final answer.

    For each prompt document (in retrieval order) it computes the cosine similarity, in the
    profile's embedding space, between the document's text and the answer, keeps those at or
    above ``threshold`` (default 0.85), one per document (the first chunk of each), and stores
    them as the message's sources. Documents the answer cites are kept too unless
    ``keep_cited=False`` (a citation must resolve to a stored source). With ``append=True`` the
    kept documents' names are added to the answer as ``template`` (default
    ``" (Sources: {sources})"``); on a streamed answer that line is streamed as the last piece.

    Off unless a profile lists it after ``citations``::

        "response_augmenters": ["citations", "sources_filter"],
        "options": {"sources_filter": {"threshold": 0.8, "append": True}}

    The similarities are only meaningful with a semantic embedder: ``check`` warns
    (ragchat.W040) when the profile uses the offline hashing embedder.
    """

    name = "sources_filter"
    order = 200
    enabled_by_default = False

    def __init__(self, profile, *, threshold: float = 0.85, append: bool = False,
                 template: str = " (Sources: {sources})", keep_cited: bool = True, **options: Any):
        super().__init__(profile, **options)
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not -1 <= threshold <= 1:
            raise ValueError(f"sources_filter threshold must be a number between -1 and 1, not {threshold!r}")
        if not isinstance(template, str) or "{sources}" not in template:
            raise ValueError(f"sources_filter template must contain {{sources}}, not {template!r}")
        self.threshold = float(threshold)
        self.append = bool(append)
        self.template = template
        self.keep_cited = bool(keep_cited)

    def check_warnings(self) -> list[str]:
        """Problems ``manage.py check`` reports as warnings (ragchat.W040)."""

        embedder = get_registry().get("embedder", self.profile.embedder).cls
        if issubclass(embedder, HashingEmbedder):
            return [f"the sources filter compares answers and documents in the embedding space of the "
                    f"{self.profile.embedder!r} embedder, which measures shared words, not meaning: "
                    f"similarities to a written answer rarely reach the threshold ({self.threshold}), "
                    f"so most answers would keep no sources."]
        return []

    async def select(self, text: str, turn: TurnContext, documents) -> list[RetrievedChunk]:
        """The documents similar enough to ``text``, one per document, in their order.

        The similarities go to the trace (``sources_filter``), so a threshold can be tuned
        from real turns.
        """
        similar: list[RetrievedChunk] = []
        scores: list[float] = []
        if documents and text.strip():
            vectors = await turn.embed([text] + [d.text for d in documents])
            scores = [float(s) for s in cosine_similarities(vectors[0].astype(np.float64),
                                                             vectors[1:].astype(np.float64))]
            seen_documents = set()
            for doc, score in zip(documents, scores):
                if score >= self.threshold and doc.document_id not in seen_documents:
                    similar.append(doc)
                    seen_documents.add(doc.document_id)
        turn.trace["sources_filter"] = {
            "threshold": self.threshold,
            "similarities": [{"chunk_id": d.chunk_id, "similarity": round(s, 4)} for d, s in zip(documents, scores)],
            "kept": [d.chunk_id for d in similar],
        }
        return similar

    def _documents(self, answer: Answer, turn: TurnContext) -> tuple[RetrievedChunk, ...]:
        if answer.sources is not None:  # an earlier augmenter chose the sources already
            return tuple(answer.sources)
        return turn.prompt.documents if turn.prompt else ()

    def _sources(self, similar, answer: Answer, turn: TurnContext) -> tuple[RetrievedChunk, ...]:
        """The similar documents plus (``keep_cited``) the cited ones, in prompt order."""
        keep = {d.chunk_id for d in similar}
        if self.keep_cited:
            keep |= {c.chunk_id for c in answer.citations}
        return tuple(d for d in self._documents(answer, turn) if d.chunk_id in keep)

    @staticmethod
    def _name(doc: RetrievedChunk) -> str:
        # Document names are data (an uploaded file's name): one line, no control characters,
        # bounded, so a name cannot add lines or markup of its own to the answer.
        name = " ".join("".join(c if c.isprintable() else " " for c in (doc.source or doc.title)).split())
        return name[:200]

    def tail(self, similar) -> str:
        """The text appended to the answer ("" unless ``append`` and something was kept)."""
        names = [n for n in dict.fromkeys(self._name(d) for d in similar) if n]
        return self.template.format(sources=", ".join(names)) if names and self.append else ""

    async def augment(self, answer, turn):
        similar = await self.select(answer.text, turn, self._documents(answer, turn))
        return answer.replace(text=answer.text + self.tail(similar),
                              sources=self._sources(similar, answer, turn))

    # Streamed: the pieces are collected as they pass; the selection runs after the model's
    # last piece (``finish``) so that the sources line is streamed like the model's text, and
    # ``on_complete`` stores the result once the citations are known.

    def on_delta(self, text, turn):
        turn.state.setdefault(self.name, {}).setdefault("parts", []).append(text)
        return text

    async def finish(self, turn):
        state = turn.state.setdefault(self.name, {})
        documents = turn.prompt.documents if turn.prompt else ()
        text = "".join(state.get("parts", []))
        # Compare with the answer the user will get, not the raw stream: if the profile's
        # citations augmenter extracts the answer (XML tags, a pattern), do the same here.
        for augmenter in turn.components.response_augmenters:
            if isinstance(augmenter, CitationParser) and (augmenter.pattern or augmenter.extract_xml_tags):
                text = build_answer(text, pattern=augmenter.pattern,
                                    extract_xml_tags=augmenter.extract_xml_tags).text
        state["similar"] = similar = await self.select(text, turn, documents)
        state["tail"] = tail = self.tail(similar)
        return tail

    async def on_complete(self, answer, turn):
        state = turn.state.get(self.name, {})
        if "similar" not in state:  # a pipeline that never called finish: work on the whole answer
            return await self.augment(answer, turn)
        text = answer.text
        tail = state.get("tail", "")
        if tail and not text.endswith(tail):
            # An earlier augmenter rebuilt the text (citations extracting an <answer> tag) and
            # dropped the streamed line: the saved answer keeps what the client was shown last.
            text += tail
        return answer.replace(text=text, sources=self._sources(state["similar"], answer, turn))


@hookimpl
def register_response_augmenters(register):
    register(CitationParser)
    register(SourcesFilter)
