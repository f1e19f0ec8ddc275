"""A profile's vocabulary: its language's words and its synonym table, compiled for reading.

The extractive answerer reads a question as attribute groups ("money back" asks ``return``);
the ``synonyms`` query expander and the ``followup`` transformer read it the same way, so
retrieval and answering agree. They do not import the table: the turn runtime builds one
``Vocabulary`` per profile (``Vocabulary.for_profile``) and hands it to every component that
sets ``uses_vocabulary`` (``django_ragchat.components.Component``).

A profile's ``vocabulary`` setting picks the language (``"language": "en"``, or a folder of its
own, ``"directory"``), adds synonym groups (``"synonyms": {"volume": ["roomy", "litres"]}``) or
replaces the language's table (``"replace_synonyms": true``), and says whether the query
components read the synonym table (``"query_synonyms"``; by default only when the profile
answers with the offline ``extractive`` answerer, so a model-backed profile's retrieval does
not run on a shop's word list). docs/answerer.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from django_ragchat.answerer.dates import DateReader
from django_ragchat.language import Language, load_language
from django_ragchat.text import normalize
from django_ragchat.text import stem as _light_stem

_WORD_RE = re.compile(r"[^\W_]+(?:['’\-][^\W_]+)*", re.UNICODE)  # as text.words
_POSSESSIVE_RE = re.compile(r"['’]s$")


def fold(text: str) -> str:
    """``text.normalize`` with a fast path: ASCII text only needs lower-casing."""
    return text.lower() if text.isascii() else normalize(text)


def words(text: str) -> list[str]:
    """``text.words`` without possessive endings ("Aurora X2's" -> aurora, x2)."""
    return [_POSSESSIVE_RE.sub("", w) if "'" in w or "’" in w else w for w in _WORD_RE.findall(fold(text))]


@lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """``text.stem``, and a doubled final consonant undone ("swimming" -> "swimm" -> "swim",
    "shipped" -> "ship"), so a question's inflection meets the table's word. Only the answerer
    uses it: the embedder's features, and so the stored vectors, are not changed. An adverb
    meets its adjective ("diagonally" -> "diagonal", "magnetically" -> "magnetic", "monthly")."""
    if "-" in word:  # "trade-ins" is "trade-in"
        head, _, tail = word.rpartition("-")
        if tail.isalpha() and head:
            stemmed = stem(tail)
            if stemmed == tail and len(tail) >= 3 and tail.endswith("s") and not tail.endswith("ss"):
                stemmed = tail[:-1]  # "ins": too short for the light stemmer's plural rule
            return head + "-" + stemmed
    if len(word) > 5 and word.endswith("ly") and word.isalpha():
        word = word[:-4] + "ic" if word.endswith("ically") else word[:-2]
    s = _light_stem(word)
    if len(s) > 3 and s != word and s[-1] == s[-2] and s[-1] not in "aeiouylsz" and s[-1].isalpha():
        return s[:-1]
    return s


_VOWEL_RUN_RE = re.compile(r"[aeiou]+")


def gerund(verb: str) -> str:
    """English ``verb``'s -ing form, for a decline naming an action ("about running a book
    club"): "leave" -> "leaving", "run" -> "running" (one syllable, consonant-vowel-consonant),
    "deliver" -> "delivering", "lie" -> "lying", "bring" -> "bringing"; one in -ing or -ed is kept."""
    lower = verb.lower()
    if (lower.endswith("ing") and len(lower) > 5) or (lower.endswith("ed") and not lower.endswith("eed")):
        return verb
    if lower.endswith("ie"):
        return verb[:-2] + "ying"
    if lower.endswith("e") and len(lower) > 2 and lower[-2] not in "eoy":
        return verb[:-1] + "ing"
    if (len(_VOWEL_RUN_RE.findall(lower)) == 1 and len(lower) >= 3 and lower[-1] not in "aeiouwxy"
            and lower[-2] in "aeiou" and lower[-3] not in "aeiou"):
        return verb + verb[-1] + "ing"
    return verb + "ing"


def stems(text: str, pairs: bool = False) -> frozenset[str]:
    """Stems of ``text``'s words, and of each part of a hyphenated one: "a 6.1-inch phone"
    states "inch" (a size), "two-year" states "year". With ``pairs``, also each two neighbouring
    words as one hyphenated stem, as the table stores its two-word phrases ("wireless charging"
    is "wireless-charg"), so a sentence states a phrase group only where it has the phrase."""
    return stems_of(words(text), pairs)


def stems_of(tokens: list[str], pairs: bool = False) -> frozenset[str]:
    """``stems`` of a text whose ``words`` are ``tokens``; a hyphenated word states its joined
    spelling too ("Wi-Fi" states "wifi", "e-books" "ebooks")."""
    found = set()
    for word in tokens:
        found.add(stem(word))
        if "-" in word:
            found.update(stem(part) for part in word.split("-") if part)
            found.add(stem(word.replace("-", "")))
    if pairs:
        found.update(stem(a + "-" + b) for a, b in zip(tokens, tokens[1:]) if "-" not in a + b)
    return frozenset(found)


def labels(key: str) -> list[str]:
    """The synonym groups of a need key: "stem=label|label" for a word, "=label" for a phrase
    ("~=label" for an answer-type phrase such as "how long")."""
    _, _, found = key.partition("=")
    return found.split("|") if found else []


def word_of(key: str) -> str:
    """The asked word's stem of a need key ("" for a phrase's key)."""
    return key.partition("=")[0].lstrip("~")


#: How much a synonym counts against the asked word itself ("charges" for "wireless").
SYNONYM_EVIDENCE = 0.8


def _merged_groups(base: Mapping[str, Iterable[str]], extra: Any) -> dict[str, list[str]]:
    if extra is not None and not isinstance(extra, dict):
        raise ValueError(f"synonyms must be a dict of group name -> list of words, not {extra!r}")
    merged = {label: list(entries) for label, entries in base.items()}
    for label, entries in (extra or {}).items():
        if isinstance(entries, str) or not isinstance(entries, Iterable):
            raise ValueError(f"synonyms[{label!r}] must be a list of words, not {entries!r}")
        merged.setdefault(str(label), []).extend(str(e) for e in entries)
    return merged


@dataclass
class _Compiling:
    """The synonym table while it is compiled: single words by stem, phrases by word sequence."""

    exact: frozenset[str]
    groups: dict[str, set[str]] = field(default_factory=dict)
    phrase_labels: dict[tuple[str, ...], list[str]] = field(default_factory=dict)

    def add(self, label: str, entry: str) -> None:
        tokens = tuple(words(entry))
        stems_of_group = self.groups.setdefault(label, set())
        if len(tokens) == 1 and tokens[0] in self.exact:
            self.phrase_labels.setdefault(tokens, []).append(label)
        elif len(tokens) == 1:
            stems_of_group.add(stem(tokens[0]))
            if "-" in tokens[0]:  # "trade-in" is also written "trade in"
                self.phrase_labels.setdefault(tuple(p for p in tokens[0].split("-") if p), []).append(label)
        elif tokens:  # a phrase may be in several groups ("how long": length, duration)
            self.phrase_labels.setdefault(tokens, []).append(label)
            if len(tokens) == 2:  # "top up" is also written "top-up"
                stems_of_group.add(stem("-".join(tokens)))


def _other_form(written: list[str], listed: tuple[str, ...]) -> bool:
    """Whether a phrase met through stems ends in another form than listed, a gerund for a noun or
    the other way: "is there a charging brick" is no "is there a charge" (its last word describes
    another noun), while "charge wirelessly" is "charging wirelessly". A phrase of one word is an
    exact word (``exact_words``), met only as written: "Show me" is no "shows"."""
    if len(listed) == 1:
        return written != list(listed)
    return (len(written) == len(listed) and written[-1] != listed[-1]
            and written[-1].endswith("ing") != listed[-1].endswith("ing"))


_NAME_TOKEN_RE = re.compile(r"[^\W_]+(?:['’\-][^\W_]+)*")
# How far into a text names are looked for: long passages add cost, not names.
_MAX_SCAN_CHARS = 4000


def at_sentence_start(text: str, position: int) -> bool:
    """Whether ``position`` in ``text`` opens a sentence (or a heading, a list item): its
    capital says nothing about a name there."""
    before = position - 1
    while before >= 0 and text[before].isspace():
        before -= 1
    return before < 0 or text[before] in ".?!:\n-*•#>"


def name_sequences(text: str, stopwords: frozenset[str], numbers: bool = False) -> list[tuple[str, str]]:
    """(display, folded) capitalised name runs in ``text``: "Aurora X2", "Nimbus Pen", "Zappa".

    A run is capitalised words (and model codes like X2 right after one); a run of a single
    word counts only inside a sentence, since any sentence starts with a capital. With
    ``numbers`` (a title, not prose: "Friday 10" is no name), a number or a capital letter
    right after a word continues it too: "Trailblazer 300", "CityStream E".
    """
    found = []
    run: list[re.Match] = []

    def close():
        while run and fold(run[0].group(0)) in stopwords:
            run.pop(0)
        if run and (len(run) > 1 or not at_sentence_start(text, run[0].start())):
            found.append((text[run[0].start():run[-1].end()], " ".join(fold(m.group(0)) for m in run)))
        run.clear()

    for m in _NAME_TOKEN_RE.finditer(text[:_MAX_SCAN_CHARS]):
        token = m.group(0)
        if numbers and run and text[run[-1].end():m.start()].strip() == "" and (
                token.isdigit() or (len(token) == 1 and token.isupper() and fold(token) not in stopwords)):
            run.append(m)
            continue
        if not token[:1].isupper():  # neither a capitalised word nor a code: it ends a run
            if run:
                close()
            continue
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


class Vocabulary:
    """A language and a synonym table, compiled; what the offline components read text with.

    ``groups`` (label -> stems of its single words), ``phrases`` ((words, "label|label"),
    longest first), ``of_stem`` (stem -> labels of the groups it is in), ``phrases_from`` (first
    stem -> indexes in ``phrases``) and ``stemmed`` (each phrase's words stemmed, as a question's
    words are matched: "knocks off" is "knock off") are the table; ``language`` the word classes,
    patterns and messages. ``synonyms_in_queries`` says whether the query components read the
    table (see the module docstring).
    """

    def __init__(self, language: Language, synonyms: Mapping[str, Iterable[str]] | None = None, *,
                 replace_synonyms: bool = False, synonyms_in_queries: bool = True):
        self.language = language
        self.synonyms_in_queries = synonyms_in_queries
        base = {} if replace_synonyms else language.synonyms
        compiling = _Compiling(exact=language.exact_words)
        for label, entries in _merged_groups(base, synonyms).items():
            for entry in [label, *entries]:
                compiling.add(label, entry)
        self.groups = {k: frozenset(v) for k, v in compiling.groups.items()}
        self.phrases = tuple(sorted(((t, "|".join(dict.fromkeys(ls))) for t, ls in compiling.phrase_labels.items()),
                                    key=lambda p: -len(p[0])))
        self.stemmed = tuple(tuple(stem(t) for t in tokens) for tokens, _label in self.phrases)
        of_stem: dict[str, list[str]] = {}
        for label, group_stems in self.groups.items():
            for s in group_stems:
                of_stem.setdefault(s, []).append(label)
        self.of_stem = {k: tuple(v) for k, v in of_stem.items()}
        by_initial: dict[str, list[str]] = {}
        for s in self.of_stem:
            by_initial.setdefault(s[:1], []).append(s)
        self.stems_by_initial = {k: tuple(v) for k, v in by_initial.items()}  # the typo check's candidates
        phrases_from: dict[str, list[int]] = {}
        for index, tokens in enumerate(self.stemmed):
            phrases_from.setdefault(tokens[0], []).append(index)
        self.phrases_from = {k: tuple(v) for k, v in phrases_from.items()}
        self._read_word_classes(language)
        self._group_names: dict[str, tuple[str, ...]] = {}

    def _read_word_classes(self, language: Language) -> None:
        """The classes the answerer reads in its inner loops, as attributes (no lookups there)."""
        word = language.word_class
        self.stopwords = language.stopwords
        self.generic = word("generic") | word("qualifying") | word("framing")
        self.generic_stems = frozenset(stem(w) for w in self.generic)
        self.comparatives = frozenset(stem(w) for w in word("comparatives"))
        self.answer_type_phrases = frozenset(tuple(p.split()) for p in word("answer_type_phrases"))
        self.object_pronouns = word("object_pronouns")
        self.pointing = word("pointing")
        self.wh = word("wh")
        # Optional: a language without them names what a decline lacks as the user's words alone.
        self.articles = frozenset(language.words.get("articles", ()))
        self.prop_words = frozenset(language.words.get("prop_words", ()))
        # Optional: who acts ("Can I run ...?") makes a declined topic an action, named in its
        # -ing form, unless a form of "be" asked it ("Are you open ...?" asks a state).
        self.doers = frozenset(language.words.get("doers", ()))
        self.be_forms = frozenset(language.words.get("be_forms", ()))
        # Optional: reading "bob's order" as another person's (``question._other_owners``).
        self.possessive_determiners = frozenset(language.words.get("possessive_determiners", ())).union(
            self.pointing, self.articles, language.words.get("pronouns", ()))
        self.unnamed_possessors = frozenset(language.words.get("unnamed_possessors", ()))
        self.asker_possessive = next(iter(language.words.get("asker_possessive", ())), "")
        self.polar = word("polar")
        # Optional (a language written before it has none): days and months, never a subject.
        self.calendar = language.words.get("calendar", frozenset())
        self.time_units = frozenset(stem(w) for w in language.words.get("time_units", ()))
        # Spans of days (optional too): span stem -> (its days' stems, the days that state it).
        self.day_spans = {stem(name): (frozenset(stem(w) for w in language.words[name]), frozenset(
            stem(w) for w in language.words.get(f"{name}_ends") or language.words[name]))
            for name in ("weekend", "weekday") if language.words.get(name)}
        # Optional: what asks which days ("what days", a day's name); ``days_said`` states it.
        self.days_asked = frozenset(stem(w) for name in ("days_asked", "weekend", "weekday")
                                    for w in language.words.get(name, ()))
        self.negating_suffixes = tuple(language.words.get("negating_suffixes", ()))
        self.noun_of = language.noun_of
        # Optional: words that ask for a figure ("What number do I ring?"), stated by one.
        self.figure_words = frozenset(stem(w) for w in language.words.get("figure_words", ()))
        # Optional: words opening a sentence about one case of a situation ("If ...").
        self.case_openers = frozenset(language.words.get("case_openers", ()))
        # Optional: reading the asker's rows' dates (answerer/dates.py): the months, the words
        # asking for the soonest row, a window of time asked, what a time of day states.
        self.dates = DateReader(language.ordered.get("months", ()))
        self.soonest = frozenset(language.words.get("soonest", ()))
        self.time_window = language.patterns.get("time_window")
        self.clock_words = frozenset(stem(w) for w in language.words.get("clock_words", ()))
        self.clock_question = language.patterns.get("clock_question")
        self.classes = language.group_classes
        self.messages = language.messages

    @classmethod
    def for_profile(cls, profile) -> Vocabulary:
        """The vocabulary ``profile``'s ``vocabulary`` setting describes (docs/answerer.md)."""
        settings = profile.vocabulary_settings()
        language = load_language(settings["language"], settings["directory"])
        return cls(language, settings["synonyms"] or None, replace_synonyms=settings["replace_synonyms"],
                   synonyms_in_queries=settings["query_synonyms"])

    def word_class(self, name: str) -> frozenset[str]:
        """A word class of the language (``language.words``)."""
        return self.language.word_class(name)

    def pattern(self, name: str) -> re.Pattern:
        """A phrase pattern of the language (``language.patterns``)."""
        return self.language.pattern(name)

    def group_class(self, name: str) -> frozenset[str]:
        """A class of synonym groups (``decisive``, ``policy``...); empty when not defined."""
        return self.classes.get(name, frozenset())

    # --- Reading a text through the table --------------------------------------------------------

    def is_calendar(self, key: str) -> bool:
        """Whether group key ``key`` is a day or a month ("sunday", "sundays")."""
        word = word_of(key)
        return word in self.calendar or stem(word) in self.calendar

    def is_day(self, key: str) -> bool:
        """Whether group key ``key`` is a day, a month or a span of days ("weekday")."""
        return self.is_calendar(key) or word_of(key) in self.day_spans

    def is_time(self, key: str) -> bool:
        """Whether group key ``key`` is a day, a month or a unit of time ("hours", "weekday")."""
        return self.is_calendar(key) or stem(word_of(key)) in self.time_units

    def negates(self, a: str, b: str) -> bool:
        """Whether stem ``b`` is stem ``a`` with a negating suffix, or ``a`` is ``b`` with one
        ("wir" and "wireless", "cord" and "cordless")."""
        short, long = (a, b) if len(a) <= len(b) else (b, a)
        bases = [long[:-len(x)] for x in self.negating_suffixes if long.endswith(x)]
        return any(base == short or stem(base) == short for base in bases if base)

    def is_word(self, word: str) -> bool:
        """Whether ``word`` is known as a word of its own, never a typo to correct: not without a
        model (``semantic.NearWords`` asks the model's tokenizer)."""
        return False

    def covers(self, key: str, text_stems: frozenset[str]) -> float:
        """How strongly ``text_stems`` state ``key``: 1 for the asked word (or an asked phrase's
        group, or a span of days written by its first and last day), ``SYNONYM_EVIDENCE`` for
        another word of its group, 0 for none."""
        word, group_labels = word_of(key), key.partition("=")[2]
        if word and word in text_stems:
            return 1.0
        if group_labels and any(self.groups[label] & text_stems for label in group_labels.split("|")):
            return SYNONYM_EVIDENCE if word else 1.0
        if word in self.day_spans and self.day_spans[word][1] <= text_stems:
            return 1.0  # "Monday to Friday" says weekdays as fully as the word does
        return SYNONYM_EVIDENCE if word and self._span_states(word, text_stems) else 0.0

    def _span_states(self, word: str, text_stems: frozenset[str]) -> bool:
        """A day is stated by a span of days that holds it, named ("at weekends": Saturdays) or
        written by its first and last day ("Monday to Friday": Thursdays). (A span asked itself
        is ``covers``'s own case.)"""
        return any(word in days and (span in text_stems or ends <= text_stems)
                   for span, (days, ends) in self.day_spans.items())

    def _phrase_span(self, tokens: list[str], token_stems: list[str], i: int, phrase: tuple[str, ...]) -> int:
        """How many tokens from ``i`` spell the stemmed ``phrase`` (at most one object pronoun may
        follow its first word: "juice them up" is "juice up"), or 0."""
        n = len(phrase)
        if tuple(token_stems[i:i + n]) == phrase:
            return n
        if n > 1 and i + n < len(tokens) and tokens[i + 1] in self.object_pronouns and (
                token_stems[i] == phrase[0] and tuple(token_stems[i + 2:i + n + 1]) == phrase[1:]):
            return n + 1
        return 0

    def _phrase_keys(self, tokens: list[str], token_stems: list[str], used: list[bool],
                     positions: dict[str, int]) -> list[tuple[str, str]]:
        # Longest phrases first, each at every place it occurs (found through its first word); a
        # phrase written as listed before one met only through stems ("on a charging pad" is a
        # charging pad, not "on a charge").
        matches = sorted((tuple(tokens[i:i + n]) != self.phrases[index][0], index, i, n)
                         for i, first in enumerate(token_stems) for index in self.phrases_from.get(first, ())
                         if (n := self._phrase_span(tokens, token_stems, i, self.stemmed[index]))
                         and not _other_form(tokens[i:i + n], self.phrases[index][0]))
        found = []
        for _inexact, index, i, n in matches:
            phrase, label = self.phrases[index]
            if not any(used[i:i + n]):
                found.append((("~" if phrase in self.answer_type_phrases else "") + f"={label}", " ".join(phrase)))
                positions.setdefault(found[-1][0], i)
                for j in range(i, i + n):
                    used[j] = True
        return found

    def _asks_nothing(self, tokens: list[str], i: int, skip: set[str]) -> bool:
        token = tokens[i]
        if token in self.stopwords or token in self.generic or token in skip:
            return True
        if token == "long" and i and tokens[i - 1] in self.pointing | {"a", "an"} and i + 1 < len(tokens):
            return True  # "on a long flight", "a long weekend": it describes the thing, asks no length
        return len(token) < 2 and not token.isdigit()

    def group_keys(self, text: str, skip: set[str],
                   positions: dict[str, int] | None = None) -> list[tuple[str, str]]:
        """(group key, display words) for the content of ``text``: phrase groups first, then each
        remaining content word as its synonym groups (a word in no group is its own group). With
        ``positions``, each key's first word position in ``text`` is recorded there."""
        tokens = words(text)
        token_stems = [stem(t) for t in tokens]
        positions = {} if positions is None else positions
        used = [False] * len(tokens)
        found = self._phrase_keys(tokens, token_stems, used, positions)
        for i, token in enumerate(tokens):
            if used[i] or self._asks_nothing(tokens, i, skip):
                continue
            s = token_stems[i]
            if s in self.generic_stems:  # "paired" is as generic as "pair", "needs" as "need"
                continue
            group_labels = self.of_stem.get(s)
            if group_labels:  # the word itself, and its groups: "wireless charging" prefers "wireless"
                found.append((s + "=" + "|".join(group_labels), self.noun_of.get(token, token)))
            else:  # a word the table lacks (the model may still find it stated) reads as its noun too
                found.append((s, self.noun_of.get(token, token)))
            positions.setdefault(found[-1][0], i)
        return found

    def asks_only(self, text: str, groups: frozenset[str]) -> bool:
        """Whether every attribute word or phrase of ``text`` that the table knows is in one of
        ``groups`` (and there is one): "Will I get my money back?" asks only of the ``policy``
        class."""
        asked = [set(labels(key)) for key, _ in self.group_keys(text, set()) if not key.startswith("~")]
        asked = [found for found in asked if found]
        return bool(asked) and all(found & groups for found in asked)

    def group_names(self, text: str) -> tuple[str, ...]:
        """The names of the synonym groups that ``text``'s phrases ask about, leaving out those its
        words already spell out ("money back" -> ("return",)). Used by the ``synonyms`` query
        expander, so retrieval reads a question as the answerer does. A single word adds its
        groups too ("fixed" adds "repair", which a Repairs passage shares), except the groups of
        the ``unexpanded_by_a_word`` class: "cost" finds the pricing passages itself, and adding
        "price" to "How much does shipping cost?" pulled every product's Pricing section above
        the shipping passage; a phrase adds it only when it is the one group asked ("What would
        that set me back?"). The words of a name written as one ask nothing: "the alley behind
        Cedar Close" is a street, not the closing time."""
        names = self._group_names.get(text)
        if names is None:  # read into a local: another thread may clear the cache meanwhile
            names = self._read_group_names(text)
            if len(self._group_names) > 1024:
                self._group_names.clear()
            self._group_names[text] = names
        return names

    def _read_group_names(self, text: str) -> tuple[str, ...]:
        unexpanded = self.group_class("unexpanded_by_a_word")
        spelled = {stem(w) for w in words(text)}
        in_names = {w for _, folded in name_sequences(text, self.stopwords) for w in folded.split()}
        names: list[str] = []
        for key, _label in self.group_keys(text, in_names):
            phrase = key.startswith("=")
            for label in labels(key):
                if label in names or all(stem(w) in spelled for w in words(label)) or (
                        not phrase and label in unexpanded):
                    continue
                names.append(label)
        if len(names) > 1:  # "Do you charge for fixing it?": the repair, not every Pricing section
            names = [n for n in names if n not in unexpanded]
        return tuple(names)


@lru_cache(maxsize=1)
def default_vocabulary() -> Vocabulary:
    """The shipped English vocabulary with its own synonym table (tests and benchmarks)."""
    return Vocabulary(load_language())
