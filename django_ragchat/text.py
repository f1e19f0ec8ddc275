"""Small text utilities shared by the offline components (embedder, follow-up transformer,
extractive answerer): tokenising, stop words (data: ``lang/<code>/stopwords.txt``), sentence
splitting. Deliberately simple and
language-light: they serve the embedded defaults, not a linguistics pipeline."""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

from django_ragchat.language import DEFAULT_LANGUAGE, load_language

_WORD_RE = re.compile(r"[^\W_]+(?:['’\-][^\W_]+)*", re.UNICODE)
# Sentence ends: . ! ? followed by space and an upper-case letter, digit or quote; or newlines.
_SENTENCE_RE = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z0-9])|\n{2,}|\n(?=\s*[-*•]\s)")

#: How a chunk's heading path is stored in one string ("Aurora X2 > Pricing").
HEADING_SEPARATOR = " > "

#: The default language's stop words (``lang/en/stopwords.txt``): what the offline embedder and
#: the corpus's subject names leave out.
STOPWORDS = load_language(DEFAULT_LANGUAGE).stopwords


def shorten(text: str, limit: int) -> str:
    """``text`` on one line, cut at the last word boundary within ``limit`` characters (mid-word
    only for a word longer than half of it), with "…" when cut. Plain text: escape it to show it."""
    text = " ".join((text or "").split())
    if len(text) <= limit:
        return text
    cut = text[:limit + 1]  # a space just past the limit: the last word is whole
    space = cut.rfind(" ")
    cut = cut[:space] if space > limit // 2 else cut[:limit]
    return cut.rstrip(" ,;:.") + "…"


#: How long a conversation's label made from a question is (the widget's titles, the API's
#: ``label``, the admin's list, the OpenAI endpoint's titles).
QUESTION_LABEL_CHARS = 80


def question_label(question: str) -> str:
    """A conversation's name made from its first question: shortened at a word boundary."""
    return shorten(question, QUESTION_LABEL_CHARS)


# Letters that render as nothing (Hangul fillers, the Braille blank): not whitespace to Python.
_BLANK_LETTERS = frozenset("\u115f\u1160\u3164\uffa0\u2800")


def is_blank(text: str) -> bool:
    """True when ``text`` shows nothing: only whitespace, control and format characters (the
    zero-width space and joiners, the byte-order mark, the soft hyphen) or blank letters."""
    for char in text:
        if char.isspace() or char in _BLANK_LETTERS:
            continue
        if unicodedata.category(char) not in ("Cc", "Cf"):
            return False
    return True


def normalize(text: str) -> str:
    """Lower-case, accent-folded text (so "Café" and "cafe" meet)."""
    text = unicodedata.normalize("NFKD", text.lower())
    return "".join(c for c in text if not unicodedata.combining(c))


def words(text: str) -> list[str]:
    """Normalised word tokens, in order."""
    return _WORD_RE.findall(normalize(text))


@lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """A light suffix stripper, so that price/prices/pricing/priced and battery/batteries meet.

    Not a linguistic stemmer (its output is not always a word); it only has to map a word's
    common inflections to one key, deterministically.
    """
    if len(word) <= 3 or not word.isalpha():
        return word
    if word.endswith("ies") and len(word) > 4:
        word = word[:-3] + "y"
    elif word.endswith(("sses", "xes", "zes", "ches", "shes")):
        word = word[:-2]
    elif word.endswith("s") and not word.endswith(("ss", "us", "is")):
        word = word[:-1]
    for suffix in ("ing", "ed"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)]
            break
    if word.endswith("e") and len(word) > 3:
        word = word[:-1]
    return word


def content_terms(text: str) -> list[str]:
    """Stemmed words minus stop words and one-letter tokens, in order (with repeats)."""
    return [stem(w) for w in words(text) if w not in STOPWORDS and (len(w) > 1 or w.isdigit())]


def sentences(text: str) -> list[str]:
    """Split text into sentences (and list items / paragraphs), stripped, non-empty."""
    parts = _SENTENCE_RE.split(text)
    return [" ".join(p.split()) for p in parts if p and p.strip()]
