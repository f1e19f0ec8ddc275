"""The answer builder: from the model's raw reply to the answer text and the documents it used.

``build_answer`` is a pure function (no database, no turn, no settings): the built-in
``citations`` response augmenter is a thin wrapper around it, and a plugin or a test can call it
directly. Its rules, in the order they apply:

1. ``extract_xml_tags``: when given (e.g. ``["answer"]``), the answer is the content of those tags
   (a model that reasons inside ``<thinking>`` and answers inside ``<answer>``); the rest of the
   reply is returned as ``discarded`` (the pipeline keeps it in the trace, never shows it). If
   none of the tags is present the whole reply is the answer and a warning says so.
2. ``pattern``: a regular expression that extracts the answer from what is left; with one
   capture group the group's text, without one the whole match; no match gives an empty answer.
   More than one capture group is a ``ValueError``.
3. ``reference_pattern``: references are parsed from the *final* answer text only, so a
   reference inside discarded text does not count. References are 1-based indices into
   ``documents`` (the prompt's order). ``None`` means no parsing: every document counts as
   referenced. ``"default"`` is the built-in parser (``[1]``, ``[1, 2]``, ``[1-3]``), ``"acm"`` is
   ``\\[(?:\\d+,?\\s*)+\\]``; any other string is a regular expression whose capture group (or
   whole match, without one) holds the number(s). Python's ``re`` keeps only the last capture
   of a group inside a repetition, so to take every number of ``[1, 2]`` write the repetition
   without a capture group, as ``"acm"`` does: every integer of the whole match is taken. A
   reference out of range (``0`` included) is ignored with a logged warning, returned in ``warnings``; it is never an error.

Documents come back in prompt order, each wrapped with its 1-based index and whether it was
referenced; the input objects are never changed. ``return_only_referenced=False`` returns all of
them with the flag set.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

#: The named reference patterns (shortcuts) ``reference_pattern`` accepts.
REFERENCE_SHORTCUTS = {
    "acm": r"\[(?:\d+,?\s*)+\]",
}
#: ``reference_pattern="default"``: the built-in ``[1]``, ``[1, 2]``, ``[1-3]`` parser.
DEFAULT_REFERENCES = "default"

_INTEGER = re.compile(r"\d+")


@dataclass(frozen=True)
class AnswerDocument:
    """One input document as the answer used it: its 1-based prompt ``index``, the untouched
    input object (``document``) and whether the answer ``referenced`` it."""

    index: int
    document: Any
    referenced: bool


@dataclass(frozen=True)
class BuiltAnswer:
    """What ``build_answer`` returns.

    ``text`` is the answer to show; ``documents`` the documents in prompt order (only the
    referenced ones unless ``return_only_referenced=False``); ``tags`` maps each tag of
    ``extract_xml_tags`` found in the reply to its contents (in order of appearance);
    ``discarded`` is the reply's text that is not part of the answer; ``invalid_references`` the
    out-of-range indices that were ignored; ``warnings`` says in words what was ignored.
    """

    text: str
    documents: tuple[AnswerDocument, ...] = ()
    tags: dict[str, list[str]] = field(default_factory=dict)
    discarded: str = ""
    invalid_references: tuple[int, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def referenced(self) -> tuple[AnswerDocument, ...]:
        """The referenced documents, in prompt order."""
        return tuple(d for d in self.documents if d.referenced)


def compile_answer_pattern(pattern: str | None) -> re.Pattern | None:
    """Compile an answer-extraction pattern; ``ValueError`` if invalid or with >1 capture group."""
    if pattern is None:
        return None
    try:
        compiled = re.compile(pattern, re.DOTALL)
    except re.error as exc:
        raise ValueError(f"pattern {pattern!r} is not a valid regular expression: {exc}") from None
    if compiled.groups > 1:
        raise ValueError(
            f"pattern {pattern!r} has {compiled.groups} capture groups; it may have at most one "
            f"(use (?:...) for grouping that should not capture)."
        )
    return compiled


def compile_reference_pattern(reference_pattern: str | None) -> re.Pattern | str | None:
    """Resolve shortcuts and compile; ``ValueError`` if invalid or with >1 capture group.

    Returns ``None`` (no parsing), ``DEFAULT_REFERENCES`` or a compiled pattern.
    """
    if reference_pattern is None or reference_pattern == DEFAULT_REFERENCES:
        return reference_pattern
    if not isinstance(reference_pattern, str):
        raise ValueError(f"reference_pattern must be a string or None, not {type(reference_pattern).__name__}")
    source = REFERENCE_SHORTCUTS.get(reference_pattern, reference_pattern)
    try:
        compiled = re.compile(source)
    except re.error as exc:
        raise ValueError(f"reference_pattern {reference_pattern!r} is not a valid regular expression: {exc}") from None
    if compiled.groups > 1:
        raise ValueError(f"reference_pattern {reference_pattern!r} has {compiled.groups} capture groups; "
                         f"it may have at most one.")
    return compiled


def validate_xml_tags(tags: Sequence[str] | None) -> tuple[str, ...]:
    """The tag names as a tuple; ``ValueError`` for anything that is not a plain tag name."""
    if tags is None:
        return ()
    if isinstance(tags, str) or not all(isinstance(t, str) and re.fullmatch(r"[A-Za-z_][\w.-]*", t) for t in tags):
        raise ValueError(f"extract_xml_tags must be a list of tag names such as ['answer'], not {tags!r}")
    return tuple(tags)


def _parse_with_pattern(text: str, pattern: re.Pattern) -> list[int]:
    found: list[int] = []
    for match in pattern.finditer(text):
        part = (match.group(1) or "") if pattern.groups == 1 else match.group(0)
        found.extend(int(n) for n in _INTEGER.findall(part))
    return found


REFERENCE_RE = re.compile(r"\[(\d+(?:\s*(?:,|-|–)\s*\d+)*)\]")
MAX_RANGE = 50  # a "range" [1-9999] is a typo, not 9999 references


def parse_default_references(text: str) -> tuple[list[int], list[int]]:
    """The built-in parser: ``[1]``, ``[1, 2]``, ``[1-3]``.

    Returns every referenced index in order of first appearance, and the ends of malformed
    ranges (backwards, or longer than ``MAX_RANGE``), which are skipped.
    """
    found: list[int] = []
    bad: list[int] = []
    for match in REFERENCE_RE.finditer(text):
        for part in re.split(r"\s*,\s*", match.group(1)):
            if re.search(r"[-–]", part):
                start, end = (int(x) for x in re.split(r"\s*[-–]\s*", part))
                if start > end or end - start > MAX_RANGE:
                    bad.extend([start, end])
                    continue
                numbers = range(start, end + 1)
            else:
                numbers = [int(part)]
            for n in numbers:
                if n not in found:
                    found.append(n)
    return found, bad


def find_references(text: str, reference_pattern: re.Pattern | str = DEFAULT_REFERENCES) -> tuple[list[int], list[str]]:
    """Referenced indices in order of first appearance, and warnings about malformed references."""
    if reference_pattern == DEFAULT_REFERENCES:
        indices, bad = parse_default_references(text)
        warnings = [f"Ignored a malformed citation range ending at {n}." for n in bad]
        return indices, warnings
    return list(dict.fromkeys(_parse_with_pattern(text, reference_pattern))), []


@functools.lru_cache(maxsize=64)
def _tag_regex(tags: tuple[str, ...]) -> re.Pattern:
    names = "|".join(re.escape(t) for t in tags)
    return re.compile(rf"<({names})(?:\s[^>]*)?>(.*?)(?:</\1\s*>|\Z)", re.DOTALL | re.IGNORECASE)


def extract_tags(reply: str, tags: Sequence[str]) -> tuple[dict[str, list[str]], str, str]:
    """(contents by tag, the answer, the discarded rest) for ``extract_xml_tags``.

    An unclosed tag runs to the end of the reply (a stream cut short keeps what it said).
    """
    tag_re = _tag_regex(tuple(tags))
    found: dict[str, list[str]] = {}
    kept: list[str] = []
    rest: list[str] = []
    position = 0
    for match in tag_re.finditer(reply):
        rest.append(reply[position:match.start()])
        position = match.end()
        canonical = next(t for t in tags if t.lower() == match.group(1).lower())
        content = match.group(2).strip()
        found.setdefault(canonical, []).append(content)
        kept.append(content)
    rest.append(reply[position:])
    return found, "\n\n".join(kept), "".join(rest).strip()


def _extract(text: str, discarded: str, answer_re: re.Pattern) -> tuple[str, str]:
    """(the answer ``answer_re`` extracts from ``text``, what is discarded with what it leaves)."""
    match = answer_re.search(text)
    extracted = "" if match is None else (match.group(1) if answer_re.groups == 1 else match.group(0)) or ""
    outside = (text[:match.start()] + text[match.end():]) if match else text
    return extracted.strip(), "\n\n".join(p for p in (discarded, outside.strip()) if p)


def _referenced(text: str, count: int, references_re, warnings: list[str]) -> tuple[set[int], list[int]]:
    """(the indices of the ``count`` documents ``text`` references, the out-of-range ones);
    what was ignored is appended to ``warnings``."""
    if references_re is None:
        return set(range(1, count + 1)), []
    invalid: list[int] = []
    indices, parse_warnings = find_references(text, references_re)
    warnings.extend(parse_warnings)
    referenced = set()
    for n in indices:
        if 1 <= n <= count:
            referenced.add(n)
        elif n not in invalid:
            invalid.append(n)
            warnings.append(f"The answer cites [{n}], but the prompt had {count} document(s).")
    return referenced, invalid


def build_answer(
    reply: str,
    documents: Sequence[Any] = (),
    *,
    pattern: str | None = None,
    reference_pattern: str | None = None,
    extract_xml_tags: Sequence[str] | None = None,
    return_only_referenced: bool = True,
) -> BuiltAnswer:
    """Build the answer from the model's ``reply`` and the ``documents`` of its prompt.

    See the module docstring for the rules. Raises ``ValueError`` only for invalid arguments
    (a pattern that does not compile or has more than one capture group, bad tag names); never
    because of what the model wrote.
    """
    answer_re = compile_answer_pattern(pattern)
    references_re = compile_reference_pattern(reference_pattern)
    tags = validate_xml_tags(extract_xml_tags)
    if not isinstance(reply, str):
        raise ValueError(f"reply must be a string, not {type(reply).__name__}")

    warnings: list[str] = []
    text, discarded, found_tags = reply, "", {}
    if tags:
        found_tags, extracted, rest = extract_tags(reply, tags)
        if found_tags:
            text, discarded = extracted, rest
        else:
            warnings.append(f"The reply has none of the tags {list(tags)}; the whole reply is the answer.")
    if answer_re is not None:
        text, discarded = _extract(text, discarded, answer_re)
    referenced, invalid = _referenced(text, len(documents), references_re, warnings)
    for message in warnings:
        logger.warning("ragchat answer builder: %s", message)

    wrapped = tuple(
        AnswerDocument(index=i, document=doc, referenced=i in referenced)
        for i, doc in enumerate(documents, start=1)
        if i in referenced or not return_only_referenced
    )
    return BuiltAnswer(text=text, documents=wrapped, tags=found_tags, discarded=discarded,
                       invalid_references=tuple(invalid), warnings=tuple(warnings))


class TagStreamFilter:
    """Streams only the content of ``tags`` from a reply that arrives in pieces.

    The streamed counterpart of ``extract_xml_tags``: a model's ``<thinking>`` must not reach
    the client while it streams. ``feed(piece)`` returns the text to send now; ``close()`` the
    rest at the end. Text outside the tags is held back; a possible partial tag at the end of a
    piece (``"<ans"``) waits for the next piece. If the reply turns out to have none of the tags,
    ``close()`` returns everything held (the whole reply is then the answer, as in
    ``build_answer``). ``raw`` is everything fed, for building the final answer.
    """

    def __init__(self, tags: Sequence[str]):
        self.tags = validate_xml_tags(tags)
        names = "|".join(re.escape(t) for t in self.tags)
        self._open = re.compile(rf"<({names})(?:\s[^>]*)?>", re.IGNORECASE)
        self._longest = max(len(t) for t in self.tags) + 3  # "</" + name + ">" without attributes
        self._buffer = ""
        self._inside: str | None = None
        self._held: list[str] = []
        self.seen = False
        self.raw_parts: list[str] = []
        self.emitted = ""  # everything feed() and close() returned

    @property
    def raw(self) -> str:
        return "".join(self.raw_parts)

    @staticmethod
    def _partial_at_end(text: str, limit: int) -> int:
        """Where a possibly incomplete tag starts at the end of ``text`` (``len(text)`` if none)."""
        start = text.rfind("<", max(0, len(text) - limit - 64))
        if start == -1 or ">" in text[start:]:
            return len(text)
        return start

    def feed(self, piece: str) -> str:
        self.raw_parts.append(piece)
        text = self._buffer + piece
        out: list[str] = []
        while True:
            if self._inside is None:
                match = self._open.search(text)
                if match:
                    self._held.append(text[:match.start()])
                    if self.seen:
                        out.append("\n\n")  # as build_answer joins several tags' contents
                    self._inside, self.seen = match.group(1), True
                    text = text[match.end():]
                    continue
                cut = self._partial_at_end(text, self._longest)
                self._held.append(text[:cut])
                text = text[cut:]
                break
            close = re.search(rf"</{re.escape(self._inside)}\s*>", text, re.IGNORECASE)
            if close:
                out.append(text[:close.start()])
                self._inside = None
                text = text[close.end():]
                continue
            cut = self._partial_at_end(text, self._longest)
            out.append(text[:cut])
            text = text[cut:]
            break
        self._buffer = text
        result = "".join(out)
        self.emitted += result
        return result

    def close(self) -> str:
        rest, self._buffer = self._buffer, ""
        if not self.seen:
            result = "".join(self._held) + rest
        else:
            result = rest if self._inside is not None else ""
        self.emitted += result
        return result
