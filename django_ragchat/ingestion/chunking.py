"""Split loaded documents into retrieval-sized, heading-aware text chunks.

Rules (see :func:`chunk_document`):

* A chunk never spans two sections, so every chunk has exactly one heading
  path. Empty sections produce no chunks; sections are never merged.
* A section body longer than ``max_chars`` is split at the strongest
  boundary available: paragraph (blank line), then sentence end, then line
  break, then whitespace. A word is cut only if it alone exceeds
  ``max_chars``.
* Consecutive chunks of one section overlap: the next chunk repeats up to
  ``overlap_chars`` characters of whole sentences (or, failing that, whole
  words) from the end of the previous one, so a fact straddling a boundary
  is still retrievable in one piece.
* ``TextChunk.text`` starts with the heading path joined by ``" > "`` on its
  own line (when the path is not empty), so heading words are both embedded
  and keyword-searchable. ``max_chars`` limits the body only; the heading
  line comes on top.

Output depends only on the input: no randomness, no environment lookups.
This module has no Django dependency.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass, field

from django_ragchat.ingestion.loaders import LoadedDocument
from django_ragchat.text import HEADING_SEPARATOR

__all__ = [
    "DEFAULT_MAX_CHARS",
    "DEFAULT_OVERLAP_CHARS",
    "TextChunk",
    "chunk_document",
    "format_heading",
    "split_text",
]

DEFAULT_MAX_CHARS = 1200
DEFAULT_OVERLAP_CHARS = 200


@dataclass
class TextChunk:
    """One piece of a document, ready to embed and store.

    ``text`` is what gets embedded and searched: ``heading + "\\n" + body``,
    or just ``body`` when the chunk has no heading path. ``heading`` is the
    heading path joined with :data:`HEADING_SEPARATOR` (``""`` if none);
    ``body`` is the section text alone, handy for display. ``char_count`` is
    ``len(text)``. ``ordinal`` numbers the chunks of a document 0..n-1 in
    document order.
    """

    ordinal: int
    text: str
    heading_path: tuple[str, ...]
    heading: str = ""
    body: str = ""
    char_count: int = field(init=False)

    def __post_init__(self) -> None:
        self.char_count = len(self.text)


def format_heading(heading_path: tuple[str, ...]) -> str:
    """Join a heading path for display and for the first line of a chunk."""
    return HEADING_SEPARATOR.join(heading_path)


def chunk_document(
    doc: LoadedDocument,
    *,
    max_chars: int = DEFAULT_MAX_CHARS,
    overlap_chars: int = DEFAULT_OVERLAP_CHARS,
) -> list[TextChunk]:
    """Split ``doc`` into :class:`TextChunk` objects, section by section.

    Each chunk body is at most ``max_chars`` characters; ``text`` may be
    longer by the heading line. Raises ``ValueError`` unless
    ``0 <= overlap_chars < max_chars``.
    """
    _validate(max_chars, overlap_chars)
    chunks: list[TextChunk] = []
    for section in doc.sections:
        heading = format_heading(section.heading_path)
        for body in split_text(section.text, max_chars=max_chars, overlap_chars=overlap_chars):
            text = f"{heading}\n{body}" if heading else body
            chunks.append(
                TextChunk(
                    ordinal=len(chunks),
                    text=text,
                    heading_path=section.heading_path,
                    heading=heading,
                    body=body,
                )
            )
    return chunks


def split_text(
    text: str,
    *,
    max_chars: int = DEFAULT_MAX_CHARS,
    overlap_chars: int = DEFAULT_OVERLAP_CHARS,
) -> list[str]:
    """Split one section's text into overlapping pieces of at most
    ``max_chars`` characters, following the rules in the module docstring.

    Returns ``[]`` for blank text. Raises ``ValueError`` unless
    ``0 <= overlap_chars < max_chars``.
    """
    _validate(max_chars, overlap_chars)
    text = _clean(text)
    if not text:
        return []
    if len(text) <= max_chars:
        return [text]
    return _Splitter(text, max_chars, overlap_chars).split()


def _validate(max_chars: int, overlap_chars: int) -> None:
    if max_chars < 1:
        raise ValueError(f"max_chars must be positive, got {max_chars}")
    if overlap_chars < 0:
        raise ValueError(f"overlap_chars must not be negative, got {overlap_chars}")
    if overlap_chars >= max_chars:
        raise ValueError(
            f"overlap_chars ({overlap_chars}) must be smaller than max_chars ({max_chars})"
        )


_BLANK_LINES_RE = re.compile(r"\n{3,}")


def _clean(text: str) -> str:
    # Same normalisation as the loaders, repeated because sections can also
    # be built by hand: a blank line must reliably mean "paragraph break".
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    lines = [line.rstrip() for line in text.split("\n")]
    return _BLANK_LINES_RE.sub("\n\n", "\n".join(lines)).strip()


# Strength of the boundary after a token; higher is a better place to cut.
# A sentence end outranks a bare line break because plain-text files are
# often hard-wrapped mid-sentence, while a line break still beats a space
# (code and unpunctuated list items).
_CUT = -1  # inside a word that had to be cut: never start an overlap here
_WORD = 0
_LINE = 1
_SENTENCE = 2
_PARAGRAPH = 3

_TOKEN_RE = re.compile(r"\S+")
_SENTENCE_END_RE = re.compile(r"[.!?\u2026][\"'\u201d\u2019)\]]*$")
# "e.g." / "i.e." end in a period but rarely end a sentence.
_ABBREVIATION_RE = re.compile(r"^\(?(?:[A-Za-z]\.){2,}$")


class _Splitter:
    """Greedy splitter over whitespace-delimited tokens of one text.

    Chunks are slices ``text[start_of_token_a:end_of_token_k]``, so they keep
    the original spacing and newlines, and overlaps are exact repeats.
    """

    def __init__(self, text: str, max_chars: int, overlap_chars: int) -> None:
        self.text = text
        self.max_chars = max_chars
        self.overlap_chars = overlap_chars
        starts: list[int] = []
        ends: list[int] = []
        strengths: list[int] = []
        for match in _TOKEN_RE.finditer(text):
            start, end = match.span()
            # A "word" longer than a chunk (a URL, a base64 blob) is cut into
            # max_chars pieces; the only case where a word is split.
            while end - start > max_chars:
                starts.append(start)
                ends.append(start + max_chars)
                strengths.append(_CUT)
                start += max_chars
            starts.append(start)
            ends.append(end)
            strengths.append(_WORD)  # provisional, fixed below
        for i in range(len(starts) - 1):
            if strengths[i] == _CUT:
                continue
            gap = text[ends[i] : starts[i + 1]]
            token = text[starts[i] : ends[i]]
            if "\n\n" in gap:
                strengths[i] = _PARAGRAPH
            elif _SENTENCE_END_RE.search(token) and not _ABBREVIATION_RE.match(token):
                strengths[i] = _SENTENCE
            elif "\n" in gap:
                strengths[i] = _LINE
        self.starts = starts
        self.ends = ends
        self.strengths = strengths

    def split(self) -> list[str]:
        starts, ends = self.starts, self.ends
        last = len(starts) - 1
        pieces: list[str] = []
        first = 0  # first token of the current chunk (overlap included)
        new = 0  # first token not already in the previous chunk
        while True:
            # Shrink the overlap if it leaves no room for the next new token
            # (which always fits on its own after the cutting in __init__).
            while first < new and ends[new] - starts[first] > self.max_chars:
                first += 1
            end_token = self._choose_end(first, new)
            pieces.append(self.text[starts[first] : ends[end_token]])
            if end_token == last:
                return pieces
            next_new = end_token + 1
            first = self._overlap_start(new, end_token)
            new = next_new

    def _choose_end(self, first: int, new: int) -> int:
        """Index of the last token of the chunk starting at ``first``."""
        starts, ends, strengths = self.starts, self.ends, self.strengths
        limit = starts[first] + self.max_chars
        furthest = bisect_right(ends, limit) - 1
        if furthest == len(starts) - 1:
            return furthest
        # Only cut where the chunk holds at least half of the room left after
        # the overlap; otherwise a paragraph break near the start would yield
        # a tiny chunk. Among those, take the strongest boundary, the latest
        # one on ties (fuller chunks, fewer of them).
        room = self.max_chars - (starts[new] - starts[first])
        threshold = starts[new] + room / 2
        best = furthest
        best_strength = None
        for k in range(new, furthest + 1):
            if ends[k] < threshold:
                continue
            if best_strength is None or strengths[k] >= best_strength:
                best, best_strength = k, strengths[k]
        return best

    def _overlap_start(self, lo: int, end_token: int) -> int:
        """First token of the overlap carried from a chunk ending at
        ``end_token`` into the next one, or ``end_token + 1`` for none.

        ``lo`` (the first token that was new in that chunk) bounds the search
        so an overlap never repeats text that was itself overlap.
        """
        if self.overlap_chars == 0:
            return end_token + 1
        starts, ends, strengths = self.starts, self.ends, self.strengths
        end = ends[end_token]
        sentence_start = word_start = None
        for j in range(end_token, lo - 1, -1):
            if end - starts[j] > self.overlap_chars:
                break
            before = strengths[j - 1] if j > 0 else _PARAGRAPH
            if before >= _SENTENCE:
                sentence_start = j
            if before >= _WORD:
                word_start = j
        # Whole sentences read better, but if they give much less than the
        # requested overlap, whole words are the better trade.
        if sentence_start is not None and end - starts[sentence_start] >= self.overlap_chars / 2:
            return sentence_start
        if word_start is not None:
            return word_start
        return end_token + 1
