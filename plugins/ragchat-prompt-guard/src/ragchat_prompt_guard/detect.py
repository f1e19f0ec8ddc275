"""Prompt-injection detection: weighted patterns and a few heuristics, no model, no Django.

``assess(text)`` returns an ``Assessment``: a score (the sum of the weights of the signals
found, each signal counted once) and the signals' names. A message scoring at or above the
threshold (``DEFAULT_THRESHOLD``, 1.0) is treated as an injection attempt: one strong signal
is enough, weak ones (a mention of "system prompt", a "user:" role marker) need company.

The text is normalised first so that the usual disguises do not hide the words: Unicode
compatibility forms (NFKC: fullwidth letters), format characters (zero-width spaces) removed,
case folded, whitespace collapsed. Letter-spaced words ("i g n o r e", "i.g.n.o.r.e") and a
base64 blob that decodes to text are also scanned, each adding a heuristic signal of its own.

The patterns target instructions aimed at the assistant (override its rules, reveal its
prompt, change its role, fake a system turn, exfiltrate through a link), not topics: "How do
I ignore a file in git?" or "What is a system prompt?" stay below the threshold. The labelled
set in ``data/labelled.jsonl`` and ``scripts/evaluate.py`` measure how well that holds.
"""

from __future__ import annotations

import base64
import binascii
import re
import unicodedata
from dataclasses import dataclass, field

DEFAULT_THRESHOLD = 1.0
# Longer input is scanned in its first and last parts only: injections sit at either end, and
# the regular expressions stay linear in a bounded length.
MAX_SCAN_CHARS = 20_000

_VERB_OVERRIDE = r"(?:ignore|disregard|forget|skip|override|bypass|drop|abandon)"
_DETERMINER = r"(?:previous|prior|above|earlier|preceding|initial|original|all|any|your|the|system|existing|these|those)"
_NOUN_RULES = (r"(?:instructions?|rules|prompts?|directions|guidance|guidelines|directives|"
               r"programming|polic(?:y|ies)|restrictions|system\s+message)")
_REVEAL = r"(?:reveal|show|print|repeat|output|display|leak|dump|list|share|tell\s+me|give\s+me|what\s+is|what's|what\s+are|write\s+out)\w*"
_SECRET_ADJ = r"(?:own|hidden|secret|internal|initial|original|system|full|exact|confidential)"
_SECRET_NOUN = r"(?:prompt|instructions|rules|guidelines|configuration|directives|system\s+message|context\s+window)"


@dataclass(frozen=True)
class Signal:
    """One named pattern with its weight (1.0 is enough on its own at the default threshold)."""

    name: str
    weight: float
    pattern: re.Pattern


def _signal(name: str, weight: float, pattern: str, flags: int = 0) -> Signal:
    return Signal(name, weight, re.compile(pattern, flags))


SIGNALS: tuple[Signal, ...] = (
    # Override the assistant's instructions.
    _signal("override_instructions", 1.0,
            rf"\b{_VERB_OVERRIDE}\b[^.?!\n]{{0,40}}?\b{_DETERMINER}\b[^.?!\n]{{0,30}}?\b{_NOUN_RULES}\b"),
    _signal("override_everything", 1.0,
            r"\b(?:ignore|disregard|forget)\s+(?:about\s+)?(?:everything|all|anything)\s+"
            r"(?:above|before|prior|previous|earlier|you\s+(?:were|have\s+been)\s+told)"),
    _signal("disregard_above", 1.0, r"\b(?:ignore|disregard|forget)\s+(?:the\s+|all\s+)?(?:above|preceding)\b"),
    # Reveal the prompt or the context.
    _signal("reveal_prompt", 1.0,
            rf"\b{_REVEAL}\b[^.?!\n]{{0,40}}?\b(?:your|its|the\s+assistant's)\s+(?:{_SECRET_ADJ}\s+){{0,3}}{_SECRET_NOUN}\b"),
    _signal("reveal_hidden", 1.0,
            rf"\b{_REVEAL}\b[^.?!\n]{{0,40}}?\bthe\s+(?:(?:hidden|secret|internal|initial|original|system|confidential)\s+){{1,3}}"
            rf"(?:prompt|instructions|message|configuration|rules)\b"),
    _signal("repeat_text_above", 1.0, r"\b(?:repeat|print|output|copy)\b[^.?!\n]{0,20}\b(?:text|words|everything|all)\s+above\b"),
    _signal("dump_context", 1.0,
            r"\b(?:contents?|everything)\s+(?:of|in)\s+your\s+(?:context|memory|prompt|instructions)"
            r"|\b(?:list|print|show|output|dump)\b[^.?!\n]{0,20}\b(?:every|all)\s+(?:the\s+)?(?:documents?|files|passages)\b"
            r"[^.?!\n]{0,30}\b(?:access|given)\b"),
    _signal("documents_given", 0.75, r"\b(?:documents|passages|context)\s+you\s+(?:were|have\s+been)\s+given\b"),
    # Change the assistant's role or lift its limits.
    _signal("role_hijack", 1.0,
            r"\byou\s+are\s+(?:now\s+)?(?:an?\s+|in\s+|the\s+)?(?:dan|unrestricted|unfiltered|jailbroken|evil|uncensored|"
            r"developer|debug|maintenance|god)\b(?!\s+(?:question|here))"
            r"|\b(?:act|behave|respond)\s+as\s+(?:an?\s+)?(?:unrestricted|unfiltered|uncensored|jailbroken|evil)\b"),
    _signal("do_anything_now", 1.0, r"\bdo\s+anything\s+now\b"),
    _signal("enable_mode", 1.0, r"\b(?:enable|activate|enter|switch\s+to)\b[^.?!\n]{0,20}\b(?:developer|debug|god|maintenance|jailbreak)\s+mode\b"),
    _signal("special_mode", 0.5, r"\b(?:developer|debug|god|maintenance)\s+mode\b"),
    _signal("no_restrictions", 1.0,
            r"\b(?:pretend|imagine|assume)\b[^.?!\n]{0,30}\bno\s+(?:rules|restrictions|limits|guidelines|filters)\b"
            r"|\bwith(?:out)?\s+(?:no|any)\s+(?:rules|restrictions|guidelines|content\s+polic(?:y|ies)|filters)\b"),
    _signal("bypass_safety", 1.0,
            r"\bbypass\b[^.?!\n]{0,20}\b(?:safety|filters?|restrictions|guardrails|rules|content\s+policy)\b"
            r"|\b(?:safety|content)\s+(?:protocols?|filters?|polic(?:y|ies))\s+(?:are\s+)?(?:disabled|off|removed)\b"),
    _signal("unfiltered_ai", 1.0, r"\b(?:unfiltered|unrestricted|uncensored|jailbroken|evil)\s+(?:ai|model|assistant|mode|version|llm)\b"),
    _signal("jailbreak_word", 0.5, r"\bjailbreak"),
    _signal("pwned", 1.0, r"\bpwn(?:ed)?\b"),
    _signal("stop_being", 0.5, r"\bstop\s+being\s+(?:an?\s+)?(?:assistant|helpful|an?\s+ai)\b"),
    _signal("assistant_must_now", 0.75, r"\bthe\s+(?:assistant|ai|model)\s+(?:must|should|will)\s+now\b"),
    # Fake turns and markup of chat templates.
    _signal("chat_template_tokens", 1.0, r"<\|im_(?:start|end)\|>|\[/?inst\]|<</?sys>>|<\|(?:system|user|assistant)\|>"),
    _signal("fake_tags", 1.0, r"</?(?:system|context|instructions?|prompt)>"),
    _signal("system_prompt_markers", 1.0, r"\b(?:begin|end|start)\s+(?:of\s+)?(?:the\s+)?system\s+prompt\b"),
    _signal("system_role_line", 0.75, r"(?:^|\n)\s*system\s*:"),
    _signal("heading_instruction", 0.75, r"#{2,}\s*(?:system|instructions?)\b"),
    _signal("other_role_line", 0.25, r"(?:^|[\n.!?]\s*)(?:assistant|user)\s*:"),
    _signal("new_instructions", 0.75, r"\bnew\s+(?:instructions|rules|policy|task|system\s+prompt)\s*:|\boverride\s*:"),
    _signal("mentions_system_prompt", 0.5, r"\bsystem\s+(?:prompt|message)\b"),
    # Exfiltration through a link the client would load.
    _signal("exfiltration_link", 1.0, r"!\[[^\]]*\]\(\s*https?://[^)\s]*\?[^)]*\)"),
)

_FORMAT_CHARS = re.compile(r"[\u200b-\u200f\u2060-\u2064\ufeff\u00ad]")
# Runs of single letters separated by one space, dot, dash, underscore or asterisk.
_SPACED_RUN = re.compile(r"(?<![a-z])(?:[a-z][ .\-_*]){3,}[a-z](?![a-z])")
_BASE64_BLOB = re.compile(r"[A-Za-z0-9+/]{24,}={0,2}")


@dataclass(frozen=True)
class Assessment:
    """The outcome for one message: ``score`` and the names of the ``signals`` found."""

    score: float
    signals: tuple[str, ...] = ()
    details: dict[str, str] = field(default_factory=dict, compare=False)

    def is_injection(self, threshold: float = DEFAULT_THRESHOLD) -> bool:
        return self.score >= threshold


def _fold(text: str) -> str:
    return _FORMAT_CHARS.sub("", unicodedata.normalize("NFKC", text)).casefold()


def _collapse(text: str) -> str:
    text = re.sub(r"[^\S\n]+", " ", text)
    return re.sub(r"\n\s*", "\n", text).strip()


def normalize(text: str) -> str:
    """NFKC, format characters removed, case folded, whitespace collapsed (newlines kept)."""
    return _collapse(_fold(text))


def despace(text: str) -> str:
    """Letter-spaced runs joined, before whitespace is collapsed (a double space separates
    words): "i g n o r e  p r e v i o u s" -> "ignore previous"."""
    return _collapse(_SPACED_RUN.sub(lambda m: re.sub(r"[ .\-_*]", "", m.group(0)), _fold(text)))


def decoded_blobs(text: str) -> list[str]:
    """The text of each base64 blob in ``text`` that decodes to mostly printable UTF-8."""
    found = []
    for blob in _BASE64_BLOB.findall(text)[:5]:
        try:
            raw = base64.b64decode(blob + "=" * (-len(blob) % 4), validate=True)
            decoded = raw.decode("utf-8")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            continue
        if decoded and sum(c.isprintable() or c.isspace() for c in decoded) / len(decoded) > 0.95:
            found.append(decoded)
    return found


def _scan(text: str, found: dict[str, str]) -> None:
    for signal in SIGNALS:
        if signal.name not in found:
            match = signal.pattern.search(text)
            if match:
                found[signal.name] = match.group(0)[:80]


def assess(text: str) -> Assessment:
    """Score ``text`` (see the module docstring). Never raises for any string."""
    if not isinstance(text, str) or not text:
        return Assessment(0.0)
    if len(text) > MAX_SCAN_CHARS:
        half = MAX_SCAN_CHARS // 2
        text = text[:half] + "\n" + text[-half:]
    found: dict[str, str] = {}
    normal = normalize(text)
    _scan(normal, found)
    # The DAN persona is spelt in capitals; in lower case "dan" is a name.
    if re.search(r"\bDAN\b", text):
        found.setdefault("role_hijack", "DAN")
    if _FORMAT_CHARS.search(text):
        found["hidden_characters"] = "zero-width or soft-hyphen characters"
    before = set(found)
    joined = despace(text)
    if joined != normal:
        _scan(joined, found)
        if set(found) - before:
            found["letter_spacing"] = "letter-spaced words hide a pattern"
    before = set(found)
    for decoded in decoded_blobs(text):
        _scan(normalize(decoded), found)
    if set(found) - before:
        found["encoded_payload"] = "a base64 blob hides a pattern"
    weights = {s.name: s.weight for s in SIGNALS}
    weights.update(hidden_characters=0.5, letter_spacing=0.5, encoded_payload=0.5)
    score = round(sum(weights[name] for name in found), 3)
    return Assessment(score=score, signals=tuple(sorted(found)), details=found)
