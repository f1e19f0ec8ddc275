"""Small text utilities shared by the offline components (embedder, follow-up transformer,
extractive answerer): tokenising, stop words, sentence splitting. Deliberately simple and
language-light: they serve the embedded defaults, not a linguistics pipeline."""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

_WORD_RE = re.compile(r"[^\W_]+(?:['’\-][^\W_]+)*", re.UNICODE)
# Sentence ends: . ! ? followed by space and an upper-case letter, digit or quote; or newlines.
_SENTENCE_RE = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z0-9])|\n{2,}|\n(?=\s*[-*•]\s)")

STOPWORDS = frozenset(
    """
    a about above after again against all also am an and any are aren't as at be because been
    before being below between both but by can can't cannot could couldn't did didn't do does
    doesn't doing don't down during each else even ever every few for from further get gets got
    had hadn't has hasn't have haven't having he he'd he'll he's her here here's hers herself him
    himself his how how's however i i'd i'll i'm i've if in into is isn't it it's its itself just
    let's like made make many may me might more most much must mustn't my myself no nor not now
    of off on once only or other ought our ours ourselves out over own per please same shall
    shan't she she'd she'll she's should shouldn't since so some such tell than that that's the
    their theirs them themselves then there there's these they they'd they'll they're they've
    this those though through thus to too under until up upon us use used using very via was
    wasn't we we'd we'll we're we've well were weren't what what's when when's where where's
    whether which while who who's whom whose why why's will with within without won't would
    wouldn't yes yet you you'd you'll you're you've your yours yourself yourselves
    one two also know want need tell give say said
    """.split()
)


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
