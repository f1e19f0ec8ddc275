"""Choosing the answer: the on-subject sentences that state what was asked, or a plain decline."""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass, field, replace
from datetime import date, datetime, time

from django.utils import timezone

from django_ragchat.answerer.dates import asked_window, says_clock_time, window_span
from django_ragchat.answerer.passages import Passage, Sentence, build_passages, candidate_words, cite
from django_ragchat.answerer.question import (
    Entity,
    Need,
    analyse_query,
    as_the_asker,
    asks_charging_time,
    capacities,
    question_parts,
    states_charging_time,
)
from django_ragchat.answerer.semantic import NearWords, SentenceSimilarity, StoredVectors
from django_ragchat.answerer.stored import read_stored
from django_ragchat.answerer.vocabulary import (
    SYNONYM_EVIDENCE,
    Vocabulary,
    default_vocabulary,
    fold,
    gerund,
    labels,
    stem,
    word_of,
    words,
)
from django_ragchat.types import Prompt

#: The share of the asked attribute a sentence must state to be an answer (docs/answerer.md).
DEFAULT_MIN_COVERAGE = 0.5
#: A question word that no passage and no synonym group knows ("internationally", or a
#: paraphrase the table misses) weighs this much of a known word as rare.
UNKNOWN_WORD_WEIGHT = 0.3
#: ... except in a question that asks at most this many words: there every word is the point
#: ("Do you ship internationally?", "Can I pay monthly?").
SHORT_QUESTION_WORDS = 2
#: An answer-type phrase ("how long") or a comparative beside another asked word weighs this much.
ANSWER_TYPE_WEIGHT = 0.35
#: A comparison answered per subject needs each subject's sentence to state this much of it.
COMPARED_COVERAGE = 0.75
#: The sentence before the best one joins the answer when its share of the asked attribute is
#: at most this much lower.
PRECEDING_MARGIN = 0.25
#: An earlier sentence of the best one's passage that states as much of what was asked answers in
#: its place when its score, and its similarity to the question, are at most this much lower
#: (``AnswerSelector._passage_first``).
EARLIER_MARGIN = 0.1
#: A sentence states everything asked at this share (floating point's sum of the weights).
FULL_COVERAGE = 0.999
#: Rows of one model source listed in one answer, at most (``_rows_alike``), and how much less
#: close to the question than the best row's sentence another row's may be.
MAX_ROWS_LISTED = 5
#: A bulleted list asked for by its heading is quoted whole up to this many lines.
MAX_LIST_ITEMS = 12
ROW_SIMILARITY_MARGIN = 0.1
#: ... and how close in meaning to the best row's sentence another row's must be.
ROW_LIKENESS = 0.7
#: Two asked words written side by side count as stated together only when the sentence has
#: them at most this many words apart; otherwise PROXIMITY_PENALTY of the rarer one's weight
#: is taken off ("Can the case charge wirelessly?" against "wireless earbuds with ... eight
#: hours on one charge").
PROXIMITY_WINDOW = 4
PROXIMITY_PENALTY = 0.5
#: What an asked word is worth where a sentence only names a fault of it ("battery failure",
#: "screen repair") and the question asked about neither warranty nor repairs.
FAULT_QUALIFIER_EVIDENCE = 0.5
#: What an asked word is worth where only the page's title states it, in a section the question
#: asks about too (``_Scoring._names_page_and_section``).
TITLE_EVIDENCE = 0.4
#: A sentence opening with the asked subject's name is about it: its score rises this much
#: (more than one retrieval rank), so "Zephyr Buds cost $149." answers their price before
#: "...a single replacement bud costs $39." of a passage ranked above.
SUBJECT_OPENING_BONUS = 0.15
#: With a semantic model: a sentence's similarity to what was asked, times this, is added to its
#: score (docs/answerer.md; calibrated on the tuning sets, bench/README.md).
SEMANTIC_WEIGHT = 0.5
#: ... and a sentence this close answers even when it states less than ``min_coverage`` of the
#: asked words; below it (and below ``min_coverage``) the answer is a decline. Calibrated on the
#: tuning set: the lowest threshold, in steps of 0.05, at which plain declines stay >= 90%.
MIN_SIMILARITY = 0.7
#: With a semantic model: a sentence less similar than this to what was asked does not answer
#: when its passage never states an asked word that another passage's heading is about (it is
#: about another topic); calibrated on the tuning sets (bench/README.md).
OTHER_TOPIC_SIMILARITY = 0.35
#: With a semantic model: a passage word whose vector is this close to an asked word states it
#: (as a synonym would), with NEAR_WORD_EVIDENCE.
NEAR_WORD_SIMILARITY = 0.45
NEAR_WORD_EVIDENCE = 0.8
#: With a semantic model: a question word the synonym table does not know weighs (its vector's
#: length / LIGHT_NORM) ** LIGHT_POWER, at most 1 (docs/answerer.md, "Light words"), unless a
#: heading of the passages on the subject states it (then it names the topic). Calibrated on the
#: tuning sets (bench/README.md, "False declines on the library").
LIGHT_NORM = 10.0
LIGHT_POWER = 2.0
#: ... but no word is light in a question whose passages lack an asked word this long: that word
#: names its topic, and the light words beside it must not make a sentence without it an answer.
TOPIC_NORM = 14.0

#: A decline names at most this many of the unknown names a question asked about, and echoes at
#: most ECHO_CHARS of what it names: a pasted 16,000-character word is not repeated back whole.
MAX_ECHOED_NAMES = 3
ECHO_CHARS = 60

#: An amount of money written with its currency sign ("£35", "$1,299.99").
_AMOUNT_RE = re.compile(r"[$€£¥]\s?\d[\d,.]*")
_FIGURE_RE = re.compile(r"\d")
_WORD_RE = re.compile(r"[^\W_]+(?:['’\-][^\W_]+)*", re.UNICODE)
_MARKUP_RE = re.compile(r"<(script|style)\b[^>]*>.*?</\1\s*>|<[^<>]{0,200}>", re.IGNORECASE | re.DOTALL)


def without_markup(text: str) -> str:
    """``text`` without HTML tags, and without what a script or style element holds."""
    return _MARKUP_RE.sub(" ", text) if "<" in text else text


def echoed(text: str) -> str:
    """``text`` as a decline repeats it: cut to ``ECHO_CHARS`` characters, at a word if it can be."""
    if len(text) <= ECHO_CHARS:
        return text
    cut = text[:ECHO_CHARS]
    return (cut.rsplit(" ", 1)[0] if " " in cut else cut) + "…"


def _is_action(topic: str, before: list[str], vocabulary: Vocabulary) -> bool:
    """Whether ``topic`` starts with a verb: the user wrote it after a doer ("Do you deliver on
    Sundays?", "How to renew"), not after a form of "be" before that ("Are you open ...?")."""
    first = topic.split(" ", 1)[0]
    if not before or fold(before[-1]) not in vocabulary.doers or not first.isalpha() or not first.islower():
        return False
    if first in vocabulary.stopwords or first in vocabulary.articles or (first.endswith("s") and not first.endswith("ss")):
        return False  # "if it starts drizzling": a verb with its -s is in a clause of its own
    return len(before) < 2 or fold(before[-2]) not in vocabulary.be_forms


def _as_named(topic: str, asked: str, vocabulary: Vocabulary) -> str:
    """``topic`` as a decline names it: with the article the user wrote before it ("about the
    heater"), unless the article is a word's that stands in for the noun ("a black one")."""
    at = asked.find(topic) if topic else -1
    before = _WORD_RE.findall(asked[:at]) if at > 0 else []
    after = _WORD_RE.findall(asked[at + len(topic):])[:1] if at >= 0 else []
    if _is_action(topic, before, vocabulary):
        verb, _, rest = topic.partition(" ")
        return f"{gerund(verb)} {rest}".rstrip()  # "Can I run a book club?": "about running a book club"
    if (before and fold(before[-1]) in vocabulary.articles and asked[:at].endswith(" ")
            and not (after and fold(after[0]) in vocabulary.prop_words)):
        return f"{before[-1].lower()} {topic}"
    return topic


def span_of(text: str, keys: list[str], longest: int = 6) -> str:
    """The words of ``text`` from the first to the last of ``keys`` ("ship to Canada" for the
    keys ship and canada), as the user wrote them; "" when they are not all found close together."""
    tokens = list(_WORD_RE.finditer(text))
    token_stems = [stem(folded[0]) if (folded := words(t.group(0))) else "" for t in tokens]
    places = []
    for key in keys:
        word = word_of(key)
        if not word or word not in token_stems:
            return ""
        places.append(token_stems.index(word))
    first, last = min(places), max(places)
    if last - first >= longest:
        return ""
    return text[tokens[first].start():tokens[last].end()]


@dataclass(frozen=True)
class Choice:
    """A candidate sentence with its score and the share of the asked attribute it states."""

    passage: Passage
    sentence: Sentence
    score: float
    coverage: float
    similarity: float = 0.0  # to what was asked, by the semantic model (0 without one)
    label: str = ""  # which of the asker's rows it is, said before it when its words do not


#: An initialism asked is known by having none of these ("fps", "mah"), or by its capitals.
_VOWELS = frozenset("aeiouy")
#: What follows a rating's letters in its code: "IPX4", "IP68", "USB3" ("ip" + "x4", "68").
_CODE_TAIL_RE = re.compile(r"[a-z]?\d+[a-z]?")


def _coded(word: str, stems: frozenset[str]) -> bool:
    """Whether ``stems`` hold a code made of ``word`` (2 to 4 letters: an acronym such as "ip")
    and a number: "IPX4", "IP68" state what "IP rating" asks."""
    if not 2 <= len(word) <= 4 or not word.isalpha():
        return False
    return any(st.startswith(word) and _CODE_TAIL_RE.fullmatch(st, len(word)) for st in stems)


def _initialism(word: str, written: str, asked: str) -> bool:
    """Whether an asked ``word`` reads as an initialism ("fps", "ANC"): 2 to 5 letters, written in
    capitals or with no vowel (so "uni" or "run" never is), and no unit after a number ("3.5mm")."""
    return 2 <= len(word) <= 5 and word.isalpha() and (
        written.isupper() or not any(c in _VOWELS for c in word)) and not re.search(
        rf"\d\s*{re.escape(written or word)}\b", asked, re.IGNORECASE)


def _spelled_by_initials(initialism: str, text: str, stopwords: frozenset[str]) -> bool:
    """Whether consecutive words of ``text`` begin with the letters of ``initialism`` and the run
    starts and ends on a word that is not a stop word: "frames per second" spells "fps", while "a
    scale and polish" does not spell "ASAP"."""
    said = words(text)  # folded
    n = len(initialism)
    return any(
        "".join(w[0] for w in said[i:i + n]) == initialism
        and said[i] not in stopwords and said[i + n - 1] not in stopwords
        for i in range(len(said) - n + 1))


def _places(key: str, sentence: Sentence, vocabulary: Vocabulary) -> list[int]:
    """Where ``sentence`` states ``key``: the asked word's places, else its group's."""
    word = word_of(key)
    own = [i for i, found in enumerate(sentence.sequence) if word and word in found]
    return own or [i for i, found in enumerate(sentence.sequence) if vocabulary.covers(key, found)]


def _apart(a: str, b: str, sentence: Sentence, vocabulary: Vocabulary) -> bool:
    """Whether ``sentence`` states keys ``a`` and ``b`` but never within PROXIMITY_WINDOW words."""
    at_a, at_b = _places(a, sentence, vocabulary), _places(b, sentence, vocabulary)
    if not at_a or not at_b:
        return False
    return min((abs(i - j) for i in at_a for j in at_b if i != j), default=0) > PROXIMITY_WINDOW


def _qualifies_a_fault(key: str, sentence: Sentence, asked: set[str], vocabulary: Vocabulary) -> bool:
    """Whether every place ``sentence`` states ``key`` is right before a word of the ``fault``
    groups (warranty, repair), when the question asked about none ("covers battery failure")."""
    faults = vocabulary.group_class("fault")
    if asked & faults:
        return False
    places = _places(key, sentence, vocabulary)
    for i in places:
        following = sentence.sequence[i + 1] if i + 1 < len(sentence.sequence) else frozenset()
        if not any(set(vocabulary.of_stem.get(st, ())) & faults for st in following):
            return False
    return bool(places)


def _figure(text: str | None) -> float | None:
    try:
        return float(text.replace(",", "")) if text else None
    except ValueError:
        return None


def _in_a_stated_span(word: str, asked_text: str, text: str, spans: re.Pattern) -> bool:
    """Whether the amount ``word`` (an asked word: "100" of "a gift worth £100") falls in a span
    of amounts ``text`` states ("£50 to £150", "under £50", "over £150": the language's
    ``number_range``). Amounts of money only: "3.5mm" is not stated by "up to 45 W"."""
    asked = _figure(word)
    if asked is None or not re.search(rf"[$€£¥]\s?{re.escape(word)}(?![\d,.]*\d)", asked_text):
        return False
    for found in spans.finditer(text):
        if not _AMOUNT_RE.search(found.group(0)):
            continue
        span = {name: _figure(value) for name, value in found.groupdict().items()}
        if (span["low"] is not None and span["high"] is not None and span["low"] < span["high"]
                and span["low"] <= asked <= span["high"] or span["below"] is not None and asked < span["below"]
                or span["upto"] is not None and asked <= span["upto"]
                or span["above"] is not None and asked > span["above"]):
            return True
    return False


def names_subject(sentence: Sentence, subjects: set[Entity]) -> bool:
    """Whether ``sentence`` has every word of one of ``subjects`` (as a run or not)."""
    return any(all(stem(t) in sentence.stems for t in subject) for subject in subjects if subject)


def _has_other_topic(sentence: Sentence, need: Need, vocabulary: Vocabulary) -> bool:
    """A sentence about a discount or trade-in is not a continuation of a price list."""
    return bool(vocabulary.covers("=discount", sentence.stems)) and not any(
        "discount" in labels(k) for k in need.own)


def _leaf_in_sentence(leaf: str, clauses: frozenset[str] = frozenset()) -> str:
    """A heading as a decline names it mid-sentence: "address and opening hours", but a name
    keeps its capitals ("Zephyr K3 Pro": a word after the first is capitalised), and so does an
    acronym ("FAQ", not "faq"); a heading that is a clause ("What you wrote", "How to apply")
    opening with a word of ``clauses`` is quoted as written."""
    head, _, rest = leaf.partition(" ")
    if rest and head.lower() in clauses:
        return f"“{leaf}”"
    if any(word[:1].isupper() for word in rest.split()):
        return leaf
    return (head if len(head) > 1 and head.isupper() else head.lower()) + (" " + rest.lower() if rest else "")


def _passage_states(passage: Passage, key: str, vocabulary: Vocabulary) -> bool:
    return bool(vocabulary.covers(key, passage.heading_stems)) or any(
        vocabulary.covers(key, s.stems) for s in passage.sentences)


def _topics_elsewhere(need: Need, eligible: list[tuple[Passage, Sentence]], chosen: Passage,
                      vocabulary: Vocabulary) -> list[str]:
    """The asked words that the heading of another passage on the subject is about and that
    ``chosen`` never states: a sentence of ``chosen`` is then about another topic."""
    others = {id(p): p for p, _ in eligible if p is not chosen}.values()
    return [k for k in need.own if not k.startswith("~") and not _passage_states(chosen, k, vocabulary)
            and any(vocabulary.covers(k, p.heading_stems) and not _same_page_topic(k, p, chosen, vocabulary)
                    for p in others)]


def _same_page_topic(key: str, other: Passage, chosen: Passage, vocabulary: Vocabulary) -> bool:
    """Whether ``key`` is the topic of the page both passages are on, which its title states:
    "Loyalty card" heads the card's first section and "Getting a card" alike."""
    return bool(chosen.title_stems) and other.title_stems == chosen.title_stems and bool(
        vocabulary.covers(key, chosen.title_stems))


def light_weight(norm: float) -> float:
    """What a question word whose vector is ``norm`` long weighs (1 for a word that says much)."""
    return min(1.0, (norm / LIGHT_NORM) ** LIGHT_POWER)


def _lacks_topic(need: Need, eligible: list[tuple[Passage, Sentence]], vocabulary: Vocabulary,
                 word_norms: dict[str, float]) -> bool:
    """Whether the passages on the subject never state an asked word that says much (its vector is
    at least TOPIC_NORM long): "Can I hire a bicycle instead of driving?" is about a bicycle, and
    the light "instead" must not make it the lesser part of a question a car park sentence answers."""
    return any("=" not in key and word_norms.get(key, 0.0) >= TOPIC_NORM and not any(
        vocabulary.covers(key, s.stems) or vocabulary.covers(key, p.heading_stems) for p, s in eligible)
        for key in need.own)


def _weights(need: Need, passages: list[Passage], eligible: list[tuple[Passage, Sentence]],
             vocabulary: Vocabulary, word_norms: dict[str, float] | None = None) -> dict[str, float]:
    """The IDF of each asked group over the candidate sentences: rare evidence weighs more; a
    light word (by ``word_norms``, stem -> the model's vector length) weighs less."""
    all_sentences = [s for p in passages for s in p.sentences]
    n = len(all_sentences)
    idf = {}
    headings = {id(p): p.heading_stems for p, _ in eligible}.values() if word_norms else ()
    if word_norms and _lacks_topic(need, eligible, vocabulary, word_norms):
        word_norms = None
    for key in need.groups:
        df = sum(vocabulary.covers(key, s.stems) for s in all_sentences)
        idf[key] = math.log(1 + (n + 1) / (1 + df))
        light = light_weight(word_norms[key]) if word_norms and "=" not in key and key in word_norms else 1.0
        if light < 1.0 and not any(vocabulary.covers(key, h) for h in headings):
            # "always" in "I always forget to bring my books back" says little; a word the synonym
            # table knows, or a heading states ("parking"), names what is asked and keeps its weight.
            idf[key] *= light
        # A word the subject's passages never use (nor a word the model finds close to it), and
        # no synonym group knows, is as likely a paraphrase ("patches against hackers") as the
        # point; it weighs less.
        if "=" not in key and (len(need.own) > SHORT_QUESTION_WORDS or need.promoted or any(
                vocabulary.covers(key, p.title_stems) for p, _ in eligible)) and not any(
                vocabulary.covers(key, s.stems) or vocabulary.covers(key, p.heading_stems) for p, s in eligible):
            # A short question's word weighs in full, unless the title of the page found writes
            # it: "site" in "How do I make the site go live?" over "Site help > Going live".
            idf[key] *= UNKNOWN_WORD_WEIGHT
        if (key.startswith("~") or word_of(key) in need.comparatives) and len(need.own) > 1:
            idf[key] *= ANSWER_TYPE_WEIGHT  # "how long", or "bigger" in "bigger storage options"
    return idf


def _carried_topic(need: Need, typed: set[str], vocabulary: Vocabulary) -> set[str]:
    """What a follow-up that typed only a kind of value or a day asks it of: the words the search
    query carried. "and how long does it take?": the carried words not of that kind ("last week"
    after "how long" is none); "and on Sundays?" after the shop's opening hours: the carried
    words that are no day ("We do not deliver on Sundays" is no opening hour). Else empty."""
    if typed and all(vocabulary.is_calendar(k) for k in typed):
        return {k for k in need.groups if k not in need.own and not vocabulary.is_calendar(k)}
    if not all(k.startswith("~") for k in typed):
        return set()
    kinds = {label for k in typed for label in labels(k)}
    return {k for k in need.carried if not set(labels(k)) & kinds}


def asks_own(asked: str, v: Vocabulary) -> bool:
    """Whether ``asked`` is about the asker's own things (the language's ``asker_owns``; a
    language may have none)."""
    owns = v.language.patterns.get("asker_owns")
    return bool(owns and owns.search(asked))


def window_asked(asked: str, v: Vocabulary, own_rows_found: bool = False) -> tuple[str, str] | None:
    """The window of time ("this week") a question about the asker's own things asks, when the
    language reads dates (answerer/dates.py). With ``own_rows_found`` (rows of the asker's are
    among the passages), any question asking a window is read so: "What is ready this week?"."""
    if not v.dates or not (own_rows_found or asks_own(asked, v)):
        return None
    return asked_window(asked, v.time_window)


def row_date(p: Passage, v: Vocabulary, today: date) -> datetime | None:
    """The first date an asker's row ``p`` writes in its text, else in its heading."""
    return v.dates.first(" ".join(s.text for s in p.sentences), today) or v.dates.first(p.heading_leaf, today)


@dataclass
class _Scoring:
    """Scores the sentences for one need (``AnswerSelector.select``)."""

    need: Need
    idf: dict[str, float]
    vocabulary: Vocabulary
    rank_prior: float
    eligible: list[tuple[Passage, Sentence]] = field(default_factory=list)

    def __post_init__(self) -> None:
        need, v = self.need, self.vocabulary
        self.own_total = sum(self.idf[k] for k in need.own) or 1.0
        self.all_total = sum(self.idf[k] * w for k, w in need.groups.items()) or 1.0
        self.asked_labels = {label for k in need.own for label in labels(k)}
        self.openings = tuple(f"{article}{' '.join(subject)}" for subject in need.subjects
                              for article in ("", v.messages["article"]))
        self.decisive = [k for k in need.own if set(labels(k)) & v.group_class("decisive")]
        self.charging_time = asks_charging_time(need.asked, v) and "charging" in self.asked_labels
        self.capacities = capacities(need.asked, v)
        self.typed = need.own - need.carried
        self.carried_topic = _carried_topic(need, self.typed, v)
        self.number = v.pattern("number")
        self.duration = v.language.patterns.get("duration")  # optional: a language may have none
        self.days_said = v.language.patterns.get("days_said")  # optional too
        self.number_range = v.language.patterns.get("number_range")  # optional too
        self.initialisms = {k for k in need.own if "=" not in k and _initialism(
            word_of(k), span_of(need.asked, [k]) or need.labels.get(k, ""), need.asked)}
        # Which days a sentence names answers a day asked only when no sentence states that day
        # ("Which classes are on Saturday?": "Yoga is on Saturday", not "Spin ... Monday to Friday").
        self.days_asked = {k for k in need.own if stem(word_of(k)) in v.days_asked and (
            not v.is_calendar(k) or not self._states_day_of_the_rest(k))}
        self._page_named: dict[int, tuple[str, ...] | None] = {}
        self._read_asker_terms(need, v)

    def _read_asker_terms(self, need: Need, v: Vocabulary) -> None:
        """What a question about the asker's own things asks of their rows: a window of time,
        the soonest, their act, a time of day."""
        self.asks_own = asks_own(need.asked, v)
        # "What do I have booked this week?": the window's words are stated by the asker's rows
        # dated in it, and by none of their others (answerer/dates.py).
        self.now = timezone.localtime().replace(tzinfo=None)  # the site's TIME_ZONE, as rows write dates
        self.window = window_asked(need.asked, v, any(p.asker_own for p, _ in self.eligible))
        # "What is ready this week?" says no "my", but the asker's rows found answer it as theirs.
        self.reads_own = self.asks_own or self.window is not None
        said = {stem(w) for w in words(self.window[1])} if self.window else set()
        self.window_keys = {k for k in need.groups if stem(word_of(k)) in said}
        self.soonest = self.asks_own and self.window is None and bool({stem(w) for w in words(need.asked)} & {
            stem(w) for w in v.soonest})
        self._when: dict[tuple[int, int], datetime | None] = {}
        self._row_said: dict[tuple[int, str], bool] = {}
        # "Which orders have I placed?": the asker's row is the record of their act ("You ordered ...").
        act = v.language.patterns.get("asker_act") if self.asks_own else None  # optional
        acts = {stem(next(g for g in m.groups() if g)) for m in act.finditer(need.asked)} if act else set()
        self.act_keys = {k for k in need.own if stem(word_of(k)) in acts}
        self.clock_keys = {k for k in need.own if stem(word_of(k)) in v.clock_words} if (
            v.clock_question and v.clock_question.search(need.asked)) else set()

    def _states_day_of_the_rest(self, day: str) -> bool:
        """Whether an eligible sentence states ``day`` about all else that was asked, in its words
        or its passage's headings: a shop's "closed on Sunday" says nothing of whether deliveries
        run on Sundays, or whether the recycling centre is open then."""
        v = self.vocabulary
        rest = [k for k in self.need.own if k != day and not v.is_calendar(k) and stem(word_of(k)) not in v.days_asked]
        return any(v.covers(day, s.stems) and all(
            v.covers(k, s.stems) or v.covers(k, p.heading_stems) or v.covers(k, p.title_stems) for k in rest)
            for p, s in self.eligible)

    def excluded(self, p: Passage, s: Sentence) -> bool:
        """Sentences that cannot answer, whatever their words."""
        v = self.vocabulary
        if any(not v.covers(k, s.stems) and not v.covers(k, p.heading_stems) for k in self.decisive):
            return True  # "Is there a student discount?" is not answered by "$200 off" for a trade-in
        if self.carried_topic and not any(
                v.covers(k, s.stems) or v.covers(k, p.heading_stems) or v.covers(k, p.title_stems)
                for k in self.carried_topic):
            return True  # "and how long does it take?" is answered of what the search query carried
        if (self.carried_topic and not self.need.wants_amount and s.has_money
                and not any(v.covers(k, s.stems) for k in self.typed)
                and not self.number.search(_AMOUNT_RE.sub("", s.text))):
            return True  # ... and not by the carried topic's price alone (no length, no Sunday in it)
        if self.charging_time and not states_charging_time(s.text, v):
            return True  # "How long does it take to recharge?" is not "eight hours ... on one charge"
        # "Is there a 128 GB Nimbus Tab?" is not answered by "$449 with 64 GB"
        return bool(self.capacities) and not self.capacities <= capacities(s.text, v)

    def coverage(self, p: Passage, s: Sentence) -> tuple[float, float]:
        """(share of the user's own asked words stated, share of everything asked, weighted)."""
        need, v = self.need, self.vocabulary
        own_cov = all_cov = 0.0
        for key, weight in need.groups.items():
            if key in self.window_keys and p.asker_own:
                evidence = float(self.in_window(p, s))
                all_cov += evidence * weight * self.idf[key]
                own_cov += evidence * self.idf[key] if key in need.own else 0.0
                continue
            evidence = self._stated(key, s)
            if not evidence and key in self.act_keys and p.asker_own and not self._row_states(p, key):
                evidence = 1.0  # "Which orders have I placed?": "You ordered ..." records the act
            if evidence and key in need.own and _qualifies_a_fault(key, s, self.asked_labels, v):
                evidence *= FAULT_QUALIFIER_EVIDENCE  # "covers battery failure" is no battery life
            # The asker's own row is one record: its title ("Your appointment: Biscuit") says what
            # every sentence of it is, when they ask about their own things.
            evidence = evidence or (1.0 if self.reads_own and p.asker_own else 0.6) * v.covers(key, p.heading_stems)
            if not evidence and key in need.carried:
                # What the value is of may be the page's topic: "A standard visit lasts about two
                # hours." under "Plant care service > How long a visit takes".
                evidence = 0.6 * v.covers(key, p.title_stems)
            elif not evidence and key in need.own and (self._names_page_and_section(p)
                                                       or self._names_page_and_sentence(p, s)):
                evidence = TITLE_EVIDENCE * v.covers(key, p.title_stems)
            if evidence:
                all_cov += evidence * weight * self.idf[key]
                if key in need.own:
                    own_cov += evidence * self.idf[key]
        for a, b in need.adjacent:  # "wireless earbuds ... one charge" is no wireless charging
            if _apart(a, b, s, v):
                own_cov -= PROXIMITY_PENALTY * min(self.idf[a], self.idf[b])
        return own_cov / self.own_total, all_cov / self.all_total

    def when(self, p: Passage, s: Sentence | None = None) -> datetime | None:
        """The date an asker's row ``p`` gives in sentence ``s`` (of several, the one after the
        last asked word before one: "borrowed on 1 December; due back on 22 December" is the
        22nd for "When is my next loan due?"), else the first its text or heading writes."""
        key = (id(p), s.position if s is not None else -1)
        if key not in self._when:
            v, today = self.vocabulary, self.now.date()
            found = v.dates.all(s.text, today) if s is not None and v.dates else []
            if found:
                self._when[key] = self._anchored(s.text, found)
            else:
                self._when[key] = row_date(p, v, today) if v.dates else None
        return self._when[key]

    def _anchored(self, text: str, found: list[tuple[int, datetime]]) -> datetime:
        if len(found) == 1:
            return found[0][1]
        v, asked = self.vocabulary, [k for k in self.need.own if k not in self.window_keys]
        places = [m.start() for m in _WORD_RE.finditer(text)
                  if any(v.covers(k, frozenset({stem(m.group(0).lower())})) for k in asked)]
        before = [at for at in places if at < found[-1][0]]
        if not before:
            return found[0][1]
        return next(when for start, when in found if start > before[-1])

    def _row_states(self, p: Passage, key: str) -> bool:
        """Whether a sentence of the asker's row ``p`` states ``key`` in its own words: then that
        sentence says their act ("You booked ..."), not its others ("Your booking reference is ...")."""
        cache = (id(p), key)
        if cache not in self._row_said:
            self._row_said[cache] = any(self._stated(key, t) for t in p.sentences)
        return self._row_said[cache]

    def in_window(self, p: Passage, s: Sentence | None = None) -> bool:
        """Whether ``p`` (its sentence ``s``) is dated in the window of time asked."""
        when = self.when(p, s)
        if when is None or self.window is None:
            return False
        first, last = window_span(self.window[0], self.now.date())
        return first <= when.date() <= last

    def upcoming(self, when: datetime) -> bool:
        """Whether a row dated ``when`` is still to come (a date without a time: all that day)."""
        return when >= self.now or (when.date() == self.now.date() and when.time() == time(0, 0))

    def _stated(self, key: str, s: Sentence) -> float:
        """How strongly ``s`` itself states ``key``: its words and the table's, or a value of the
        asked kind written as such (an amount, a figure, a code, a number of days)."""
        v = self.vocabulary
        evidence = v.covers(key, s.stems)
        if s.has_money and "price" in labels(key):
            return max(evidence, SYNONYM_EVIDENCE)  # "$200" states a price
        if s.has_number and stem(word_of(key)) in v.figure_words and _FIGURE_RE.search(_AMOUNT_RE.sub("", s.text)):
            return max(evidence, SYNONYM_EVIDENCE)  # "phone 01632 960 400" states a number
        if not evidence and key in self.initialisms and _spelled_by_initials(word_of(key), s.text, v.stopwords):
            return 1.0  # "fps" is "frames per second"
        if not evidence and self._says_days(key, s):
            return SYNONYM_EVIDENCE  # "Deliveries run Tuesday to Saturday" answers "on Sundays?"
        if key in self.clock_keys and s.has_number and says_clock_time(s.text):
            return 1.0  # "What time is my session?": "... on Tuesday 8 December at 10:00"
        if evidence or not s.has_number:
            return evidence
        if self.number_range is not None and _in_a_stated_span(word_of(key), self.need.asked, s.text, self.number_range):
            return 1.0  # "a gift worth £100": "£50 to £150: record it in the gifts register"
        if _coded(word_of(key), s.stems):
            return 1.0  # "IP rating": "rated IPX4" writes the IP rating as its code
        if key.startswith("~") and self.duration and "duration" in labels(key) and self.duration.search(s.text):
            # "3 to 5 working days" says how long as fully as "within" does; a question's own
            # "weeks" is not asked of "25p a day"
            return 1.0
        return evidence

    def _says_days(self, key: str, s: Sentence) -> bool:
        """Whether ``key`` asks which days (a day's name, "what days") and ``s`` says which."""
        return self.days_said is not None and key in self.days_asked and self.days_said.search(s.text) is not None

    def _title_named(self, p: Passage) -> tuple[str, ...] | None:
        """The asked words ``p``'s title does not state, when the question names the page by its
        whole title (every word of it but stop and generic words); ``None`` when it does not."""
        if id(p) not in self._page_named:
            v, own = self.vocabulary, self.need.own
            named = {st for st in p.title_stems if st not in v.stopwords and st not in v.generic}
            whole = bool(named) and all(any(v.covers(k, frozenset({st})) for k in own) for st in named)
            self._page_named[id(p)] = tuple(k for k in own if not v.covers(k, p.title_stems)) if whole else None
        return self._page_named[id(p)]

    def _names_page_and_section(self, p: Passage) -> bool:
        """Whether the question names ``p``'s page by its whole title and asks its section too (the
        heading states an asked word the title does not): "How do I get a loyalty card?" beside
        "Loyalty card > Getting a card". Its title's words then count for the section's sentences
        ("Cards are issued on the spot"). A question of the title's words alone ("What does the
        loyalty card give me?") is the page's opening's to answer."""
        rest = self._title_named(p)
        return bool(rest) and any(self.vocabulary.covers(k, p.heading_stems) for k in rest)

    def _names_page_and_sentence(self, p: Passage, s: Sentence) -> bool:
        """Whether the question names ``p``'s page by its whole title and ``s`` states every other
        word it asks: "Which classes are on Saturday?" beside "Classes > Yoga": "Yoga is on
        Saturday at 10am." (the title says what "Yoga" is)."""
        rest = self._title_named(p)
        return bool(rest) and len(rest) < len(self.need.own) and all(
            self.vocabulary.covers(k, s.stems) for k in rest)

    def choice(self, p: Passage, s: Sentence) -> Choice:
        need = self.need
        own_cov, all_cov = self.coverage(p, s)
        score = own_cov + 0.3 * all_cov - self.rank_prior * (p.index - 1)
        if need.wants_amount and s.has_currency:
            score += 0.25
        elif need.wants_number and s.has_number:
            score += 0.15
        score -= 0.002 * max(0, len(s.stems) - 30)
        if _has_other_topic(s, need, self.vocabulary):  # "10% off the price" is not the price
            score -= 0.3
        if self.openings and fold(s.text).startswith(self.openings):
            score += SUBJECT_OPENING_BONUS  # "Zephyr Buds cost $149", not "a replacement bud costs"
        elif need.subjects and p.subject not in need.subjects and names_subject(s, need.subjects):
            # A subject no heading is about ("Visitor Card" in "Who can join") is named where it is
            # stated: "...can buy a Visitor Card for £12 a year", not "...can join for free".
            score += SUBJECT_OPENING_BONUS
        return Choice(p, s, score, own_cov)


def _other_case(first: Sentence, then: Sentence, v: Vocabulary) -> bool:
    """Whether ``then`` is another case of the situation ``first`` answers: both open with a
    case opener ("If you lose your phone, ..." then "If you have no backup codes left, ...")."""
    return bool(v.case_openers) and all(next(iter(words(s.text)), "") in v.case_openers for s in (first, then))


def _whole_list(item: Choice, in_passage: list[Choice]) -> list[Choice]:
    """The bulleted list ``item`` stands in, from its first line to its last (at most
    ``MAX_LIST_ITEMS``), of the passage's choices in order: what a heading alone asked for
    ("What ingredients do I need?" over "Ingredients") is the whole list, not its closest line
    (a recipe site's trial was given 2 of 6 ingredients)."""
    lines = {c.sentence.position: c for c in in_passage if c.sentence.item}
    first = item.sentence.position
    while first - 1 in lines:
        first -= 1
    if item.sentence.position - first >= MAX_LIST_ITEMS:
        return [item]
    run = []
    while first in lines and len(run) < MAX_LIST_ITEMS:
        run.append(lines[first])
        first += 1
    return run


def _labelled(parts: list[Choice]) -> list[Choice]:
    """One of several rows of the asker's quoted, what its title names said before it when its
    sentences do not ("Heron Suite \N{EM DASH} Your booking reference is HH-2041"): three
    references in a row say nothing of which stay each is."""
    passage = parts[0].passage
    named = passage.subject_name or passage.heading_leaf.rsplit(":", 1)[-1].strip()
    if not named or any(named.lower() in c.sentence.text.lower() for c in parts):
        return parts
    return [replace(parts[0], label=named), *parts[1:]]


def _no_note(reason: str, best: Choice | None = None) -> list[Choice]:
    return []


def _choice_dict(c: Choice) -> dict:
    """A sentence as the trace keeps it: where it is (its passage's citation number, its place in
    the passage from 1) and its scores. Never its text: a document's words stay in the document,
    where access rules and redactors apply (the admin names the passage for who may read it)."""
    return {"passage": c.passage.index, "sentence": c.sentence.position + 1,
            "coverage": round(c.coverage, 3), "similarity": round(c.similarity, 3)}


@dataclass
class Why:
    """What ``AnswerSelector.explained`` records of one answer: its outcome and, for each search
    of the sentences that found none good enough, the reason and the closest sentence."""

    outcome: str = ""  # answered, declined, unknown_subject, compared, no_passages
    asked: list[str] = field(default_factory=list)  # the asked words, as a decline names them
    subjects: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    missing: str = ""  # what a decline says the documents do not state
    picked: list[dict] = field(default_factory=list)
    parts: dict = field(default_factory=dict)  # a question of several parts: how many were answered
    attempts: list[dict] = field(default_factory=list)
    # The asker's rows read by their dates: {"order": "soonest", "window" or "earliest", "window": "this week"}.
    by_date: dict = field(default_factory=dict)

    def attempt(self, reason: str, best: Choice | None = None) -> list[Choice]:
        """A search of the sentences that returned none, and why; always ``[]``."""
        self.attempts.append({"reason": reason, **({"closest": _choice_dict(best)} if best else {})})
        return []

    def answered(self, picked: list[Choice], parts: int = 0, unanswered: int = 0) -> None:
        self.outcome, self.picked = "answered", [_choice_dict(c) for c in picked]
        if parts:
            self.parts = {"asked": parts, "unanswered": unanswered}

    def as_dict(self, selector: AnswerSelector) -> dict:
        found = {"outcome": self.outcome or "answered", "asked": self.asked, "subjects": self.subjects,
                 "unknown": self.unknown, "missing": self.missing, "picked": self.picked, "parts": self.parts,
                 "attempts": self.attempts, "by_date": self.by_date}
        thresholds = {"min_coverage": selector.min_coverage}
        if selector.similarity is not None:
            thresholds.update(min_similarity=selector.min_similarity, other_topic_similarity=OTHER_TOPIC_SIMILARITY)
        return {key: value for key, value in found.items() if value} | {"thresholds": thresholds}


class AnswerSelector:
    """The engine, independent of Django and the pipeline: ``answer(prompt) -> str``."""

    def __init__(self, *, vocabulary: Vocabulary | None = None, min_coverage: float = DEFAULT_MIN_COVERAGE,
                 max_sentences: int = 4, rank_prior: float = 0.1, no_answer: str | None = None,
                 similarity: SentenceSimilarity | None = None, semantic_weight: float = SEMANTIC_WEIGHT,
                 min_similarity: float = MIN_SIMILARITY, near_word_similarity: float = NEAR_WORD_SIMILARITY,
                 space: str = ""):
        if isinstance(min_coverage, bool) or not isinstance(min_coverage, (int, float)) or not 0 <= min_coverage <= 1:
            raise ValueError(f"min_coverage must be a number from 0 to 1, not {min_coverage!r}")
        if isinstance(max_sentences, bool) or not isinstance(max_sentences, int) or max_sentences < 1:
            raise ValueError(f"max_sentences must be a whole number of at least 1, not {max_sentences!r}")
        self.vocabulary = vocabulary or default_vocabulary()
        self.messages = self.vocabulary.messages
        self.min_coverage = min_coverage
        self.max_sentences = max_sentences
        self.rank_prior = rank_prior
        self.no_answer = self.messages["no_answer"] if no_answer is None else no_answer
        for name, value in (("semantic_weight", semantic_weight), ("min_similarity", min_similarity),
                            ("near_word_similarity", near_word_similarity)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not -1 <= value <= 10:
                raise ValueError(f"{name} must be a number, not {value!r}")
        self.similarity = similarity
        # The embedding space of ``similarity``'s model: vectors stored with a chunk are used
        # only when they are of this space (``answerer.stored``).
        self.space = space if similarity is not None else ""
        # Per turn, with a model that measures its words (``reading_meaning``): each question
        # word's stem -> its vector's length, which weighs it as a light word (``light_weight``).
        self.word_norms: dict[str, float] = {}
        self.semantic_weight = float(semantic_weight)
        self.min_similarity = float(min_similarity)
        self.near_word_similarity = float(near_word_similarity)

    # The subject guard ------------------------------------------------------------------------
    def on_subject(self, passage: Passage, sentence: Sentence, subjects: set[Entity],
                   known: set[Entity], heads: frozenset[Entity] = frozenset()) -> bool:
        """A sentence naming a subject is on it; otherwise it must come from a passage about a
        subject (its heading's, or one its sentences name: "It senses 4,096 levels" under
        Nimbus Tab > Stylus is about the Nimbus Pen named before it) and not be about an entity
        foreign to that passage: one that heads another passage ("Zephyr Buds" of "Zephyr Buds
        > Warranty"), or that the sentence opens with. Other names in passing (people, places in
        an encyclopedia article) do not make a sentence off-subject."""
        names = {tuple(n.split()) for n in sentence.names} & known
        if names & subjects or (passage.subject not in subjects and names_subject(sentence, subjects)):
            return True  # also "DVDs are lent for one week.": a name that opens a sentence is no run
        if passage.subject not in subjects and not any(
                {tuple(n.split()) for n in other.names} & subjects for other in passage.sentences) and not any(
                subject and all(stem(t) in passage.title_stems for t in subject) for subject in subjects):
            # ... or a topic page titled with its name in lower case ("Puppy health plan >
            # Joining" is about the Puppy Health Plan its price sentence names).
            return False
        own = set(passage.subject)
        opening = fold(sentence.text)
        article = self.messages["article"]
        for name in names:
            if set(name) & own:
                continue
            folded = " ".join(name)
            if name in heads or opening.startswith((folded, article + folded)):
                return False
        return True

    #: Per call of ``explained``: why the answer is what it is (``Why``); ``None`` otherwise.
    why: Why | None = None

    def answer(self, prompt: Prompt) -> str:
        return self._answer(prompt, None)

    def explained(self, prompt: Prompt) -> tuple[str, dict]:
        """``answer(prompt)`` and why, as a JSON-ready dictionary for the turn's trace: the
        outcome, the asked words, and the closest sentence with its scores against the
        thresholds (docs/answerer.md, "Why this answer")."""
        why = Why()
        text = self._answer(prompt, why)
        return text, why.as_dict(self)

    def _answer(self, prompt: Prompt, why: Why | None) -> str:
        stored = read_stored(prompt.documents, self.vocabulary, self.space)
        passages = build_passages(prompt.documents, self.vocabulary, stored)
        if not any(p.sentences for p in passages):
            if why is not None:
                why.outcome = "no_passages"
            return self.no_answer
        reader = copy.copy(self) if self.similarity is None else self.reading_meaning(prompt, passages)
        reader.why = why
        return reader.answer_from(prompt, passages)

    def reading_meaning(self, prompt: Prompt, passages: list[Passage]) -> AnswerSelector:
        """This selector for one turn, its vocabulary widened by the model's word neighbours
        (``NearWords``) among the words of ``passages``; the sentence vectors the passages brought
        from their rows (read at ingestion) are used, not computed again."""
        v = self.vocabulary
        light = v.stopwords | v.generic
        passage_words: dict[str, str] = {}
        for p in passages:
            found = p.words if p.words is not None else (
                pair for s in p.sentences for pair in candidate_words(s.text, light))
            for st, w in found:
                passage_words.setdefault(st, w)
        for p in passages:
            for st, w in p.leaf_words if p.leaf_words is not None else candidate_words(p.heading_leaf, light):
                passage_words.setdefault(st, w)
        surface = {stem(w): w for w in words(f"{prompt.question} {prompt.search_query or ''}") if w.isalpha()}
        turn = copy.copy(self)
        norms = self.similarity.norms(list(surface.values()))
        turn.word_norms = {st: norms[w] for st, w in surface.items() if w in norms}
        stored: dict = {}
        tokens: dict = {}
        for p in passages:
            stored.update(p.vectors)
            tokens.update(p.tokens)
        if stored or tokens:
            turn.similarity = StoredVectors(self.similarity, stored, tokens)
        turn.vocabulary = NearWords(v, turn.similarity, passage_words, surface, threshold=self.near_word_similarity,
                                    evidence=NEAR_WORD_EVIDENCE)
        return turn

    def answer_from(self, prompt: Prompt, passages: list[Passage]) -> str:
        """The answer to ``prompt`` from its ``passages`` (``build_passages``)."""
        # Markup in a message is no part of what it asks ("<script>...</script> How much is it?").
        question = as_the_asker(without_markup(prompt.question), prompt.asker_names, self.vocabulary)
        search_query = as_the_asker(without_markup(prompt.search_query or prompt.question), prompt.asker_names,
                                    self.vocabulary)
        need = analyse_query(question, search_query, passages, self.vocabulary)
        if self.why is not None:
            self.why.asked = [need.labels.get(k, k) for k in need.groups if k in need.own]
            self.why.subjects = sorted(" ".join(s) for s in need.subjects)
        if need.unknown and not need.subjects:
            # "Does the Galaxy S9 have a warranty?": another product's warranty is no answer.
            names = self.messages["names_joiner"].join(dict.fromkeys(need.unknown[:MAX_ECHOED_NAMES]))
            if self.why is not None:
                self.why.outcome, self.why.unknown = "unknown_subject", list(dict.fromkeys(need.unknown))
            return self.messages["unknown_subject"].format(names=echoed(names))
        if self.vocabulary.pattern("comparison").search(question) and (not need.subjects or len(need.subjects) > 1):
            compared = self.compare(need, passages)
            if compared:
                if self.why is not None:
                    self.why.outcome = "compared"
                return compared
        eligible = self.eligible(need, passages)
        parts = question_parts(question, self.vocabulary)
        if len(parts) < 2:
            picked = self.pick(need, passages, eligible)
            if not picked and self._asks_on_its_own(need, question):
                free, free_eligible = self._without_carried_subjects(need, passages)
                found = self.pick(free, passages, free_eligible)
                if any(c.coverage >= FULL_COVERAGE for c in found):  # a sentence stating all it asks
                    need, eligible, picked = free, free_eligible, found
                    if self.why is not None:
                        self.why.subjects = []
            if picked and self.why is not None:
                self.why.answered(picked)
            return self.cited(picked) if picked else self.decline(need, passages, eligible)
        return self.answer_parts(parts, need, (question, search_query), passages, eligible)

    def _asks_on_its_own(self, need: Need, question: str) -> bool:
        """Whether a question whose subjects the search query alone carried points back at nothing:
        no pronoun ("it" in "does it take to get a new laptop" is none) and no "and ...?" opening.
        Its own words may then ask a thing of its own ("How long does it take to get a new laptop?"
        after "Has my Illustrator request been approved?")."""
        if not need.subjects_carried:
            return False
        patterns = self.vocabulary.language.patterns
        anaphora = self.vocabulary.language.words.get("anaphora", frozenset())
        expletive, ellipsis = patterns.get("expletive_it"), patterns.get("ellipsis")
        text = expletive.sub("", question) if expletive else question
        return not (set(words(text)) & anaphora) and not (ellipsis and ellipsis.match(text))

    def _without_carried_subjects(self, need: Need, passages: list[Passage]) -> tuple[Need, list]:
        """``need`` about no subject, and its eligible sentences: those of passages about no
        subject that name none of the carried ones (a topic page, such as "Hardware > New laptops")."""
        carried = need.subjects
        free = replace(need, subjects=set(), subjects_carried=False)
        eligible = [(p, s) for p, s in self.eligible(free, passages)
                    if not p.subject and not names_subject(s, carried)]
        return free, eligible

    def answer_parts(self, parts: list[str], need: Need, texts: tuple[str, str], passages: list[Passage],
                     eligible: list[tuple[Passage, Sentence]]) -> str:
        """"How many watts does it take, and how long till it's half full?": each part is answered
        on its own (one part's words would dilute the other's), the subject (and so the eligible
        sentences) from the whole; a part not answered is said to be missing."""
        answered: list[Choice] = []
        unanswered: list[Need] = []
        for part in parts:
            part_need = analyse_query(*texts, passages, self.vocabulary, asked=part)
            picked = self.pick(part_need, passages, eligible) if part_need.own else []
            if picked:
                answered += [c for c in picked if all(c.sentence is not a.sentence for a in answered)]
            elif part_need.own:
                unanswered.append(part_need)
        if not answered:
            return self.decline(need, passages, eligible)
        if self.why is not None:
            self.why.answered(answered[:self.max_sentences + 1], parts=len(parts), unanswered=len(unanswered))
        text = self.cited(answered[:self.max_sentences + 1])
        stated = frozenset().union(*(c.sentence.stems | c.passage.heading_stems for c in answered))
        unanswered = [n for n in unanswered if not any(self.vocabulary.covers(k, stated) for k in n.own)]
        for part_need in unanswered:  # say what is missing, without the list of what was found
            text += " " + self.decline(part_need, passages, eligible).split(". ")[0]
            text = text if text.endswith(".") else text + "."
        return text

    def compare(self, need: Need, passages: list[Passage]) -> str:
        """"Which product is the cheapest?": each subject's own answer (of the subjects the question
        names, when it names several), for the reader to compare (the answerer quotes, it does
        not rank), or "" when fewer than two subjects state it."""
        found = []
        for subject in dict.fromkeys(p.subject for p in passages if p.subject):
            if need.subjects and subject not in need.subjects:
                continue  # "Which lasts longer, the Nimbus Tab or the Zephyr Buds?": those two
            one = replace(need, subjects={subject})
            picked = self.select(one, passages, self.eligible(one, passages))
            if picked and picked[0].coverage >= COMPARED_COVERAGE:
                found.append(picked[0])
        return self.cited(found[:self.max_sentences]) if len(found) > 1 else ""

    def pick(self, need: Need, passages: list[Passage], eligible: list[tuple[Passage, Sentence]]) -> list[Choice]:
        """The answer to ``need`` from the on-subject sentences, else from the shop's policy ones;
        from those first when the on-subject answer states none of the asked words (it is close
        by the subject's name alone: "Zephyr Buds cost $149." for "and for the Zephyr Buds?"
        after the returns policy) and a policy sentence states them."""
        picked = self.select(need, passages, eligible)
        if picked and any(c.coverage for c in picked):
            return picked
        shop = self.policy(need, passages)
        stated = self.select(need, passages, shop) if shop else []
        if picked and not any(c.coverage for c in stated):
            return picked
        return stated

    def policy(self, need: Need, passages: list[Passage]) -> list[tuple[Passage, Sentence]]:
        """The shop's own policy sentences, for a question about a product that its passages do
        not answer ("How long do I have to return them?" after the Zephyr Buds): sentences of a
        passage about another subject, when the question asks a ``policy`` class attribute, the
        passage's heading names it ("Returns") and no sentence of it names another catalogue
        subject. Empty otherwise (a product's warranty is never another product's)."""
        asked = {label for k in need.own for label in labels(k)} & self.vocabulary.group_class("policy")
        if not need.subjects or not asked:
            return []
        heads = {p.subject for p in passages if p.subject}
        found = []
        for p in passages:
            if p.subject in need.subjects or not {label for st in p.heading_stems
                                                  for label in self.vocabulary.of_stem.get(st, ())} & asked:
                continue
            names = {tuple(n.split()) for s in p.sentences for n in s.names}
            if any(name in heads and name != p.subject and not set(name) <= set(p.subject) for name in names):
                continue
            found += [(p, s) for s in p.sentences]
        return found

    def eligible(self, need: Need, passages: list[Passage]) -> list[tuple[Passage, Sentence]]:
        """The (passage, sentence) pairs on the question's subject."""
        known = {p.subject for p in passages if p.subject} | {
            tuple(n.split()) for p in passages for s in p.sentences for n in s.names}
        heads = frozenset(p.subject for p in passages if p.subject)
        # A name the question asks of its subject ("homework club ... at millbrook") is not
        # foreign to a passage about that subject, even where a sentence opens with it.
        known -= need.mentioned - heads
        return [(p, s) for p in passages for s in p.sentences
                if not need.subjects or self.on_subject(p, s, need.subjects, known, heads)]

    @staticmethod
    def cited(picked: list[Choice]) -> str:
        """The picked sentences with their citations; lines of a list as a list, one a line."""
        said = [cite(f"{c.label} \N{EM DASH} {c.sentence.text}" if c.label else c.sentence.text, c.passage.index)
                for c in picked]
        if len(picked) > 1 and all(c.sentence.item and not c.label for c in picked):
            return "\n".join(f"- {line}" for line in said)
        return " ".join(said)

    def describe(self, need: Need, eligible: list[tuple[Passage, Sentence]]) -> list[Choice]:
        """No attribute asked ("Tell me about the Aurora X2"): the subject's description, which
        a document gives first: the on-subject passage earliest in its document (the retrieval
        rank breaks ties), not whichever section was ranked first."""
        naming = [(p, s) for p, s in eligible if {tuple(n.split()) for n in s.names} & need.mentioned]
        if naming:  # "And the pen?": what the passages say of the Nimbus Pen, from where they name it
            # A sentence opening with the name is about it ("The Nimbus Pen attaches..."), one
            # naming it in passing is about something else ("the bundle with the Nimbus Pen").
            article = self.messages["article"]
            p, first = min(naming, key=lambda ps: (not any(
                fold(ps[1].text).startswith((" ".join(e), article + " ".join(e))) for e in need.mentioned),
                ps[0].index, ps[1].position))
            return [Choice(p, s, 0.0, 0.0) for q, s in eligible if q is p and s.position >= first.position][:2]
        opening = min({id(p): p for p, _ in eligible}.values(), key=lambda p: (p.ordinal, p.index))
        return [Choice(p, s, 0.0, 0.0) for p, s in eligible if p is opening][:2]

    def select(self, need: Need, passages: list[Passage], eligible: list[tuple[Passage, Sentence]]) -> list[Choice]:
        """The sentences of ``eligible`` (``self.eligible(need, passages)``) that answer ``need``,
        in order; empty when none states enough of it."""
        note = self.why.attempt if self.why is not None else _no_note
        if not eligible:
            return note("no_sentence_on_subject")
        if not need.own:
            return self._nothing_asked(need, passages, eligible)
        scoring = self._scoring(need, passages, eligible)
        choices = [scoring.choice(p, s) for p, s in eligible if not scoring.excluded(p, s)]
        if need.must_amount:  # "how much" is answered by an amount, not by a description
            choices = [c for c in choices if c.sentence.has_currency]
        if need.wants_number:  # "how long / how many / how heavy" is answered by a quantity
            choices = [c for c in choices if c.sentence.has_number or c.sentence.has_currency]
        if not choices:
            return note("no_amount" if need.must_amount else "no_number" if need.wants_number else "no_sentence")
        if self.similarity is not None:
            choices = self.with_similarity(need, choices)
        best = max(choices, key=lambda c: (c.score, -c.passage.index, -c.sentence.position))
        if scoring.reads_own:
            best = self._asker_own_first(best, choices)
        if best.coverage < self.min_coverage and best.similarity < self.min_similarity:
            return note("below_threshold", best)
        if (self.similarity is not None and best.similarity < OTHER_TOPIC_SIMILARITY
                and not (scoring.reads_own and best.passage.asker_own)  # their own row is their topic
                and _topics_elsewhere(need, eligible, best.passage, self.vocabulary)):
            # "Do you deliver on Saturdays?" is not answered by the support lines' Saturday hours
            return note("other_topic", best)
        if scoring.window and scoring.asks_own and not best.passage.asker_own and any(
                c.passage.asker_own and scoring.when(c.passage, c.sentence) for c in choices):
            return note("none_in_window", best)  # "... this week?": all their dated rows are later
        listed = self._listed(best, choices, scoring)
        self._note_by_date(listed, scoring)
        said = [self.compose(row, choices, need) for row in listed]
        if len(listed) > 1 and best.passage.asker_own:
            said = [_labelled(parts) for parts in said]
        return [c for parts in said for c in parts]

    def _scoring(self, need: Need, passages: list[Passage], eligible: list[tuple[Passage, Sentence]]) -> _Scoring:
        return _Scoring(need, _weights(need, passages, eligible, self.vocabulary, self.word_norms),
                        self.vocabulary, self.rank_prior, eligible)

    def _nothing_asked(self, need: Need, passages: list[Passage], eligible: list[tuple[Passage, Sentence]]) -> list[Choice]:
        """No word asked of a sentence: the subject's description (``describe``), or for "When is
        my next stay?" the asker's rows by their dates; only then are the sentences scored."""
        if asks_own(need.asked, self.vocabulary):
            found = self._by_date_alone(eligible, self._scoring(need, passages, eligible))
            if found:
                return found
        return self.describe(need, eligible)

    def _listed(self, best: Choice, choices: list[Choice], scoring: _Scoring) -> list[Choice]:
        """The rows the answer quotes: ``best`` and the rows alike; the asker's by their dates."""
        if not (scoring.reads_own and best.passage.asker_own):
            return [best, *self._rows_alike(best, choices)[:MAX_ROWS_LISTED - 1]]
        if scoring.soonest or scoring.window:  # which of them is a matter of dates, not of words
            rows = self._asker_rows(best, choices)
        else:
            rows = [best, *self._rows_alike(best, choices, asks_own=True)]
        rows = [self._dated_sentence(c, choices, scoring) for c in rows]
        return self._in_time_order(rows, scoring)[:MAX_ROWS_LISTED]

    def _note_by_date(self, listed: list[Choice], scoring: _Scoring) -> None:
        """Tell staff (the trace's "Why this answer") that the asker's rows quoted were picked and
        ordered by their dates, and how: the soonest still to come, those in a window, the earliest first."""
        if self.why is None or not listed or not all(
                c.passage.asker_own and scoring.when(c.passage, c.sentence) for c in listed):
            return
        order = "soonest" if scoring.soonest else "window" if scoring.window else "earliest"
        self.why.by_date = {"order": order, **({"window": scoring.window[1]} if scoring.window else {})}

    def _by_date_alone(self, eligible: list[tuple[Passage, Sentence]], scoring: _Scoring) -> list[Choice]:
        """"When is my next stay?" asks no word a row must state ("stay" says nothing: "Where
        does the pen stay?"), only which row of the asker's comes next, or is dated in a window
        of time: each row's first dated sentence, by date; [] for any other question."""
        if not (scoring.asks_own and (scoring.soonest or scoring.window)):
            return []
        dates, today = self.vocabulary.dates, scoring.now.date()
        rows: dict[int, Choice] = {}
        for p, s in eligible:
            if p.asker_own and p.document_id not in rows and dates.first(s.text, today):
                rows[p.document_id] = Choice(p, s, 0.0, 0.0)
        listed = self._in_time_order(list(rows.values()), scoring)
        if scoring.window and not any(scoring.in_window(c.passage, c.sentence) for c in listed):
            return []  # none in it: the decline says so (``_window_unmet``)
        self._note_by_date(listed[:MAX_ROWS_LISTED], scoring)
        return listed[:MAX_ROWS_LISTED]

    def _asker_rows(self, best: Choice, choices: list[Choice]) -> list[Choice]:
        """``best`` and every other row of the asker's in its source that answers at all (its best
        sentence at ``min_coverage``): "Which dentist am I seeing next?" is the soonest of them,
        not of those naming a dentist as well as the best one does."""
        found = {best.passage.document_id: best}
        for c in sorted(choices, key=lambda c: -c.score):
            p = c.passage
            if (p.asker_own and p.family == best.passage.family and c.coverage >= self.min_coverage
                    and p.document_id not in found):
                found[p.document_id] = c
        return list(found.values())

    @staticmethod
    def _dated_sentence(row: Choice, choices: list[Choice], scoring: _Scoring) -> Choice:
        """``row``, or when its sentence writes no date, the best sentence of its passage that
        does and states as much (any, for "next" or a window of time: "When is my next stay?" is
        answered by a date): "When is my next booking?" and "What have I booked?" are said by
        "You booked ... arriving on 9 December", not by "Your booking reference is HH-2041",
        though both state "booking"; "What is my booking reference?" is still the reference's."""
        dates, today = scoring.vocabulary.dates, scoring.now.date()
        if not dates or dates.first(row.sentence.text, today):
            return row
        by_date = scoring.soonest or scoring.window is not None  # the date is what answers
        dated = [c for c in choices if c.passage is row.passage and (by_date or c.coverage >= row.coverage)
                 and dates.first(c.sentence.text, today)]
        return max(dated, key=lambda c: (c.score, -c.sentence.position), default=row)

    @staticmethod
    def _in_time_order(rows: list[Choice], scoring: _Scoring) -> list[Choice]:
        """The asker's rows by their dates, when each writes one: those in the window of time
        asked ("this week"), or only the soonest still to come ("When is my next loan due?"), or
        all of them from the earliest."""
        when = [scoring.when(c.passage, c.sentence) for c in rows]
        if None in when:
            return rows  # an undated row: the order of their scores
        ordered = sorted(zip(when, rows, strict=True), key=lambda pair: pair[0])
        if scoring.window:
            return [c for _, c in ordered if scoring.in_window(c.passage, c.sentence)] or rows
        if scoring.soonest:
            upcoming = [c for at, c in ordered if scoring.upcoming(at)]
            return upcoming[:1] or [c for _, c in ordered]
        return [c for _, c in ordered]

    @staticmethod
    def _asker_own_first(best: Choice, choices: list[Choice]) -> Choice:
        """A question about the asker's own things ("What orders do I have?") is answered by a row
        only they may read (their order) that states all ``best`` states, over a page everyone
        reads (the delivery page's "Orders over $60 ship free"). "How do I cancel my booking?" is
        still the booking page's: the asker's booking does not state "cancel"."""
        own = [c for c in choices if c.passage.asker_own]
        if not own or best.passage.asker_own:
            return best
        top = max(own, key=lambda c: (c.score, -c.passage.index, -c.sentence.position))
        return top if top.coverage >= best.coverage else best

    def _rows_alike(self, best: Choice, choices: list[Choice], asks_own: bool = False) -> list[Choice]:
        """The other rows of ``best``'s model source that state what was asked as well as it does
        and say it alike (their best sentence close to ``best``'s in meaning: another booking,
        not the booking page's "You can cancel a booking"), in order of score: "What
        appointments do I have?" is answered by each appointment the asker may read, not by the
        first ("Biscuit" but not "Mittens"). None without the semantic model. With ``asks_own``
        (the question is about the asker's own things) and ``best`` a row of the asker's, every
        row of the asker's of that source that states as much is one: no page can be among them."""
        own = asks_own and best.passage.asker_own
        if not best.passage.family or (self.similarity is None and not own):
            return []
        found: dict[int, Choice] = {}
        for c in choices:
            p = c.passage
            if (p.family == best.passage.family and p.document_id != best.passage.document_id
                    and c.coverage >= best.coverage and (p.asker_own if own else
                                                         c.similarity >= best.similarity - ROW_SIMILARITY_MARGIN)
                    and (p.document_id not in found or c.score > found[p.document_id].score)):
                found[p.document_id] = c
        if not found:
            return []
        rows = list(found.values())
        if own:
            return sorted(rows, key=lambda c: (-c.score, c.passage.index))
        likeness = self.similarity.scores(best.sentence.text, [c.sentence.text for c in rows])
        alike = [c for c, x in zip(rows, likeness, strict=True) if x >= ROW_LIKENESS]
        return sorted(alike, key=lambda c: (-c.score, c.passage.index))

    def with_similarity(self, need: Need, choices: list[Choice]) -> list[Choice]:
        """``choices`` scored by their meaning too: each sentence's similarity to what was asked
        (the asking words, or the search query when the attribute came from it)."""
        query = need.searched if need.promoted or not need.asked.strip() else need.asked
        texts = [c.sentence.text for c in choices]
        # A sentence that states none of the asked words answers on its meaning alone only when it
        # is close to the question without the subject's name, which every sentence about the
        # subject shares: "Is there a toy library at Millbrook?" is close to "Millbrook Library is
        # all on one floor." only by the name (0.83; 0.0 without it).
        named = {w for subject in need.subjects for w in subject} if query is need.asked else set()
        unnamed = " ".join(t.group(0) for t in _WORD_RE.finditer(query) if not set(words(t.group(0))) & named)
        bare = [i for i, c in enumerate(choices) if not c.coverage]
        if named and unnamed and unnamed != query and bare:  # both queries in one batch
            scores, without_name = self.similarity.scores_per_query([query, unnamed], texts)
            gates = [without_name[i] if not c.coverage else s for i, (c, s) in enumerate(zip(choices, scores, strict=True))]
        else:
            scores = self.similarity.scores(query, texts)
            gates = list(scores)
        return [replace(c, score=c.score + self.semantic_weight * sim, similarity=gate)
                for c, sim, gate in zip(choices, scores, gates, strict=True)]

    @staticmethod
    def _passage_first(best: Choice, choices: list[Choice], need: Need) -> Choice:
        """The earliest sentence of ``best``'s passage that states all that was asked as ``best``
        does, as close to it in meaning and nearly as well scored: a passage states its rule before its
        exceptions and alternatives ("Tickets can be refunded in full up to 48 hours before..."
        before "Within 48 hours ... cannot be refunded"; the theatre's car park before "The nearest
        public car park..."). Not when the question's context words chose ``best`` ("I'm 70 and my
        books are late. Do I have to pay anything?" is the over-65s' exception's)."""
        if set(need.groups) - need.own or best.coverage < FULL_COVERAGE:
            return best  # a sentence stating part of it may share only a word ("no need to book")
        earlier = [c for c in choices if c.passage is best.passage and c.sentence.position < best.sentence.position
                   and c.coverage >= best.coverage and c.score >= best.score - EARLIER_MARGIN
                   and c.similarity >= best.similarity - EARLIER_MARGIN]
        return min(earlier, key=lambda c: c.sentence.position) if earlier else best

    def compose(self, best: Choice, choices: list[Choice], need: Need) -> list[Choice]:
        """The best sentence, then the sentences that continue its attribute in its passage; the
        sentence just before it too when that one states as much of what was asked ("Orders ship
        within two business days." before "...express delivery arrives the next business day")."""
        v = self.vocabulary
        best = self._passage_first(best, choices, need)
        stated = {k for k in need.own if v.covers(k, best.sentence.stems)}
        in_passage = sorted((c for c in choices if c.passage is best.passage), key=lambda c: c.sentence.position)
        if not stated:  # stated only by the heading ("Pricing" over "$449"): continue on numbers
            stated = {k for k in need.own if v.covers(k, best.passage.heading_stems)}
            if stated and best.sentence.item:  # "What ingredients...?" over "Ingredients": the list
                return _whole_list(best, in_passage)
        picked = [best]
        # A table's row is one case of many: the rows beside it continue its answer only when they
        # state all it states of the question ("green caddy" asked: other bins); and a sentence
        # beside one stating an asked code ("band D", "Aurora X2") must state the code too.
        # (of a row, what the question's own words ask: not a word an earlier turn carried, "pothole")
        asked = {k for k in need.own if k in need.codes or span_of(need.asked, [k])} if best.sentence.row else need.codes
        held = {k for k in asked if v.covers(k, best.sentence.stems)}
        in_passage = [c for c in in_passage if c is best or (not c.sentence.row and not need.codes & held)
                      or all(v.covers(k, c.sentence.stems) for k in held)]
        before = [c for c in in_passage if c.sentence.position == best.sentence.position - 1]
        if before and before[0].coverage >= max(self.min_coverage, best.coverage - PRECEDING_MARGIN) and (
                not need.must_amount or before[0].sentence.has_currency):
            picked.insert(0, before[0])
        expected = best.sentence.position + 1
        for c in (c for c in in_passage if c.sentence.position > best.sentence.position):
            if len(picked) >= self.max_sentences or c.sentence.position != expected:
                break
            own_words = any(v.covers(k, c.sentence.stems) for k in stated)
            same_kind = (need.wants_amount and c.sentence.has_currency and best.sentence.has_currency
                         and not _has_other_topic(c.sentence, need, v))
            if not (own_words or same_kind or _other_case(best.sentence, c.sentence, v)):
                break
            picked.append(c)
            expected += 1
        return picked

    @staticmethod
    def _as_written(need: Need, key: str) -> str:
        """An asked word's label in the user's own capitals and accents ("Saturdays", "café")."""
        written = span_of(need.asked, [key]) if "=" not in key else ""
        return written if written and fold(written) == fold(need.labels[key]) else need.labels[key]

    def _topic(self, need: Need, eligible: list[tuple[Passage, Sentence]]) -> str:
        """The words a decline names as missing."""
        v = self.vocabulary
        # Name what is lacking: "Do you ship to Canada?" lacks Canada, not shipping; "how long"
        # beside another word only says what kind of value was asked.
        asked = [k for k in need.groups if k in need.own and not (k.startswith("~") and len(need.own) > 1)]
        opening = v.language.patterns.get("request_opening")  # optional: a language may have none
        request = opening.match(need.asked) if opening else None
        if request:  # "Show me bob's orders.": "show" is how it was asked
            said = {stem(w) for w in words(request.group(0))}
            asked = [k for k in asked if word_of(k) not in said] or asked
        lacking = [k for k in asked if not any(
            v.covers(k, s.stems) or v.covers(k, p.heading_stems) for p, s in eligible)]
        # Lacking words that a question word parts ("...for staff what is the warranty on them") are
        # not one topic: the attributes the table knows say what was asked ("warranty").
        span = words(span_of(need.asked, lacking)) if len(lacking) > 1 else []
        if any(w in v.wh or w in v.polar for w in span[1:-1]):
            lacking = [k for k in lacking if "=" in k] or lacking
        # A narrow group lacking is named as the group: "wireless charging", not "charge wirelessly".
        narrow = [label for k in lacking for label in labels(k) if label in v.group_class("decisive")]
        missing = [self._as_written(need, k) for k in (lacking or asked)] or [self.messages["nothing_named"]]
        # Every asked word stated, but never together ("deliver" and "Saturday"): what is missing
        # is the words as the user put them, "deliver on Saturdays".
        together = lacking if len(lacking) > 1 else asked if not lacking and len(asked) > 1 else []
        topic = narrow[0] if narrow else span_of(need.asked, together) if together else ""
        return _as_named(topic or " ".join(dict.fromkeys(missing[:3])), need.asked, v)

    def _window_unmet(self, need: Need, eligible: list[tuple[Passage, Sentence]]) -> str:
        """The window of time a question about the asker's own things asks ("this week"), when
        their rows found are dated but none in it; "" otherwise."""
        v = self.vocabulary
        window = window_asked(need.asked, v)
        if window is None:
            return ""
        today = timezone.localdate()
        first, last = window_span(window[0], today)
        dated = [when.date() for when in (row_date(p, v, today) for p in
                                          {id(p): p for p, _ in eligible if p.asker_own}.values()) if when]
        return window[1] if dated and not any(first <= d <= last for d in dated) else ""

    def decline(self, need: Need, passages: list[Passage], eligible: list[tuple[Passage, Sentence]]) -> str:
        """Say plainly that the documents don't state it, naming what they do describe."""
        m = self.messages
        window = self._window_unmet(need, eligible)
        if window:  # "What do I have booked this week?": their rows are all dated outside it
            if self.why is not None:
                self.why.outcome, self.why.missing = "declined", window
            return m["none_in_window"].format(window=echoed(window))
        topic = echoed(self._topic(need, eligible))
        if self.why is not None:
            self.why.outcome, self.why.missing = "declined", topic
        passage_of = {id(p): p for p, _ in eligible}
        on_subject = [p for p in passages if id(p) in passage_of]
        subject = next((p for p in on_subject if p.subject in need.subjects), None) if need.subjects else None
        if subject is not None:
            name = (m["article"] if subject.mentions_the else "") + subject.subject_name
            text = m["decline_for_subject"].format(topic=topic, subject=name)
            on_subject = [p for p in on_subject if p.subject == subject.subject]
        else:
            text = m["decline"].format(topic=topic)
        # "Illustrator's what you wrote" reads as nothing; "about ... who can join" reads well.
        clauses = self.vocabulary.wh if subject is not None else frozenset()
        # The asker's rows are theirs, not what the documents describe ("Your loan: Middlemarch").
        leaves = list(dict.fromkeys(_leaf_in_sentence(p.heading_leaf, clauses) for p in on_subject
                                    if p.heading_leaf and not p.asker_own))
        if leaves and (subject is not None or not need.subjects):
            described = leaves[0] if len(leaves) == 1 else ", ".join(leaves[:-1]) + m["and_joiner"] + leaves[-1]
            if subject is not None:
                owner = (m["possessive_after_s"] if name.endswith("s") else m["possessive"]).format(name=name)
                text += m["they_describe"].format(owner=owner, described=described)
            else:
                text += m["passages_are_about"].format(described=described)
        return text
