"""Finding and redacting personal data in text, whole or arriving in pieces (no Django needed).

Three kinds, found by conservative patterns (they favour redacting a number that merely looks
like a phone number over letting a real one through):

* ``card``: 13 to 19 digits, optionally grouped by spaces or hyphens, passing the Luhn check;
* ``email``: ``local@domain.tld`` addresses;
* ``phone``: international numbers (``+`` and 8 to 15 digits) and national ones with an area
  code (9 to 12 digits, grouped like ``(555) 123-4567``, ``020 7946 0958``, or contiguous).
  Dates (``2024-05-01``, 8 digits) and thousands groupings (``100 000 000``, ``1.250.000``)
  are not phone numbers.

Where two kinds match overlapping text, the earlier kind in ``KINDS`` wins.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

KINDS = ("card", "email", "phone")
DEFAULT_PLACEHOLDER = "[redacted {kind}]"

_CARD_RE = re.compile(r"(?<![\w+])\d(?:[ -]?\d){12,18}(?!\w)")
_EMAIL_RE = re.compile(
    r"(?<![\w.%+-])[A-Za-z0-9._%+-]{1,64}@(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.){1,4}"
    r"[A-Za-z]{2,24}(?![\w-])"
)
_PHONE_RE = re.compile(
    r"""(?<![\w+])
    (?: \+\d{1,3}(?:[ .-]?\(\d{1,4}\))?(?:[ .-]?\d{1,5}){2,6}   # +44 20 7946 0958, +1 (555) 123 4567
      | \(\d{2,5}\)(?:[ .-]?\d{2,5}){2,4}                      # (555) 123-4567
      | \d{2,5}(?:[ .-]\d{2,5}){1,4}                           # 555-123-4567, 020 7946 0958
      | \d{10,12}                                              # 5551234567
    )(?!\w)""",
    re.VERBOSE,
)
_THOUSANDS_RE = re.compile(r"\d{1,3}(?:([ .,])\d{3})(?:\1\d{3})*")

# Every character a match of each kind can contain: the streaming redactor holds back a tail
# made of these, since more text could still turn it into a match.
_NUMBER_CHARS = frozenset("0123456789 ()+.-")
_NUMBER_STARTS = frozenset("0123456789(+")
_EMAIL_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._%+-@")
# Longer than any match of the patterns above (an e-mail address is at most 64 + 1 + 4 * 64
# characters here), so a held tail is never cut inside a match.
MAX_HOLD = 384


def luhn_valid(number: str) -> bool:
    """Whether the digits of ``number`` (13 to 19 of them) pass the Luhn checksum."""
    digits = [int(c) for c in number if c.isdigit()]
    if not 13 <= len(digits) <= 19:
        return False
    total = 0
    for position, digit in enumerate(reversed(digits)):
        if position % 2:
            digit *= 2
            if digit > 9:
                digit -= 9
        total += digit
    return total % 10 == 0


def _is_phone(candidate: str) -> bool:
    digits = sum(c.isdigit() for c in candidate)
    if candidate.startswith("+"):
        return 8 <= digits <= 15
    return 9 <= digits <= 12 and not _THOUSANDS_RE.fullmatch(candidate)


_PATTERNS = {
    "card": (_CARD_RE, luhn_valid),
    "email": (_EMAIL_RE, None),
    "phone": (_PHONE_RE, _is_phone),
}


@dataclass(frozen=True)
class Finding:
    """One piece of personal data: its kind and where it is (``text[start:end]``)."""

    kind: str
    start: int
    end: int


def check_kinds(kinds: Iterable[str], option: str) -> tuple[str, ...]:
    """``kinds`` as a tuple in ``KINDS`` order; ``ValueError`` naming ``option`` if one is unknown."""
    if isinstance(kinds, str):
        raise ValueError(f"{option} must be a list of kinds, not the string {kinds!r}.")
    kinds = tuple(kinds)
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise ValueError(f"{option} has unknown kind(s) {unknown}; the kinds are {list(KINDS)}.")
    return tuple(k for k in KINDS if k in kinds)


def find_pii(text: str, kinds: Iterable[str] = KINDS, *, pos: int = 0, allow: Iterable[str] = ()) -> list[Finding]:
    """Personal data in ``text`` from index ``pos`` on, in order, without overlaps.

    Characters before ``pos`` are still seen as context (a match never starts inside a word).
    Findings whose text, lower-cased, is in ``allow`` are left out.
    """
    allowed = {a.lower() for a in allow}
    taken: list[Finding] = []
    for kind in KINDS:
        if kind not in kinds:
            continue
        pattern, valid = _PATTERNS[kind]
        for match in pattern.finditer(text, pos):
            start, end = match.span()
            if valid is not None and not valid(match.group()):
                continue
            if any(f.start < end and start < f.end for f in taken):
                continue
            taken.append(Finding(kind, start, end))
    return sorted((f for f in taken if text[f.start:f.end].lower() not in allowed), key=lambda f: f.start)


def replace_findings(text: str, findings: list[Finding], placeholder: str = DEFAULT_PLACEHOLDER,
                     *, start: int = 0, end: int | None = None) -> str:
    """``text[start:end]`` with each finding inside that span replaced by ``placeholder``."""
    end = len(text) if end is None else end
    parts, cursor = [], start
    for finding in findings:
        if finding.start >= cursor and finding.end <= end:
            parts += [text[cursor:finding.start], placeholder.format(kind=finding.kind)]
            cursor = finding.end
    parts.append(text[cursor:end])
    return "".join(parts)


def redact(text: str, kinds: Iterable[str] = KINDS, *, placeholder: str = DEFAULT_PLACEHOLDER,
           allow: Iterable[str] = ()) -> tuple[str, Counter]:
    """``text`` with personal data of ``kinds`` replaced, and how many of each kind were."""
    findings = find_pii(text, kinds, allow=allow)
    return replace_findings(text, findings, placeholder), Counter(f.kind for f in findings)


class StreamRedactor:
    """Redacts text arriving in pieces, so that no piece gives away part of a match.

    ``feed(piece)`` returns what can be sent now: everything except a tail that more text
    could still turn into (or extend) a match, i.e. the trailing run of characters a match can
    contain (at most ``MAX_HOLD`` of them; in ordinary prose a word or a number at the end of
    the piece). ``flush()`` returns the rest when the text is complete. The pieces returned,
    joined, equal ``redact(whole text)``. Work per piece is linear in the piece plus the
    held tail; nothing waits for more input.
    """

    _CONTEXT = 8  # characters kept before the held tail, for the patterns' look-behind

    def __init__(self, kinds: Iterable[str] = KINDS, *, placeholder: str = DEFAULT_PLACEHOLDER,
                 allow: Iterable[str] = ()):
        self.kinds = tuple(kinds)
        self.placeholder = placeholder
        self.allow = tuple(allow)
        self.counts: Counter = Counter()
        self._context = ""
        self._pending = ""
        self._runs = []
        if "email" in self.kinds:
            self._runs.append((_EMAIL_CHARS, _EMAIL_CHARS))
        if {"card", "phone"} & set(self.kinds):
            self._runs.append((_NUMBER_CHARS, _NUMBER_STARTS))

    @property
    def held(self) -> str:
        """The text received but not yet returned."""
        return self._pending

    def _hold_from(self, buffer: str, floor: int) -> int:
        """Where the tail that could still become a match begins (never more than MAX_HOLD back)."""
        lowest = max(floor, len(buffer) - MAX_HOLD)
        hold = len(buffer)
        for chars, starts in self._runs:
            start = len(buffer)
            while start > lowest and buffer[start - 1] in chars:
                start -= 1
            while start < len(buffer) and buffer[start] not in starts:
                start += 1
            hold = min(hold, start)
        return hold

    def _emit(self, buffer: str, floor: int, hold: int, findings: list[Finding]) -> str:
        emitted = [f for f in findings if f.end <= hold]
        self.counts.update(f.kind for f in emitted)
        out = replace_findings(buffer, emitted, self.placeholder, start=floor, end=hold)
        self._context = buffer[max(0, hold - self._CONTEXT):hold]
        self._pending = buffer[hold:]
        return out

    def feed(self, piece: str) -> str:
        buffer = self._context + self._pending + piece
        floor = len(self._context)
        findings = find_pii(buffer, self.kinds, pos=floor, allow=self.allow)
        hold = self._hold_from(buffer, floor)
        for finding in findings:  # never cut through a complete match
            if finding.start < hold < finding.end:
                hold = finding.start
        return self._emit(buffer, floor, hold, findings)

    def flush(self) -> str:
        buffer = self._context + self._pending
        floor = len(self._context)
        return self._emit(buffer, floor, len(buffer), find_pii(buffer, self.kinds, pos=floor, allow=self.allow))
