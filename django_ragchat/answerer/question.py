"""What a question asks: its subject (the names it points at) and its attribute (the synonym
groups of the words that ask), read through the profile's ``Vocabulary``."""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from django_ragchat.answerer.passages import Passage
from django_ragchat.answerer.vocabulary import (
    Vocabulary,
    at_sentence_start,
    fold,
    labels,
    name_sequences,
    stem,
    stems,
    word_of,
    words,
)
from django_ragchat.text import sentences

#: A word this long or longer that neither the passages nor the table know is read as the one
#: known word (of this length or longer) a single typo away: a letter missing, extra, wrong or
#: two letters swapped ("weigth", "retrun", "Auroa").
TYPO_MIN_LENGTH = 5

_WORD_RE = re.compile(r"[^\W_]+(?:['’\-][^\W_]+)*", re.UNICODE)  # as text.words
# Where a question's context clause ends: "I sketch by a window - will the screen glare?", "...all
# day: how heavy is it?", and a sentence typed without its capital ("...no power. how many times").
_CLAUSE_SEPARATOR_RE = re.compile(r",\s+|\s+[-–—]+\s+|[;:]\s+|[.!]\s+")
# A decline names "Galaxy S9", not "Galaxy S9's" of "Galaxy S9's battery".
_POSSESSIVE_END_RE = re.compile(r"['’]s?$")
# A bare possessive ("bob's order"): the owner's word.
_POSSESSIVE_RE = re.compile(r"(?<![\w'’-])([^\W\d_]+)['’]s(?![\w'’])")
# A code: a word that starts with a letter and holds a digit ("ORD-18", "X3", "SKU1042").
_CODE_RE = re.compile(r"(?<![\w-])[^\W\d_][\w-]*\d[\w-]*(?![\w-])")

Entity = tuple[str, ...]


@dataclass
class Need:
    """What the question asks: attribute groups with weights, and the subject entities."""

    groups: dict[str, float] = field(default_factory=dict)  # group key -> weight (own 1, inherited 0.5)
    own: set[str] = field(default_factory=set)  # group keys from the user's own words
    labels: dict[str, str] = field(default_factory=dict)  # group key -> words for a decline
    subjects: set[Entity] = field(default_factory=set)
    unknown: list[str] = field(default_factory=list)  # names in the question no passage knows
    wants_amount: bool = False  # an amount scores higher
    must_amount: bool = False  # only an amount answers ("How much is it?")
    asked: str = ""  # the words that ask (the question's asking clauses, or one part of them)
    searched: str = ""  # the search query (after the query transformers)
    wants_number: bool = False
    # Asked keys written next to each other ("charge wirelessly", "return postage"): a sentence
    # states them together only where they stand close (see selector.PROXIMITY_WINDOW).
    adjacent: list[tuple[str, str]] = field(default_factory=list)
    # Asked comparatives and superlatives ("bigger", "priciest"): which value, beside what it is of.
    comparatives: set[str] = field(default_factory=set)
    # The attribute came from the context or the transformer, not the asking clause: its words
    # describe a situation ("I go running in all weather. Will they cope?"), none is the point.
    promoted: bool = False
    # Entities the user's own words point at that no passage is about, only names in passing.
    mentioned: set[Entity] = field(default_factory=set)
    # Keys the search query carried that became asked beside an answer-type phrase the user typed
    # ("plant care service" for "and how long does it take?"): what the value is of, not the point.
    carried: set[str] = field(default_factory=set)
    # The subjects came from the search query alone: the transformer carried them from earlier
    # turns, and the user's own words name none of them.
    subjects_carried: bool = False
    # Asked word-and-code pairs ("band d", "aurora x2"): each names one row or model, not its kin.
    codes: set[str] = field(default_factory=set)

    def ask(self, key: str, label: str) -> None:
        """Add ``key`` to what the user's own words ask, labelled ``label`` in a decline."""
        self.groups[key] = 1.0
        self.labels[key] = label
        self.own.add(key)

    def promote(self, keys: set[str]) -> None:
        """Ask ``keys`` (carried words) as the user's own words, at full weight."""
        self.own |= keys
        self.groups.update(dict.fromkeys(keys, 1.0))

    def forget(self, keys: list[str], asked_at: dict[str, int]) -> None:
        """Take ``keys`` out of what is asked: a word that only says how something is asked."""
        for key in keys:
            self.own.discard(key)
            self.groups.pop(key, None)
            asked_at.pop(key, None)


# --- The question's words ---------------------------------------------------------------------


def question_parts(question: str, vocabulary: Vocabulary) -> list[str]:
    """The separate questions in ``question``: its question sentences, each split before
    "and how/what/does..." ("How many watts, and how long till it's half full?"). Alternatives
    ("..., or is it free?") ask one thing and stay whole."""
    split = vocabulary.pattern("part_split")
    parts = [part.strip() for q in asked_clauses(question, vocabulary) for part in split.split(q)]
    return [part for part in parts if words(part)]


def asked_clauses(question: str, vocabulary: Vocabulary) -> list[str]:
    """The asking clause of each question sentence; without a "?", of the last sentence
    ("hi, quick question - how much is the aurora x2")."""
    found = sentences(question)
    asked = [asked_clause(q, vocabulary) for q in found if q.endswith("?")]
    return asked or [asked_clause(found[-1] if found else question, vocabulary)]


def _opens_a_question(text: str, vocabulary: Vocabulary) -> bool:
    tokens = words(text)
    opener = next(iter(tokens), "")
    if opener in vocabulary.word_class("clause_conjunctions"):
        opener = next(iter(tokens[1:]), "")
    return opener in vocabulary.wh or opener in vocabulary.polar


def asked_clause(question: str, vocabulary: Vocabulary) -> str:
    """The part of a question sentence that asks: "I read in bed for hours, is it heavy?" asks
    "is it heavy?"; "If I top them up from the case, how much listening...?" asks from "how".
    The clauses before it are context (they still count, at half weight, via the search query)."""
    head = next(iter(words(question)), "")
    if head in vocabulary.wh or head in vocabulary.polar:
        return question
    for separator in _CLAUSE_SEPARATOR_RE.finditer(question):
        if _opens_a_question(question[separator.end():], vocabulary):
            return question[separator.end():]
    # "I'd like to know how long the warranty on the Aurora X2 lasts; my Zephyr Buds came with
    # two years": a question put as a statement asks from its embedded question word to the end
    # of that clause; the rest is context.
    embedded = vocabulary.pattern("embedded_question").search(question)
    if embedded:
        rest = question[embedded.start(1):]
        end = _CLAUSE_SEPARATOR_RE.search(rest)
        return rest[:end.start()] if end and words(rest[:end.start()])[1:] else rest
    return question


def asks_charging_time(asked: str, vocabulary: Vocabulary) -> bool:
    """Whether the asking words ask how long something takes ("how long ... take", "how fast");
    the answerer applies it only when a charging word is asked too."""
    return bool(vocabulary.pattern("charging_time_question").search(asked))


def states_charging_time(sentence: str, vocabulary: Vocabulary) -> bool:
    """Whether ``sentence`` states a charging time ("reaching 50% in 20 minutes")."""
    return bool(vocabulary.pattern("charging_verb").search(sentence)
                and vocabulary.pattern("time_span").search(sentence))


def capacities(text: str, vocabulary: Vocabulary) -> set[tuple[str, str]]:
    """The storage capacities ``text`` names ("128 GB" -> ("128", "gb"))."""
    return {(number, unit.lower()) for number, unit in vocabulary.pattern("capacity").findall(text)}


# --- Typos and derived words ----------------------------------------------------------------------


def one_typo(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` differ by one insertion, deletion, substitution or swap of two
    neighbouring letters (Damerau-Levenshtein distance 1)."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        return len(diff) == 1 or (len(diff) == 2 and diff[1] == diff[0] + 1
                                  and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]])
    short, long_ = (a, b) if len(a) < len(b) else (b, a)
    i = next((i for i in range(len(short)) if short[i] != long_[i]), len(short))
    return short[i:] == long_[i + 1:]


@dataclass(frozen=True)
class _Corrector:
    """Reads an unknown word as the one known word a typo away (see ``corrected``)."""

    known_stems: frozenset[str]  # the passages' stems
    vocabulary: Vocabulary

    def known(self, word: str) -> bool:
        stemmed, v = stem(word), self.vocabulary
        return (stemmed in self.known_stems or stemmed in v.of_stem or stemmed in v.phrases_from
                or stemmed in v.generic_stems or word in v.phrases_from)

    def fix(self, match: re.Match) -> str:
        word, v = fold(match.group(0)), self.vocabulary
        if ("-" in word and not self.known(word) and not any(c.isdigit() for c in word)
                and any(self.known(p) for p in word.split("-") if len(p) > 2)):
            # "top-capacity" is "top capacity"; "front-facing" stays, and so does a code ("ORD-18")
            return match.group(0).replace("-", " ")
        if (len(word) < TYPO_MIN_LENGTH or not word.isalpha() or word in v.stopwords or word in v.generic
                or self.known(word)):
            return match.group(0)
        stemmed = stem(word)
        # A word the model knows whole is no misspelling of another with one letter changed
        # ("bring" of "bridge", "change" of "charge"), though it may be a spelling of one with a
        # letter more or less ("color" of "colour").
        whole = v.is_word(word)
        found = {c for c in (*self.known_stems, *v.stems_by_initial.get(word[0], ()))
                 if len(c) >= TYPO_MIN_LENGTH and c[0] == word[0]
                 and any(one_typo(w, c) and not (whole and len(w) == len(c)) for w in (word, stemmed))}
        if len(found) > 1 and len({v.of_stem.get(c) for c in found}) == 1 and v.of_stem.get(next(iter(found))):
            found = {min(found)}  # "weigth": "weight" or "weigh", the same group either way
        return next(iter(found)) if len(found) == 1 else match.group(0)


def corrected(text: str, known_stems: frozenset[str], vocabulary: Vocabulary) -> str:
    """``text`` with each unknown word of ``TYPO_MIN_LENGTH`` letters or more replaced by the one
    known stem a single typo away, when there is exactly one (same first letter), and a number
    written against its unit set apart from it ("128gb" is "128 gb")."""
    text = vocabulary.pattern("joined_unit").sub(r"\1 \2", text)
    return _WORD_RE.sub(_Corrector(known_stems, vocabulary).fix, text)


def _derived_by_suffix(word: str, known_stems: frozenset[str], vocabulary: Vocabulary) -> str:
    ordered = vocabulary.language.ordered
    for suffix in ordered["y_comparative_suffixes"]:  # "heavier" is "heavy"
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            base = word[:-len(suffix)] + "y"
            if base in vocabulary.of_stem:
                return base + "=" + "|".join(vocabulary.of_stem[base])
            if base in known_stems:
                return base
    for suffix in ordered["derivational_suffixes"]:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            base = word[:-len(suffix)]
            for candidate in (base, base[:-1] if base[-1] == base[-2] else base):
                if candidate in vocabulary.of_stem:
                    return candidate + "=" + "|".join(vocabulary.of_stem[candidate])
                if candidate in known_stems:
                    return candidate
    return word


def derived(word: str, known_stems: frozenset[str], vocabulary: Vocabulary) -> str:
    """The need key of a question word (a stem) that neither the passages nor the table know,
    read through a derivational suffix when that meets them: "sweaty" is "sweat", "sunny" is
    "sun", "readable" is "read", "lighter" is "light", "old" is the passages' "older";
    otherwise the word itself."""
    for longer in (word + suffix for suffix in vocabulary.language.ordered["comparative_suffixes"]):
        # "old" meets "older"
        if longer in known_stems:
            return longer
    if word.isalpha() and len(word) >= 2:  # "What IPX rating?" meets the code "IPX4"
        codes = [v for v in known_stems if v.startswith(word) and v[len(word):len(word) + 1].isdigit()
                 and "-" not in v]
        if len(codes) == 1:
            return codes[0]
    return _derived_by_suffix(word, known_stems, vocabulary)


# --- The subject ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Entities:
    """The entities the passages know about: their subjects and the names in their sentences."""

    known: frozenset[Entity]
    vocabulary: Vocabulary
    # Stems the passages use outside names ("card" in "your card"): a question's word that is
    # one of them names no entity on its own ("a library card" is not the Adult Card).
    common: frozenset[str] = frozenset()

    @classmethod
    def of(cls, passages: list[Passage], vocabulary: Vocabulary) -> _Entities:
        known: set[Entity] = set()
        for p in passages:
            if p.subject:
                known.add(p.subject)
            for s in p.sentences:
                known.update(tuple(n.split()) for n in s.names)
        # "Saturday", "Sundays" are times, no subjects.
        known = {e for e in known if not all(t in vocabulary.calendar or stem(t) in vocabulary.calendar for t in e)}
        return cls(frozenset(known), vocabulary, frozenset().union(*(s.loose for p in passages for s in p.sentences)))

    def named(self, query_words: set[str], type_words: bool = True, partial: bool = True,
              pairs: frozenset[tuple[str, str]] = frozenset()) -> set[Entity]:
        """The entities ``query_words`` name. "Zephyr" alone names the Zephyr Buds; a full name
        ("Nimbus Pen") beats a shared word. Without ``type_words`` the shared word must be the
        name's first word or a model code: "the pen" is not the Nimbus Pen when the conversation
        is about the Nimbus Tab. Without ``partial``, only full names: "order" in "order ORD-18"
        names neither Order ORD-17 nor Order ORD-19. ``pairs``, the words the question writes
        side by side, name a longer name by its ends ("chickpea curry")."""
        query_words = query_words | {stem(w) for w in query_words}  # "my Zephyrs"
        light = self.vocabulary.stopwords | self.vocabulary.generic
        full = {e for e in self.known if set(e) <= query_words}
        shared = query_words - light - {w for w in query_words if w in self.common or stem(w) in self.common}
        partial = {e for e in self.known if any(
            type_words or w == e[0] or any(c.isdigit() for c in w)
            for w in set(e) & shared) or self._by_its_ends(e, query_words, pairs)} if not full and partial else set()
        # "Zappa" also means the "Frank Zappa" a heading names: add the longer names containing it.
        return (full or partial) | {e for e in self.known if any(set(f) < set(e) for f in full)}

    def _by_its_ends(self, entity: Entity, query_words: set[str], pairs: frozenset[tuple[str, str]]) -> bool:
        """``_all_but_an_end``, unless every word the question holds of the name is one the passages
        also write outside names: "council tax" is the passages' own phrase ("your council tax
        bill"), not the Council Tax Reduction named in part. A name's first and last words side by
        side still name it ("the chickpea curry", though "chickpeas" and "curry paste" are lines)."""
        return _all_but_an_end(entity, query_words, pairs) and (
            (entity[0], entity[-1]) in pairs or bool(set(entity) & query_words - self.common))


def _all_but_an_end(entity: Entity, query_words: set[str], pairs: frozenset[tuple[str, str]] = frozenset()) -> bool:
    """"lentil soup" of the Red Lentil Soup, "root canal" of Root canal treatment: a name of three
    words or more of which the question holds all the words but the first or all but the last
    (the subject index, ``search.subjects``, names it so when they are written in a row), so the
    name the transformer carried in for it is no reason to doubt that the user named it. Or its
    first and last words side by side (``pairs``): "the chickpea curry" of the Chickpea and
    Spinach Curry, whose words the recipe's lines use too ("2 tins chickpeas", "curry paste"),
    but not "care home ... service" of the Home Library Service."""
    return len(entity) >= 3 and (set(entity[1:]) <= query_words or set(entity[:-1]) <= query_words
                                 or (entity[0], entity[-1]) in pairs)


def _subject_by_kind(question: str, passages: list[Passage], vocabulary: Vocabulary) -> set[Entity]:
    """"My tablet stopped working", "Is the phone waterproof?": the one subject the passages
    define as one of that kind (``Passage.kind``), when the question points at it ("the", "my",
    not "a tablet") and no other subject is of that kind; else none."""
    kinds: dict[str, set[Entity]] = {}
    for p in passages:
        if p.kind:
            kinds.setdefault(stem(p.kind), set()).add(p.subject)
    tokens = words(question)
    pointed = {stem(w) for before, w in zip(tokens, tokens[1:]) if before in vocabulary.pointing}
    asked_kinds = pointed & {k for k, subjects in kinds.items() if len(subjects) == 1}
    return {next(iter(kinds[k])) for k in asked_kinds} if len(asked_kinds) == 1 else set()


def _foreign_names(question: str, entities: _Entities, known_stems: frozenset[str]) -> list[str]:
    """Names written as names that share the first word of a known entity's name but hold another
    capitalised word that no entity has and no passage uses: "Zephyr Kettle" beside the Zephyr
    Buds is an unknown thing, not the Zephyr Buds named in part. A shared type word ("Visitor
    Card" beside the Adult Card, "Station Road" beside Millbrook Station) is no such sign, and a
    sentence's first word is capitalised anyway ("Kettle" in "Kettle by Zephyr?")."""
    v = entities.vocabulary
    light = v.stopwords | v.generic
    known = {w for e in entities.known for w in e}
    first = {e[0] for e in entities.known if e}
    found = []
    for display, _ in name_sequences(question, v.stopwords):
        tokens = words(display)  # "Aurora X2's" is aurora, x2
        if not any(t in first or stem(t) in first for t in tokens):
            continue  # a name sharing no word is unknown as a whole (``_find_subjects``)
        written = tokens[1:] if at_sentence_start(question, question.find(display)) else tokens
        if any(t not in light and not _known_code(t, known) and stem(t) not in known_stems for t in written):
            found.append(display)
    return found


def _unknown_codes(question: str, known_stems: frozenset[str], vocabulary: Vocabulary) -> list[str]:
    """Codes the question writes that no passage writes: "What is the status of order ORD-18?"
    over the passages of ORD-17 and ORD-19 asks about a thing none of them is, as a name no
    passage knows does. A code within a name ("Galaxy S9") is the name's."""
    in_names = {_POSSESSIVE_END_RE.sub("", w) for display, _ in name_sequences(question, vocabulary.stopwords)
                for w in display.split()}
    return [m.group(0) for m in _CODE_RE.finditer(question)
            if m.group(0) not in in_names and not _known_code(fold(m.group(0)), known_stems)]


def as_the_asker(text: str, names: Sequence[str], vocabulary: Vocabulary) -> str:
    """``text`` with the asker's own name before a possessive written as the language's own
    possessive: "What is alice's order number?" asked by alice is "What is my order number?",
    not someone else's order (``_other_owners``), which was declined."""
    mine = vocabulary.asker_possessive
    if not mine or not names:
        return text
    owners = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    return re.sub(rf"(?<![\w'’-])(?:{owners})['’]s(?![\w'’])", mine, text, flags=re.IGNORECASE)


def _other_owners(question: str, known_stems: frozenset[str], vocabulary: Vocabulary) -> list[str]:
    """Owners a question names by a bare possessive that no passage writes: "What is bob's order
    number?" asked by a customer whose own order was found asks about someone else's, which their
    rows do not answer ("Your order ORD-17" quoted as bob's). After a determiner it is a thing or
    a relative of the asker's ("my friend's", "the shop's"), and "let's" or "today's" name no one.
    The language's ``owner_after`` pattern finds one written after the thing ("the order number
    of bob"); the decline names the owner alone then."""
    v, found = vocabulary, []
    after = v.language.patterns.get("owner_after")  # optional: a language may have none
    for m, named in [*((m, m.group(0)) for m in _POSSESSIVE_RE.finditer(question)),
                     *((m, m.group(1)) for m in (after.finditer(question) if after else ()))]:
        owner, before = fold(m.group(1)), words(question[:m.start(1)])[-1:]
        if (before and before[0] in v.possessive_determiners) or owner in v.unnamed_possessors:
            continue
        if owner in v.stopwords or owner in v.generic or owner in v.calendar or stem(owner) in v.time_units:
            continue
        if owner not in known_stems and stem(owner) not in known_stems:
            found.append(named)
    return found


def _unknown_numbered(question: str, entities: _Entities, passages: list[Passage]) -> list[str]:
    """Things named by a kind and a number that no passage names, where the passages name things
    of that kind by number: "What is the status of order 2?" over the passage of Order 1 asks
    about an order that is not there (a site's own orders, tickets, rooms). The passages name
    them as names ("Order 1"), in lower case with a mark (the ``numbered_marked`` pattern:
    "your ticket #2", "order number 17"; not "aged 2 to 5") or, for a site's rows, in their
    title as written ("Your plot: plot 7": "What is the watering day for plot 12?" was answered
    with the asker's plots 4 and 7, a trial's finding)."""
    patterns = entities.vocabulary.language.patterns
    pattern = patterns.get("numbered")  # optional: a language may have none
    numbers_of: dict[str, set[str]] = {}  # kind -> the numbers the passages name ("order" -> {"1"})
    for e in entities.known:
        if len(e) > 1 and e[-1].isdigit():
            numbers_of.setdefault(stem(e[-2]), set()).add(e[-1])
    marked = patterns.get("numbered_marked")
    for p in passages:
        found_in = [(marked, " ".join([p.heading_leaf, *(s.text for s in p.sentences)]))] if marked else []
        if p.family and pattern is not None:  # a row's title names the row's thing
            found_in.append((pattern, p.heading_leaf))
        for named, text in found_in:
            for m in named.finditer(text):
                numbers_of.setdefault(stem(fold(m.group(1))), set()).add(m.group(2))
    if pattern is None or not numbers_of:
        return []
    found = []
    for m in pattern.finditer(question):
        known_numbers = numbers_of.get(stem(fold(m.group(1))))
        if known_numbers is not None and m.group(2) not in known_numbers:
            found.append(m.group(0))
    return found


def _known_code(token: str, known: frozenset[str] | set[str]) -> bool:
    """Whether ``token`` is a code ``known`` holds, also in the plural ("X2s" of X2)."""
    return token in known or stem(token) in known or (token.endswith("s") and token[:-1] in known)


def _find_subjects(need: Need, question: str, search_query: str, asked: str | None, passages: list[Passage],
                   entities: _Entities, known_stems: frozenset[str] = frozenset()) -> set[str]:
    """Set ``need``'s subjects, the entities it mentions and the names no passage knows; return
    the words of every name in play (names are subjects, not attributes)."""
    v = entities.vocabulary
    light = v.stopwords | v.generic
    # "How long does the Zephyr Kettle take to boil?": the unknown name names no subject, even in
    # part, and the conversation's subject is not what the question is about either.
    foreign = (_foreign_names(question, entities, known_stems) + _unknown_codes(question, known_stems, v)
               + _unknown_numbered(question, entities, passages))
    if any(p.asker_own for p in passages):  # only their own rows could be quoted as someone else's
        foreign += _other_owners(question, known_stems, v)
    for display in foreign:
        need.unknown.append(_POSSESSIVE_END_RE.sub("", display))  # "Zephyr Kettle's lid"
        question, search_query = question.replace(display, " "), search_query.replace(display, " ")
        asked = asked.replace(display, " ") if asked is not None else None
    own_words = set(words(question))
    pairs = frozenset(pair for text in (question, search_query) for pair in itertools.pairwise(words(text)))
    everything = entities.named(own_words | set(words(search_query)), pairs=pairs)
    # The user's own words name the subject when they name one: in "And the Aurora X2?" after
    # the Nimbus Tab, the transformer's inherited "Nimbus Tab" is context, not the subject.
    inherited = {e for e in entities.known if set(e) <= set(words(search_query))}
    # Of the names the question holds, those of its asking clauses: "How long is the Aurora X2's
    # warranty? My Zephyr Buds came with two years." asks about the Aurora X2 alone.
    asking = " ".join(asked_clauses(question, v)) if asked is None else asked
    asking_words = set(words(asking))
    in_asking = {e for e in entities.known if set(e) <= asking_words | {stem(w) for w in asking_words}}
    own_pairs = frozenset(itertools.pairwise(words(question)))
    need.subjects = in_asking or entities.named(own_words, type_words=not inherited, partial=not foreign,
                                                pairs=own_pairs)
    if not need.subjects and not foreign:
        need.subjects, need.subjects_carried = everything, bool(everything)
    # "And the pen?" in a conversation about the Nimbus Tab: the Nimbus Pen its sentences name.
    headed = {p.subject for p in passages if p.subject}
    # ... but not a name a heading's holds ("Trailblazer" in a sentence of the "Trailblazer 300").
    need.mentioned = {e for e in everything if e not in headed and not any(set(e) < set(h) for h in headed)
                      and set(e) & (own_words - light)}
    if not need.subjects:
        need.subjects = _subject_by_kind(question, passages, v)
    # A name only the context writes ("We fly back to Spain on Thursday. How much is express
    # delivery?") is not what is asked: the asking clauses' unknown names decline.
    for display, folded in name_sequences(asking, v.stopwords):
        tokens = set(folded.split())
        calendar = {t for t in tokens if t in v.calendar or stem(t) in v.calendar}
        # "What time is the Spin class?" over "Spin class runs at 7am": a word the passages write
        # (here only at a sentence's start, so as no name) is no unknown thing.
        written = {t for t in tokens if t in known_stems or stem(t) in known_stems}
        if not any((tokens | {stem(t) for t in tokens}) & set(e) for e in entities.known) and not tokens <= (
                light | calendar | written):
            need.unknown.append(_POSSESSIVE_END_RE.sub("", display))
    holding = {h for h in headed for e in need.subjects if set(e) < set(h)}
    if len(holding) == 1 and not need.subjects & headed:
        need.subjects |= holding  # "at millbrook": the Millbrook Library, the one subject named so
    if need.subjects & headed:
        # "When is Storytime at Central Library?", "Is Millbrook open on Saturdays?": a passage's
        # subject is what is asked about; the other names are what is asked of it (attribute words).
        need.subjects &= headed
        return {w for e in everything | need.subjects if e in headed for w in e}
    return {w for e in everything | need.subjects for w in e}


# --- The attribute --------------------------------------------------------------------------------


def _read_attribute(need: Need, asked: str, search_query: str, names: set[str], known_stems: frozenset[str],
                    vocabulary: Vocabulary) -> dict[str, int]:
    """Fill ``need``'s groups from the asking words (weight 1) and the search query (0.5);
    return where each asked key first stands in the asking words."""
    asked_at: dict[str, int] = {}
    for text, weight in ((asked, 1.0), (search_query, 0.5)):
        positions: dict[str, int] = {}
        for key, label in vocabulary.group_keys(text, names, positions):
            at = positions[key]
            comparative = word_of(key) in vocabulary.comparatives
            if "=" not in key and key not in known_stems:
                key = derived(key, known_stems, vocabulary)
            if weight == 1.0:
                if comparative:
                    need.comparatives.add(word_of(key))
                asked_at.setdefault(key, at)
                need.own.add(key)
            if key not in need.groups:
                need.groups[key] = weight
                need.labels[key] = label
    _read_coded_pairs(need, asked, names, known_stems, vocabulary, asked_at)
    return asked_at


def _read_coded_pairs(need: Need, asked: str, names: set[str], known_stems: frozenset[str],
                      vocabulary: Vocabulary, asked_at: dict[str, int]) -> None:
    """"band D", "room 4": a word and the short code after it, asked as the pair a passage writes
    ("Band D: annual charge £2,103"), since the code alone is too short a word to weigh and the
    word alone is stated by every row (band C's too)."""
    tokens = words(asked)
    for at, (word, code) in enumerate(itertools.pairwise(tokens)):
        coded = len(code) == 1 or (len(code) == 2 and code.isalnum() and any(c.isdigit() for c in code))
        if not coded or word in vocabulary.stopwords or {word, code} & names or (
                code in vocabulary.stopwords and not _written_as_code(word, code, asked)):
            continue  # "storytime at", "group of", "pay a year": no code
        key = stem(f"{word}-{code}")
        if key in known_stems and key not in need.groups:
            asked_at.setdefault(key, at)
            need.own.add(key)
            need.codes.add(key)
            need.groups[key], need.labels[key] = 1.0, f"{word} {code}"


def _written_as_code(word: str, code: str, asked: str) -> bool:
    """Whether a one-letter stop word after ``word`` is written as a code, in capitals: "band A"."""
    return len(code) == 1 and bool(re.search(rf"(?i:\b{re.escape(word)})\s+{re.escape(code.upper())}\b", asked))


def _read_heading_actions(need: Need, asked: str, asked_at: dict[str, int], passages: list[Passage],
                          vocabulary: Vocabulary) -> None:
    """Add the light verbs of ``asked`` that a passage's heading opens with as its action, of a
    thing the question names too: "get" says nothing in most questions ("How quickly do I get my
    money back?"), but in "How do I get a loyalty card?" beside a section "Getting a card" it is
    what is asked."""
    actions = {stem(first) for p in passages for first in words(p.heading_leaf)[:1]
               if first.endswith("ing") and any(vocabulary.covers(k, p.heading_stems) for k in need.groups)}
    for at, word in enumerate(words(asked)):
        if word in vocabulary.stopwords and stem(word) in actions:
            key = stem(word)
            asked_at.setdefault(key, at)
            need.own.add(key)
            need.groups[key] = 1.0
            need.labels.setdefault(key, word)


def _drop_words_that_say_how(need: Need, asked: str, asked_at: dict[str, int], vocabulary: Vocabulary) -> None:
    """Words that only say how something is asked are no attribute of their own."""
    lasting = [k for k in need.own if k.split("=")[0] == "last"]
    # "How long does the warranty last?" asks a duration, and so does "How long does it last?"
    # after the warranty (after the battery, "last" is the battery life it asks).
    lasting_of = any(not k.startswith("~") and k not in lasting for k in need.own) or any(
        key not in need.own and set(labels(key)) & vocabulary.group_class("time_bearing") - {"battery life"}
        for key in need.groups)
    if lasting and lasting_of and vocabulary.pattern("how_long").search(asked):
        need.forget(lasting, asked_at)
    lengths = [k for k in need.own if k.split("=")[0] == "length"]
    if lengths and any(set(labels(k)) & vocabulary.group_class("time_bearing") for k in need.own):
        need.forget(lengths, asked_at)  # "zephyr buds warranty length": how long it runs, not cm
    kind = vocabulary.pattern("quantity_question").search(asked)
    named_kind = [k for k in need.own if kind and "=" not in k and words(kind.group(0))[-1:] == [need.labels[k]]]
    if named_kind and len(need.own) > 2:
        need.forget(named_kind, asked_at)  # "What time does it close on Thursdays?" asks a time of closing
    coming = [k for k in need.own if k == "=included" and need.labels.get(k, "").startswith(("come", "came"))]
    if coming and vocabulary.pattern("quantity_question").search(asked) and len(need.own) > 1:
        need.forget(coming, asked_at)  # "How much storage does it come with?" asks the storage


def _acts_on_a_name(asked: str, names: set[str], vocabulary: Vocabulary) -> bool:
    """Whether the asking clause's verb is a word of a name it holds: "Can I pay with Apple Pay?"
    asks its own thing (paying so) though each of its words is the name's, not the attribute a
    question before it carried ("What does the MOT check?")."""
    tokens = words(asked)
    # Written twice, once as the verb and once in the name: "And to Millbrook?" holds no verb.
    return any(doer in vocabulary.doers and verb in names and tokens.count(verb) > 1
               for doer, verb in zip(tokens, tokens[1:]))


def _take_carried_page_topic(need: Need, asked: str, passages: list[Passage], vocabulary: Vocabulary) -> None:
    """A follow-up pointing back ("And what is not allowed in it?" after "What can I put in the
    compost?") with no subject of its own asks about the topic the search query carried when a
    page found is titled by it ("Compost"): that word is asked too, so a sentence of another
    page ("Hosepipes are not allowed") does not answer it (an allotment site's trial)."""
    if need.subjects or not set(words(asked)) & vocabulary.word_class("topic_pointers"):
        return
    carried = {k for k in need.groups if k not in need.own and not k.startswith("~") and "=" not in k}
    need.promote({k for k in carried if any(vocabulary.covers(k, p.title_stems) for p in passages)})


def _take_carried_attribute(need: Need, asked: str, typed_keys: set[str], vocabulary: Vocabulary) -> None:
    """Make the words the search query carried (the transformer's, or the question's context)
    the asked attribute where the asking clause alone does not say what it is about."""
    carried = {key for key in need.groups if key not in typed_keys and not key.startswith("~")}
    if need.own and all(key.startswith("~") or labels(key) == ["price"] for key in need.own):
        # A price carried is no length: "and how long does it take?" after "How much does a
        # service cost?" asks how long the service takes.
        if not any(labels(key) == ["price"] for key in need.own) and not vocabulary.pattern(
                "price_question").search(asked):
            carried = {key for key in carried if labels(key) != ["price"]}
        if not need.subjects and set(words(asked)) & vocabulary.word_class("topic_pointers"):
            # "How much does that cost?" after "How fast do you ship?": it asks a price, and with
            # no product in play the words the transformer carried ("fast ship") are what "that" is.
            need.carried = carried - need.own
            need.promote(need.carried)
    if need.own and all(key.startswith("~") for key in need.own):
        # "How long is it?" asks only the kind of value: what it is about came with the search
        # query ("... Zephyr Buds warranty").
        need.carried = {key for key in carried if need.groups[key] == 0.5}
        need.promote(need.carried)
    if (not need.own and need.groups and not vocabulary.pattern("purpose").search(asked)
            and not vocabulary.pattern("price_question").search(asked)):
        # "What about the Nimbus Tab?": the attribute is the one the transformer carried over, or
        # the context's ("I lost one of my Zephyr Buds, what now?"); but "hi, quick question -
        # how much is it?", or "and how much is it?" after the kettle's warranty, asks a price:
        # neither the context's words nor those carried from earlier turns ("kettle warranty"),
        # which only say which subject.
        promoted = set(need.groups)
        if promoted:
            need.promoted = True
            need.promote(promoted)


def _value_asked(need: Need, asked: str, vocabulary: Vocabulary) -> None:
    """What kind of value answers (an amount, a number) and the groups that kind implies."""
    # "How much is a check-up this week?": a window of time says when, not what is measured.
    window = vocabulary.time_window.search(asked) if vocabulary.time_window else None
    when = stems(window.group(0)) if window else set()
    own_groups = {label for k in need.own if word_of(k) not in need.comparatives and stem(word_of(k)) not in when
                  for label in labels(k)}
    all_groups = {label for k in need.groups for label in labels(k)}
    if ("shipping" in own_groups and "return" in all_groups and "return shipping" not in own_groups
            and ("price" in own_groups or "postag" in stems(asked))):
        # "If I send it back, am I on the hook for the postage?" asks who pays return shipping.
        need.ask("=return shipping", "return shipping")
    # "How much is the biggest one?" asks a price: a comparative says which, not what is measured.
    price_question = bool(vocabulary.pattern("price_question").search(asked))
    measured = bool(own_groups & vocabulary.group_class("measure"))
    need.wants_amount = "price" in own_groups or (price_question and not measured)
    need.must_amount = price_question and not measured
    if "pay" in words(asked) and not price_question:
        need.wants_amount = False  # "Do I have to pay for..." is answered by "free" as well as by "$15"
    need.wants_number = bool(vocabulary.pattern("quantity_question").search(asked))
    if vocabulary.pattern("where_placed").search(asked) and not any("attachment" in labels(k) for k in need.own):
        # "Where does the pen go when I'm not drawing?": where a thing is kept is how it attaches.
        need.ask("=attachment", vocabulary.messages["where_it_goes"])
    if need.wants_amount and not any("price" in labels(k) for k in need.own):
        need.ask("=price", "price")  # "How much are Zephyr Buds?" asks the price


def analyse_query(question: str, search_query: str, passages: list[Passage], vocabulary: Vocabulary,
                  asked: str | None = None) -> Need:
    """Split the user's ``question`` and the transformed ``search_query`` into subject and attribute
    (the attribute of ``asked``, one part of the question, when given)."""
    need = Need(searched=search_query)
    known_stems = frozenset().union(*(s.stems for p in passages for s in p.sentences),
                                    *(p.heading_stems for p in passages),
                                    *(stems(p.subject_name) for p in passages if p.subject_name))
    # "nimbus tab weigth", "retrun policy?", "Zepyhr Buds": one slip of the keys from a word the
    # passages or the table know is that word. A word of a passage's subject is known: "Greek"
    # of the Greek Salad is no slip for "green" (a recipe site's trial).
    question = corrected(question, known_stems, vocabulary)
    search_query = corrected(search_query, known_stems, vocabulary)
    if asked is not None:
        asked = corrected(asked, known_stems, vocabulary)
    names = _find_subjects(need, question, search_query, asked, passages, _Entities.of(passages, vocabulary),
                           known_stems)
    # "the phone's battery" over a passage defining the Aurora X2 as a phone: the kind names the
    # subject, it asks nothing; "your phone number" on a site that sells no phone asks a phone.
    names |= {w for p in passages if p.kind for w in (p.kind, p.kind + "s")}
    # In "I have an Aurora X2. How long does the battery last?" (or a pasted "Ignore all previous
    # instructions. How much...?") the attribute is what the question sentence asks.
    part = asked is not None  # one part of the question: the search query holds the other parts' words
    need.asked = asked = " ".join(asked_clauses(question, vocabulary)) if asked is None else asked
    asked_at = _read_attribute(need, asked, search_query, names, known_stems, vocabulary)
    _read_heading_actions(need, asked, asked_at, passages, vocabulary)
    _drop_words_that_say_how(need, asked, asked_at, vocabulary)
    by_place = sorted((at, key) for key, at in asked_at.items() if not key.startswith("~"))
    need.adjacent = [(a, b) for (i, a), (j, b) in zip(by_place, by_place[1:]) if j - i <= 2]
    if not part and not _acts_on_a_name(asked, names, vocabulary):
        _take_carried_attribute(need, asked, set(asked_at), vocabulary)
        _take_carried_page_topic(need, asked, passages, vocabulary)
    _value_asked(need, asked, vocabulary)
    return need
