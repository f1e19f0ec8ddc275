"""The retrieved chunks as the answerer reads them: passages of scorable sentences, each passage
with its heading and the subject it is about."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from django_ragchat.answerer.vocabulary import Vocabulary, fold, stem, stems, words
from django_ragchat.search.subjects import kind_of
from django_ragchat.text import HEADING_SEPARATOR, normalize, sentences
from django_ragchat.types import RetrievedChunk

_CITE_BEFORE_STOP = re.compile(r"([.!?])$")
_MARKUP_CHARS = set('{}[]"=<>|`\\')
_NAME_TOKEN_RE = re.compile(r"[^\W_]+(?:['’\-][^\W_]+)*")
_LETTER_RE = re.compile(r"[^\W\d_]")
# How far into a text names are looked for: long passages add cost, not names.
_MAX_SCAN_CHARS = 4000


def is_prose(sentence: str) -> bool:
    """False for code, JSON, tables and markup: quoting them is never a readable answer."""
    markup = sum(map(sentence.count, _MARKUP_CHARS))  # str.count runs in C, per character it doesn't
    letters = len(_LETTER_RE.findall(sentence))
    return markup / len(sentence) < 0.03 and letters / len(sentence) > 0.5


def cite(sentence: str, index: int) -> str:
    """``sentence`` with `` [index]`` before its final stop (the format the citations augmenter reads)."""
    if _CITE_BEFORE_STOP.search(sentence):
        return _CITE_BEFORE_STOP.sub(rf" [{index}]\1", sentence)
    return f"{sentence} [{index}]"


@dataclass(frozen=True)
class Sentence:
    """One scorable sentence of a passage, with what scoring needs precomputed."""

    text: str
    position: int
    stems: frozenset[str]
    has_currency: bool
    has_number: bool
    names: tuple[str, ...]  # capitalised name runs it contains, folded ("aurora x2")
    sequence: tuple[frozenset[str], ...] = ()  # the stems at each word position, for proximity
    has_money: bool = False  # an amount of money ("$699", "free"), not only a share ("50%")
    # The stems of its words outside its name runs: "your card", "books" (so a question's "card"
    # or "book" is a common word here, not a name of the Adult Card or a Book Bundle).
    loose: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Passage:
    """A retrieved chunk as the answerer sees it: its sentences, heading and subject."""

    index: int  # 1-based, as cited
    ordinal: int  # the chunk's place in its document: 0 is where a document describes its subject
    heading_leaf: str
    heading_stems: frozenset[str]
    subject_name: str  # display form of what the passage is about ("Aurora X2"), may be ""
    subject: tuple[str, ...]  # its folded tokens
    sentences: tuple[Sentence, ...]
    mentions_the: bool  # "the Aurora X2" appears: decline text uses the article
    kind: str = ""  # what its text defines the subject as ("tablet"), see subjects.kind_of


def _sentence_start(text: str, position: int) -> bool:
    before = position - 1
    while before >= 0 and text[before].isspace():
        before -= 1
    return before < 0 or text[before] in ".?!:\n-*•#>"


def name_sequences(text: str, stopwords: frozenset[str]) -> list[tuple[str, str]]:
    """(display, folded) capitalised name runs in ``text``: "Aurora X2", "Nimbus Pen", "Zappa".

    A run is capitalised words (and model codes like X2 right after one); a run of a single
    word counts only inside a sentence, since any sentence starts with a capital.
    """
    found = []
    run: list[re.Match] = []

    def close():
        while run and fold(run[0].group(0)) in stopwords:
            run.pop(0)
        if run and (len(run) > 1 or not _sentence_start(text, run[0].start())):
            found.append((text[run[0].start():run[-1].end()], " ".join(fold(m.group(0)) for m in run)))
        run.clear()

    for m in _NAME_TOKEN_RE.finditer(text[:_MAX_SCAN_CHARS]):
        token = m.group(0)
        adjacent = bool(run) and text[run[-1].end():m.start()].strip() == ""
        capital = token[:1].isupper() and any(c.islower() for c in token[1:]) if len(token) > 1 else False
        code = bool(run) and adjacent and any(c.isdigit() for c in token) and token[:1].isupper()
        if (capital or code) and (not run or adjacent):
            run.append(m)
        else:
            close()
            if capital:
                run.append(m)
    close()
    return found


def _outside_names(sentence: str, names: tuple[str, ...]) -> frozenset[str]:
    """The stems of ``sentence``'s words that stand outside its name runs ``names``."""
    rest = fold(sentence)
    for name in names:
        rest = re.sub(rf"\b{re.escape(name)}\b", " ", rest)
    return frozenset(stem(w) for w in words(rest))


def _scorable(body: str, vocabulary: Vocabulary) -> tuple[Sentence, ...]:
    money, share, number = vocabulary.pattern("money"), vocabulary.pattern("share"), vocabulary.pattern("number")
    found = []
    for position, sentence in enumerate(sentences(body)):
        sentence = sentence.lstrip("-*• ").strip()
        if len(sentence) < 12 or not is_prose(sentence):
            continue
        has_money = bool(money.search(sentence))
        names = tuple(dict.fromkeys(folded for _, folded in name_sequences(sentence, vocabulary.stopwords)))
        found.append(Sentence(
            text=sentence, position=position,
            stems=stems(sentence, pairs=True),
            has_currency=has_money or bool(share.search(sentence)),
            has_number=bool(number.search(sentence)),
            names=names,
            sequence=tuple(stems(word) for word in words(sentence)),
            has_money=has_money, loose=_outside_names(sentence, names),
        ))
    return tuple(found)


@lru_cache(maxsize=4096)
def _analyse_text(text: str, heading: str, title: str,
                  vocabulary: Vocabulary) -> tuple[str, tuple[Sentence, ...], str, bool, str]:
    """Split a chunk into scorable sentences (cached: a chunk's text does not change)."""
    body = text
    if heading and body.startswith(heading):
        body = body[len(heading):]  # the heading line is a label, not a sentence
    found = _scorable(body, vocabulary)
    parts = [p.strip() for p in heading.split(HEADING_SEPARATOR)] if heading else []
    top = parts[0] if parts else title
    subject = next((display for display, _ in name_sequences(top or "", vocabulary.stopwords)), "")
    if not subject and title:
        subject = next((d for d, _ in name_sequences(title, vocabulary.stopwords)), "")
    article = vocabulary.messages["article"]  # "the Aurora X2": a decline writes it so too
    mentions_the = bool(subject) and f"{article}{subject}".lower() in body.lower()
    kind = kind_of(subject, body, vocabulary.language) if subject else ""
    return (parts[-1] if len(parts) > 1 else ""), found, subject, mentions_the, kind


def clear_passage_cache() -> None:
    """Forget the cached sentence analyses (``_analyse_text``)."""
    _analyse_text.cache_clear()


def build_passages(documents: Iterable[RetrievedChunk], vocabulary: Vocabulary) -> list[Passage]:
    """The prompt's documents as ``Passage`` objects, numbered from 1 as they are cited."""
    passages = []
    for index, chunk in enumerate(documents, start=1):
        leaf, found, subject, mentions_the, kind = _analyse_text(chunk.text, chunk.heading or "", chunk.title or "",
                                                                 vocabulary)
        passages.append(Passage(
            index=index, ordinal=chunk.ordinal, heading_leaf=leaf,
            heading_stems=stems(leaf),
            subject_name=subject, subject=tuple(normalize(subject).split()) if subject else (),
            sentences=found, mentions_the=mentions_the, kind=kind,
        ))
    return passages
