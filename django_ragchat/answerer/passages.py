"""The retrieved chunks as the answerer reads them: passages of scorable sentences, each passage
with its heading and the subject it is about."""

from __future__ import annotations

import calendar
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from django_ragchat.access import only_for
from django_ragchat.answerer.vocabulary import (
    Vocabulary,
    fold,
    name_sequences,
    stem,
    stems,
    stems_of,
    words,
)
from django_ragchat.search.subjects import kind_of, written_as_name
from django_ragchat.tables import TABLE_RULE_RE, table_cells
from django_ragchat.text import HEADING_SEPARATOR, normalize, sentences
from django_ragchat.types import RetrievedChunk

_CITE_BEFORE_STOP = re.compile(r"\s*([.!?])$")  # "£5 ." cites as "£5 [1]."
_MARKUP_CHARS = set('{}[]"=<>|`\\')
_QUOTED_WORDS = re.compile(r'"[^"{}\[\]<>=|`\\]{1,60}"')
_LETTER_RE = re.compile(r"[^\W\d_]")
_TITLE_WORD_RE = re.compile(r"[^\W_]+")
_BULLETS = "-*•"
# A short line that states a value is a sentence ("Serves 4.", "Makes 12."): a recipe site's
# trial asked how many the soup serves, and the fragment rule below had dropped the only answer.
_SHORT_VALUE_RE = re.compile(r"^[^\W\d_]{3,}(?: [^\W\d_]+)? \d[\d.,]*\s*[^\W\d_]*[.!]?$")


def is_prose(sentence: str, table_row: bool = False) -> bool:
    """False for code, JSON, tables and markup: quoting them is never a readable answer. Words in
    quotes ('Choose "Forgot password".') are prose, and so is a word or two of code among five
    words or more ("Set DEBUG=False in your settings.")."""
    letters = len(_LETTER_RE.findall(sentence))
    # A table's row as written out here has its figures as words: "Band D: property value
    # £68,001 to £88,000; annual charge £2,103." ("14/06/2025 19:30, row F" as written stays data.)
    if (letters + (sum(map(str.isdigit, sentence)) if table_row else 0)) / len(sentence) <= 0.5:
        return False
    bare, quoted = _QUOTED_WORDS.subn("", sentence) if '"' in sentence else (sentence, 0)
    if quoted > 2:  # {"product": "Aurora X2", "price": ...}: data, not words in quotes
        bare = sentence
    markup = sum(map(bare.count, _MARKUP_CHARS))  # str.count runs in C, per character it doesn't
    if markup / len(sentence) < 0.03:
        return True
    # "if a == b: return c" has five words too, but fewer letters.
    return (markup <= 2 and letters / len(sentence) >= 0.7 and not any(map(bare.__contains__, "{}[]|"))
            and len(words(sentence)) >= 5)


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
    item: bool = False  # a line of a bulleted list ("- 225 g butter"): a list is quoted whole
    row: bool = False  # a table's row written out ("Food waste: colour green caddy; ..."): one case of many


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
    # A topic page's title ("Site help" over "Going live"): the page's context, not evidence.
    title_stems: frozenset[str] = frozenset()
    # Read at ingestion (``answerer.stored``): its sentences' and heading's candidate words for
    # the model's word neighbours, (stem, word) in order, its sentences' vectors and its words'
    # token ids. None and {} when the passage was read in this process.
    words: tuple[tuple[str, str], ...] | None = field(default=None, compare=False)
    leaf_words: tuple[tuple[str, str], ...] | None = field(default=None, compare=False)
    vectors: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    tokens: Mapping[str, list[int]] = field(default_factory=dict, compare=False, repr=False)  # word -> token ids
    # The model source whose row it is ("appointments" for "appointments:12"), "" for a page:
    # rows of one source that state a question alike are listed together ("What appointments do I have?").
    family: str = ""
    document_id: int = 0
    # Only the asker may read it (``access.only_for``): their order, booking or appointment.
    asker_own: bool = False


_BLOCK_SPLIT_RE = re.compile(r"(\n\s*\n)")


def _table(block: str) -> list[str] | None:
    """A block of table rows (its first row the header) as one sentence per row, or None."""
    lines = [line for line in block.strip().split("\n") if not TABLE_RULE_RE.match(line)]
    rows = [table_cells(line) for line in lines]
    if len(rows) < 2 or len({len(r) for r in rows}) != 1 or len(rows[0]) < 2:
        return None
    header, body = rows[0], rows[1:]
    return [_row_sentence(cells, header) for cells in body]


def table_rows(text: str) -> str:
    """``text`` with each table written as one sentence per row, so a row can be selected and
    quoted readably: under the header ``Card | Price``, the row ``Visitor Card | £12 a year``
    reads "Visitor Card: price £12 a year." A table is a block (between blank lines) of rows
    with the same number of cells, as the markdown loader stores one (``a | b`` per line) or
    as markdown writes it (``| a | b |`` with a ``| --- |`` rule). Text without one is returned
    as is. A table a chunk boundary cut reads its first row as the header."""
    return _written_out(text)[0]


def _written_out(text: str) -> tuple[str, frozenset[str]]:
    """``table_rows(text)``, and the sentences its tables' rows became."""
    if "|" not in text:
        return text, frozenset()
    out, rows = [], []
    for block in _BLOCK_SPLIT_RE.split(text):
        found = _table(block) if "|" in block else None
        out.append("\n\n".join(found) if found else block)
        rows += found or ()
    return "".join(out), frozenset(rows)


#: A row's first cell that is a code ("D", "A1", "12") means nothing without its column's name.
_CODE_CELL_RE = re.compile(r"[A-Za-z]?\d*|\d+[A-Za-z]?")
_CALENDAR_NAMES = frozenset(n.lower() for n in (*calendar.day_name, *calendar.month_name) if n)


def _as_value(cell: str) -> str:
    """A cell after its column's name, its first letter lowered when only table style put the
    capital there ("colour Blue", "price Free": no names); a name of capitalised words ("Quay
    Road"), a day or month, or an acronym keeps it."""
    first, _, rest = cell.partition(" ")
    if not first[:1].isupper() or not first[1:].islower() or first.lower() in _CALENDAR_NAMES:
        return cell
    if any(w[:1].isupper() and w.strip(",.").lower() not in _CALENDAR_NAMES for w in rest.split()):
        return cell
    return first.lower() + (" " + rest if rest else "")


def _row_sentence(cells: list[str], header: list[str]) -> str:
    lead, rest = cells[0], cells[1:]
    if header[0] and _CODE_CELL_RE.fullmatch(lead) and lead:
        lead = f"{header[0]} {lead}"  # "Band D: annual charge £2,103", not "D: ..."
    # A column name reads in lower case ("price £12 a year"), so it is no name of its own; an
    # acronym ("RAM") stays as written.
    names = [h[:1].lower() + h[1:] if h[1:2].islower() and h.split()[0].lower() not in _CALENDAR_NAMES else h
             for h in header[1:]]
    parts = [f"{h} {_as_value(c)}" if h else c for h, c in zip(names, rest, strict=True) if c]
    text = f"{lead}: {'; '.join(parts)}" if parts else lead
    return text if text.endswith((".", "!", "?")) else text + "."


def _outside_names(sentence: str, names: tuple[str, ...]) -> frozenset[str]:
    """The stems of ``sentence``'s words that stand outside its name runs ``names``."""
    rest = fold(sentence)
    for name in names:
        rest = re.sub(rf"\b{re.escape(name)}\b", " ", rest)
    return frozenset(stem(w) for w in words(rest))


def _word_stems(word: str) -> frozenset[str]:
    """``stems(word)`` of one word of a sentence's ``words``: a word of ASCII letters and digits
    (no apostrophe, no hyphen) is its own only word, so its stems are its stem alone."""
    return frozenset((stem(word),)) if word.isascii() and word.isalnum() else stems(word)


def _scorable(body: str, vocabulary: Vocabulary) -> tuple[Sentence, ...]:
    money, share, number = vocabulary.pattern("money"), vocabulary.pattern("share"), vocabulary.pattern("number")
    found = []
    text, rows = _written_out(body)
    for position, sentence in enumerate(sentences(text)):
        item = sentence[:1] in _BULLETS and sentence[1:2].isspace()
        sentence = sentence.lstrip(_BULLETS + " ").strip()
        # A short line is a fragment, unless it states a value or is a list's line ("- 4 eggs").
        if (len(sentence) < 12 and not item and not _SHORT_VALUE_RE.match(sentence)) or not is_prose(
                sentence, table_row=sentence in rows):
            continue
        has_money = bool(money.search(sentence))
        names = tuple(dict.fromkeys(folded for _, folded in name_sequences(sentence, vocabulary.stopwords)))
        tokens = words(sentence)
        found.append(Sentence(
            text=sentence, position=position,
            stems=stems_of(tokens, pairs=True),
            has_currency=has_money or bool(share.search(sentence)),
            has_number=bool(number.search(sentence)),
            names=names,
            sequence=tuple(map(_word_stems, tokens)),
            has_money=has_money, loose=_outside_names(sentence, names), item=item, row=sentence in rows,
        ))
    return tuple(found)


def candidate_words(text: str, light: frozenset[str]) -> list[tuple[str, str]]:
    """(stem, word) of each word of ``text`` the model's word neighbours may use (a word of
    letters, longer than two, not in ``light``), the first word of each stem, in order."""
    found: dict[str, str] = {}
    for w in words(text):
        if len(w) > 2 and w.isalpha() and w not in light:
            found.setdefault(stem(w), w)
    return list(found.items())


def _title_name(title: str, vocabulary: Vocabulary) -> tuple[str, bool]:
    """The first name a title writes, a date not being one: "Your order SS-1014, placed Saturday
    28 November 2026" is about no "Saturday 28 November 2026" (an outside trial's customer was
    told the documents say nothing of opening hours "for" that date). And whether it writes a
    date as a name: such a title is a record's, no topic's. A title written as a name from end
    to end, words only, is one name with its small words: "Chickpea and Spinach Curry", as the
    subject index reads it (a recipe site's trial was told of a "Spinach Curry")."""
    found = list(_TITLE_WORD_RE.finditer(title))
    if written_as_name(title) and all(m.group(0).isalpha() and not vocabulary.is_calendar(fold(m.group(0)))
                                      for m in found):
        start = next((m.start() for m in found if fold(m.group(0)) not in vocabulary.stopwords), 0)
        return title[start:].strip(), False  # "The Seagull" is the Seagull, as a run of names
    dated = False
    for display, folded in name_sequences(title, vocabulary.stopwords, numbers=True):
        if not all(t.isdigit() or vocabulary.is_calendar(t) for t in folded.split()):
            return display, dated
        dated = True
    return "", dated


def analyse_text(text: str, heading: str, title: str,
                 vocabulary: Vocabulary) -> tuple[str, tuple[Sentence, ...], str, bool, str]:
    """A chunk read: (its heading's leaf, its scorable sentences, its subject, whether its text
    writes "the <subject>", the kind it defines the subject as)."""
    body = text
    if heading and body.startswith(heading):
        body = body[len(heading):]  # the heading line is a label, not a sentence
    found = _scorable(body, vocabulary)
    parts = [p.strip() for p in heading.split(HEADING_SEPARATOR)] if heading else []
    top = parts[0] if parts else title
    subject, dated = _title_name(top or "", vocabulary)
    if not subject and title:
        subject, dated = _title_name(title, vocabulary)
    article = vocabulary.messages["article"]  # "the Aurora X2": a decline writes it so too
    mentions_the = bool(subject) and f"{article}{subject}".lower() in body.lower()
    kind = kind_of(subject, body, vocabulary.language) if subject else ""
    # A page of one section about a topic ("Contact and support") writes its topic in its title
    # alone: the title is then its leaf, as a section's heading is. A subject's title names it.
    leaf = parts[-1] if len(parts) > 1 else ("" if subject or dated else top or "")
    return leaf, found, subject, mentions_the, kind


#: ``analyse_text`` cached per process: a chunk's text does not change.
_analyse_text = lru_cache(maxsize=4096)(analyse_text)


def clear_passage_cache() -> None:
    """Forget the cached sentence analyses (``_analyse_text``)."""
    _analyse_text.cache_clear()


def _title_stems(chunk: RetrievedChunk) -> frozenset[str]:
    """The words of a topic page's title ("Site help" over "Going live"): every section of it
    is about them ("How do I make the site go live?")."""
    top = chunk.heading.split(HEADING_SEPARATOR)[0] if chunk.heading else chunk.title
    return stems(top or "")


def build_passages(documents: Iterable[RetrievedChunk], vocabulary: Vocabulary,
                   stored: Sequence[Any] | None = None) -> list[Passage]:
    """The prompt's documents as ``Passage`` objects, numbered from 1 as they are cited.
    ``stored`` (aligned with ``documents``) holds each one's ``answerer.stored.StoredReading``
    when it was read at ingestion with this vocabulary, else None: then it is read here."""
    passages = []
    for index, chunk in enumerate(documents, start=1):
        reading = stored[index - 1] if stored else None
        if reading is None:
            leaf, found, subject, mentions_the, kind = _analyse_text(chunk.text, chunk.heading or "",
                                                                     chunk.title or "", vocabulary)
            extra = {}
        else:
            leaf, found, subject, mentions_the, kind = reading.analysis
            extra = {"words": reading.words, "leaf_words": reading.leaf_words, "vectors": reading.vectors,
                     "tokens": reading.tokens}
        passages.append(Passage(
            index=index, ordinal=chunk.ordinal, heading_leaf=leaf,
            heading_stems=stems(leaf), title_stems=frozenset() if subject else _title_stems(chunk),
            subject_name=subject, subject=tuple(normalize(subject).split()) if subject else (),
            sentences=found, mentions_the=mentions_the, kind=kind, family=_row_family(chunk.source),
            document_id=chunk.document_id, asker_own=only_for(chunk.access, chunk.read_as), **extra,
        ))
    return passages


#: A model source's document: "<source name>:<pk>" (docs/sources.md); a URL or a path never is.
_ROW_SOURCE_RE = re.compile(r"([a-z0-9_-]+):([^/\s:]+)")


def _row_family(source: str) -> str:
    match = _ROW_SOURCE_RE.fullmatch(source or "")
    return match.group(1) if match else ""
