"""Query transformers: change the search query before retrieval.

Each enabled transformer receives the ``Query`` (with the selected history) and returns a new
one, ``SkipRetrieval`` or an ``EndTurn``. The user's original words stay in ``Query.original``;
only what is searched changes, and the trace keeps every step.

Built in: ``followup``, an offline, model-free resolver for dependent follow-ups. After "Tell
me about the Aurora X2 phone", the question "How much does it cost?" names nothing a search
can find; ``followup`` notices that the question depends on the conversation (a pronoun, or
too few content words of its own) and appends what the conversation is about: the names and
model numbers the user wrote, ranked by how often and how recently they were mentioned. It
also tracks the conversation's *subject* (a name the corpus itself has as a document title or
heading, see ``subjects.py``) apart from the *attribute* last asked about it, so "What about
the Nimbus Tab?" after "What is the battery life of the Zephyr Buds?" searches the Nimbus Tab's
battery life, not the Zephyr Buds (docs/followup.md has the rules). Its retrieval quality is
measured on CANARD by ``bench/bench_canard.py`` and on subject switches by
``bench/bench_followup.py``. LLM-based rewriting,
compression and translation are provided by ``django_ragchat.stages.llm_transformers`` when a model
is configured.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async

from django_ragchat import hookimpl
from django_ragchat.access import only_for, users_only
from django_ragchat.components import Component
from django_ragchat.models import MessageSource
from django_ragchat.search.subjects import Subject, SubjectIndex, name_key, subject_index
from django_ragchat.text import STOPWORDS, content_terms, normalize, stem, words
from django_ragchat.types import EndTurn, Query, SkipRetrieval

if TYPE_CHECKING:
    from django_ragchat.answerer.vocabulary import Vocabulary
    from django_ragchat.turn.context import TurnContext


class QueryTransformer(Component):
    """Base class: ``transform(query, turn)`` returns a ``Query``, ``SkipRetrieval`` or ``EndTurn``.

    Set ``query.metadata["transform_note"]`` to explain a decision in the trace (e.g. "no
    history: skipped").
    """

    kind = "query_transformer"

    def transform(self, query: Query, turn: TurnContext) -> Query | SkipRetrieval | EndTurn:
        return query


_TOKEN_RE = re.compile(r"[^\W_]+(?:['’\-][^\W_]+)*")
# How far into a message names are looked for: long answers add cost, not subjects.
_MAX_SCAN_CHARS = 1000
#: An answer's citation marks ("[1]"), left out when an answer is carried into a search.
_CITATION_MARK = re.compile(r"\s*\[\d+\]")

NAME, ACRONYM, CODE, TOPIC = "name", "acronym", "code", "topic"


def _starts_sentence(text: str, match: re.Match) -> bool:
    before = match.start() - 1
    while before >= 0 and text[before].isspace():
        before -= 1
    return before < 0 or text[before] in ".?!:"


def mid_sentence_names(texts: list[str]) -> set[str]:
    """Folded words written capitalised inside a sentence somewhere in ``texts``: names."""
    found = set()
    for text in texts:
        for match in _TOKEN_RE.finditer(text[:_MAX_SCAN_CHARS]):
            token = match.group(0)
            if token[0].isupper() and not _starts_sentence(text, match):
                found.add(normalize(token))
    return found


def classify_tokens(text: str, known_names: frozenset[str] | set[str] = frozenset()) -> list[tuple[str, str]]:
    """(token, kind) for the content words of ``text`` in order; kind is ``NAME`` (Aurora,
    Zappa, and X2 in "Aurora X2"), ``ACRONYM`` (MP, GB), ``CODE`` (letters and digits on their
    own: 48MP, 1-inch) or ``TOPIC`` (any other content word).

    A capitalised word inside a sentence is a name. At the start of a sentence capitals say
    nothing, so there it is a name only if ``known_names`` has it (it is written capitalised
    elsewhere) or the next word is capitalised too ("Frank Zappa", "Aurora X2"). A code right
    after a name is part of the name (a model number).
    """
    matches = list(_TOKEN_RE.finditer(text[:_MAX_SCAN_CHARS]))

    def adjacent(i: int) -> bool:  # matches i and i + 1 are separated by spaces only
        return i + 1 < len(matches) and not text[matches[i].end(): matches[i + 1].start()].strip()

    found = []
    previous_name = -2  # index of the last match classified as a name
    for i, match in enumerate(matches):
        token = match.group(0)
        folded = normalize(token)
        if folded in STOPWORDS or len(folded) < 2:
            continue
        if any(c.isdigit() for c in token) and any(c.isalpha() for c in token):
            kind = NAME if previous_name == i - 1 and adjacent(i - 1) else CODE
        elif token.isupper():
            kind = ACRONYM
        elif not token[0].isupper():
            kind = TOPIC
        elif not _starts_sentence(text, match) or folded in known_names:
            kind = NAME
        else:
            following = matches[i + 1].group(0) if i + 1 < len(matches) else ""
            kind = NAME if adjacent(i) and following[0].isupper() and normalize(following) not in STOPWORDS else TOPIC
        if kind == NAME:
            previous_name = i
        found.append((token, kind))
    return found


@dataclass(frozen=True)
class Grammar:
    """The language's words and patterns the follow-up rules read (``lang/<code>/words.toml`` and
    ``patterns.toml``), taken once from the profile's vocabulary."""

    anaphora: frozenset[str]  # words that point back into the conversation
    pronouns: frozenset[str]  # a follow-up using one asks about the current subject
    fillers: frozenset[str]  # "And the X?", "What about X?": words that ask nothing of their own
    value_kind: frozenset[str]  # "How long is it?" asks a kind of value, not about what
    question_openers: frozenset[str]  # "And how heavy is it?" asks a question of its own
    echo: frozenset[str]  # "Does the phone have one too?" points back at the attribute
    refining_prepositions: frozenset[str]  # "And with the pen?" refines the last question
    kind_stop_words: frozenset[str]  # "blenders for a cafe": the thing is the word before these
    generic: frozenset[str]  # words that say nothing about what is asked
    light_stems: frozenset[str]  # words that give a question no subject of its own
    ellipsis: re.Pattern
    fresh_start: re.Pattern
    continues: re.Pattern
    how_much: re.Pattern
    kind_pointer: re.Pattern
    catalogue: re.Pattern | None  # "Do you sell blenders?"; None: the language has no such pattern
    expletive_it: re.Pattern | None  # "does it take to get a laptop": an "it" pointing at nothing
    comparison: re.Pattern  # "anything cheaper" is measured against the conversation's subject

    @classmethod
    def of(cls, vocabulary: Vocabulary) -> Grammar:
        word, pattern = vocabulary.word_class, vocabulary.pattern
        qualifying = word("qualifying")
        return cls(
            anaphora=word("anaphora"), pronouns=word("pronouns"), fillers=word("fillers"),
            value_kind=word("value_kind"), question_openers=word("question_openers"), echo=word("echo"),
            refining_prepositions=word("refining_prepositions"), kind_stop_words=word("kind_stop_words"),
            generic=vocabulary.generic,
            # Only fillers and words that qualify the asking: a kind ("earbuds") still says what it is about.
            light_stems=frozenset(stem(w) for w in word("fillers") | qualifying | word("light")),
            ellipsis=pattern("ellipsis"), fresh_start=pattern("fresh_start"), continues=pattern("continues"),
            how_much=pattern("how_much"), kind_pointer=pattern("kind_pointer"),
            # Optional: a site's language folder written before this rule keeps working without it.
            catalogue=vocabulary.language.patterns.get("catalogue_question"), comparison=pattern("comparison"),
            expletive_it=vocabulary.language.patterns.get("expletive_it"),
        )

    def pointing(self, text: str) -> str:
        """``text`` without the words that look like pronouns and point at nothing ("How long
        does it take to get a new laptop?")."""
        return self.expletive_it.sub("", text) if self.expletive_it else text


@dataclass(frozen=True)
class Reading:
    """What one user message says: the subjects it names, the attribute it asks (its own
    words, in order), whether it asks nothing else (``elliptical``), points back with a pronoun,
    or starts afresh."""

    named: tuple[Subject, ...]
    attribute: tuple[str, ...]
    elliptical: bool
    pronoun: bool
    fresh: bool
    # It asks only the kind of value ("How long is it?") or adds a detail to the last question
    # ("And with the pen?"): the attribute asked before still holds, with its own words added.
    refines: bool = False
    # "Do you sell blenders?": the thing the shop is asked whether it has ("blenders"), or "".
    thing: str = ""
    # "How do I contact support?": the words asking what, of a question naming nothing and
    # pointing back at nothing (empty otherwise); ``ConversationState.leaves_for`` reads them.
    topic_words: tuple[str, ...] = ()


def _attribute_words(rest: str, named: tuple[Subject, ...], index: SubjectIndex,
                     grammar: Grammar) -> tuple[list[str], set[str], bool, bool]:
    """(the attribute's words, those right after "how", whether it asks nothing but fillers,
    whether it points back with a pronoun) of a message's text after any fresh-start words."""
    name_words = {normalize(w) for s in named for w in _TOKEN_RE.findall(s.name)}
    name_keys = {t for s in named for t in s.tokens} | {index.kind_keys[s] for s in named if s in index.kind_keys}
    attribute, elliptical, pronoun = [], True, False
    how_words = set()  # "long" in "How long is the warranty?": the kind of value, not the attribute
    previous = ""
    for match in _TOKEN_RE.finditer(rest[:_MAX_SCAN_CHARS]):
        token = match.group(0)
        folded = normalize(token)
        after_how, previous = previous == "how", folded
        if folded in name_words or name_key(token) in name_keys:
            continue
        if after_how:
            how_words.add(token)
        pronoun = pronoun or folded in grammar.pronouns
        elliptical = elliptical and folded in grammar.fillers
        if (folded in STOPWORDS or folded in grammar.anaphora or folded in grammar.fillers
                or (len(folded) < 2 and not folded.isdigit())):
            continue
        attribute.append(token)
    return attribute, how_words, elliptical, pronoun


def _asks_a_kind_only(attribute: list[str], how_words: set[str], grammar: Grammar) -> bool:
    """"How long will that usually take?": the kind of value, and light words ("take", "usually")."""
    asking = [w for w in attribute if normalize(w) not in grammar.generic]
    return bool(asking) and all(normalize(w) in grammar.value_kind and w in how_words for w in asking)


def _adds_or_echoes(rest: str, attribute: list[str], grammar: Grammar) -> bool:
    """Whether the message adds a detail to the last question ("And with the pen?") or echoes
    its attribute ("Does the phone have one too?")."""
    # "And with the pen?", "And for students?": "and" then a preposition, and no question of
    # its own, refines the last question ("And its warranty?" asks a new attribute).
    opener = grammar.ellipsis.match(rest)
    after_opener = [normalize(t) for t in _TOKEN_RE.findall(rest[opener.end():])] if opener else []
    adds = (bool(opener) and opener.group(1).lower() in ("and", "also") and bool(after_opener)
            and after_opener[0] in grammar.refining_prepositions and not set(after_opener) & grammar.question_openers
            and len(attribute) <= 2)
    echoes = not attribute and bool({normalize(t) for t in _TOKEN_RE.findall(rest)} & grammar.echo)
    return (adds and bool(attribute)) or echoes


def _thing_asked(rest: str, grammar: Grammar) -> str:
    """"Do you sell blenders?": the word naming what the shop is asked whether it has, the last
    content word before a preposition or clause, as a document's kind is read ("blenders" in
    "blenders for a cafe"; a generic word such as "tablets" only when there is no other); ""
    when no such thing is asked, or it points back ("any for it?", "any in blue?", "anything
    cheaper?")."""
    match = grammar.catalogue.search(rest[:_MAX_SCAN_CHARS]) if grammar.catalogue else None
    if not match or grammar.comparison.search(match.group(1)):
        return ""
    thing = generic = ""
    for token in _TOKEN_RE.findall(match.group(1)):
        folded = normalize(token)
        if folded in grammar.anaphora or folded in grammar.pronouns:
            return ""
        if folded in grammar.kind_stop_words:
            if thing or generic:
                break
            return ""  # "Do you have any in blue?": the thing is the one talked about
        if folded in STOPWORDS or stem(folded) in grammar.light_stems:
            continue
        if folded in grammar.generic:
            generic = token
        else:
            thing = token
    return thing or generic


def _name_runs(text: str) -> list[list[re.Match]]:
    """The runs of two or more capitalised words (or codes) written together: "Zephyr Kettle"."""
    runs: list[list[re.Match]] = [[]]
    for match in _TOKEN_RE.finditer(text[:_MAX_SCAN_CHARS]):
        token, run = match.group(0), runs[-1]
        capital = token[:1].isupper() and normalize(token) not in STOPWORDS
        if capital and run and text[run[-1].end():match.start()].strip() == "":
            run.append(match)
        elif capital:
            runs.append([match])
        elif run:
            runs.append([])
    return [run for run in runs if len(run) > 1]


def _foreign_name_word(text: str, index: SubjectIndex) -> str:
    """"How long does the Zephyr Kettle take to boil?": a capitalised word written with the first
    word of a subject's name ("Zephyr") that the name lacks and the subject's documents never
    write ("Kettle"), so the message names a thing of its own, not the Zephyr Buds in part; "".
    A shared type word ("Visitor Card" beside the Adult Card) is no sign, a sentence's first
    word is capitalised anyway, and without the documents' texts nothing is known."""
    for run in _name_runs(text):
        keys = [name_key(m.group(0)) for m in run]
        for subject in (s for s in index.subjects if s.tokens and s.tokens[0] in keys):
            for match, key in zip(run, keys, strict=True):
                if (key not in subject.tokens and not _starts_sentence(text, match)
                        and index.uses(subject, match.group(0)) is False):
                    return match.group(0)
    return ""


def read_message(text: str, index: SubjectIndex, grammar: Grammar) -> Reading:
    """Split a user message into subject names and attribute words (see ``Reading``)."""
    fresh_match = grammar.fresh_start.match(text)
    rest = text[fresh_match.end():] if fresh_match else text
    named = tuple(index.find(rest[:_MAX_SCAN_CHARS]))
    attribute, how_words, elliptical, pronoun = _attribute_words(grammar.pointing(rest), named, index, grammar)
    if not attribute and grammar.how_much.search(rest):
        attribute = ["price", "cost"]
    # Appended alone to another subject's search, "long warranty" reads as a question about
    # length: keep the words that name the attribute ("warranty"), unless there are none
    # ("How heavy is it?").
    kind_only = _asks_a_kind_only(attribute, how_words, grammar)
    attribute = [w for w in attribute if w not in how_words] or attribute
    refines = kind_only or _adds_or_echoes(rest, attribute, grammar)
    # "Thanks. What about the Nimbus Tab?" is still a follow-up: only a message that asks
    # something of its own after the thanks starts afresh.
    fresh = (bool(fresh_match) and bool(rest.strip()) and not elliptical and not pronoun
             and not grammar.ellipsis.match(rest) and not grammar.continues.match(rest))
    thing = "" if named or pronoun else _thing_asked(rest, grammar) or _foreign_name_word(rest, index)
    plain = not (named or pronoun or refines or grammar.ellipsis.match(rest))
    topic = tuple(w for w in attribute if normalize(w) not in grammar.generic
                  and stem(normalize(w)) not in grammar.light_stems) if plain else ()
    return Reading(named, tuple(attribute), elliptical and bool(named), pronoun, fresh, not fresh and refines, thing,
                   topic)


@dataclass
class ConversationState:
    """The subject and attribute after a message, and the rules that produced them."""

    subject: Subject | None = None
    attribute: tuple[str, ...] = ()
    previous_subject: Subject | None = None
    subject_rule: str = "none"      # none, set, kept, replaced, fresh
    attribute_rule: str = "none"    # none, new, inherited
    # Whether the conversation has moved from one subject to another since it (re)started.
    switched: bool = False

    def leaves_for(self, reading: Reading, index: SubjectIndex | None) -> bool:
        """Whether ``reading`` asks about a thing of its own ("Do you sell blenders?"): one the
        documents of the subject talked about never write, or when no subject was talked about;
        or, naming nothing, asks what only a topic's page writes (``SubjectIndex.topic_page``).
        Without the documents' texts (an index built from rows alone) it is not known: no."""
        if not reading.thing:
            # "How do I contact support?" after a product: words only a topic's page writes.
            return (self.subject is not None and index is not None
                    and index.topic_page(self.subject, list(reading.topic_words)) is not None)
        if self.subject is None:
            return True
        return index is not None and index.uses(self.subject, reading.thing) is False

    def step(self, reading: Reading, grammar: Grammar, index: SubjectIndex | None = None) -> ConversationState:
        """The state after ``reading`` (this one is not changed)."""
        new = ConversationState(previous_subject=self.subject, switched=self.switched)
        if reading.fresh or self.leaves_for(reading, index):
            new.subject = reading.named[-1] if reading.named else None
            new.subject_rule = "fresh"
            new.attribute = reading.attribute
            new.attribute_rule = "new" if reading.attribute else "none"
            new.switched = False  # what came before no longer counts
            return new
        if reading.named:
            new.subject = reading.named[-1]
            new.subject_rule = ("set" if self.subject is None else
                                "kept" if new.subject == self.subject else "replaced")
            new.switched = self.switched or new.subject_rule == "replaced"
        else:
            new.subject = self.subject
            new.subject_rule = "kept" if self.subject else "none"
        inherited = self._inheritable(new.subject, index)
        if reading.refines and inherited:
            own = [w for w in reading.attribute if normalize(w) not in grammar.value_kind]
            new.attribute = tuple(dict.fromkeys([*inherited, *own]))
            new.attribute_rule = "inherited"
        elif reading.attribute:
            new.attribute, new.attribute_rule = reading.attribute, "new"
        elif reading.elliptical and inherited:
            new.attribute, new.attribute_rule = inherited, "inherited"
        else:
            # Nothing asked: the last attribute stays the one a later "And the X?" inherits.
            new.attribute, new.attribute_rule = inherited, "none"
        return new

    def _inheritable(self, subject: Subject | None, index: SubjectIndex | None) -> tuple[str, ...]:
        """The attribute a message about ``subject`` may inherit. A topic page's name is not an
        attribute of another topic page: "what about the loyalty card?" after "How much is
        delivery?" asks about the card, not its delivery. An item keeps it ("And the Zephyr
        Buds?" may ask what their delivery costs)."""
        if index is None or subject is None or subject == self.subject or index.kinds.get(subject.name):
            return self.attribute
        pages = index.topic_names_in({name_key(w) for w in self.attribute}) - set(subject.tokens)
        return tuple(w for w in self.attribute if name_key(w) not in pages)

    def describe(self) -> dict[str, Any]:
        """The trace's ``queries.followup`` entry."""
        return {
            "subject": self.subject.name if self.subject else None,
            "previous_subject": self.previous_subject.name if self.previous_subject else None,
            "subject_rule": self.subject_rule,
            "attribute": " ".join(self.attribute) or None,
            "attribute_rule": self.attribute_rule,
        }


class FollowUpEnricher(QueryTransformer):
    """Resolves a follow-up: appends the conversation's subject, or the attribute it inherits.

    A question counts as dependent when it points back (a pronoun such as "it" or "they", or
    an elliptical opening such as "And the battery?") or has fewer than ``min_own_terms``
    content words of its own. Such a question gets up to ``max_terms`` terms appended (see
    ``salient_terms``); a self-contained question is left alone.

    Subjects and attributes (``track_subjects``, on by default): the names the corpus has as
    document titles or name-like headings (``subjects.subject_index``) are the subjects a
    conversation can be about; the other words a user asks with are the attribute. Reading the
    user's messages oldest first (``ConversationState.step``):

    * a message naming a new subject replaces the subject; when it asks nothing of its own
      ("And the X?", "What about X?", "How about X?", "X?", "Same for X") it inherits the last
      attribute, which is appended to the search ("What about the Nimbus Tab? battery life");
      names of the subjects left behind are never appended;
    * a follow-up without a name ("And its warranty?") keeps the subject; once the conversation
      has switched subjects, only the current subject's name is appended;
    * a message that starts afresh ("Thanks. Now, what is your return policy?") carries
      nothing, and nothing said before it is carried later; so does one asking whether the shop
      has a thing the current subject's documents never write ("Do you sell blenders?");
    * a conversation that never names a corpus subject, or stays on one, is enriched as
      before (``enrich``), which is what ``bench/bench_canard.py`` measures.

    The trace's ``queries.followup`` says which rule fired (``subject_rule``: set, kept,
    replaced, fresh or none; ``attribute_rule``: new, inherited or none), and the step's note
    repeats it in words.

    Options: ``max_terms`` (4), ``lookback`` (10) user turns read, newest first;
    ``use_answers`` (True) lets names from the latest answer stand in when the user never
    named anything; ``min_own_terms`` (3); ``decay`` (0.7), the weight of a mention one user
    turn older than another; ``track_subjects`` (True; False is the subject-blind behaviour
    of earlier versions, kept for comparison in ``bench/bench_followup.py``); ``carry_opening``
    (None: on when the profile's embedder, handed in as ``embedder``, is a local semantic
    model): search every question that does not start afresh or switch subjects with the
    conversation's opening message appended, instead of the ranked names (``enrich``).

    Tuned on the first 100 dialogs of CANARD with ``bench/bench_canard.py`` (see
    bench/README.md): against the first version (names and topic words of the last 3 user
    turns, names of the latest answer), recall@5 of the turn's answer passage rose from 0.43
    to 0.72 there, and from 0.47 to 0.70 on the 50 held-out dialogs.
    """

    name = "followup"
    order = 50
    uses_vocabulary = True
    uses_embedder = True
    # A mention in an answer counts half a mention by the user: answers name many things in
    # passing, the user names what they ask about.
    ANSWER_WEIGHT = 0.5

    def __init__(self, profile, *, max_terms: int = 4, lookback: int = 10, use_answers: bool = True,
                 min_own_terms: int = 3, decay: float = 0.7, track_subjects: bool = True,
                 carry_opening: bool | None = None, vocabulary: Vocabulary, embedder: Any = None, **options: Any):
        super().__init__(profile, **options)
        self.max_terms = max_terms
        self.lookback = lookback
        self.use_answers = use_answers
        self.min_own_terms = min_own_terms
        self.decay = decay
        self.track_subjects = track_subjects
        # The profile's vocabulary: its language's words, and the synonym table that tells a
        # shop-policy question when the profile lets query components read it.
        self.vocabulary = vocabulary
        self.grammar = Grammar.of(vocabulary)
        # A meaning embedder reads a whole message: a dependent question searched with the
        # conversation's opening message finds its passage more often than with the names
        # ranked from it (CANARD, bench/README.md). Words hashed one by one do not.
        semantic = bool(getattr(embedder, "local_semantic", False))
        self.carry_opening = semantic if carry_opening is None else bool(carry_opening)

    def _asks_a_shop_policy(self, text: str) -> bool:
        """"Will I get my money back?": every attribute it asks is of the ``policy`` class (only
        when the profile lets query components read the synonym table)."""
        vocabulary = self.vocabulary
        return vocabulary.synonyms_in_queries and vocabulary.asks_only(text, vocabulary.group_class("policy"))

    def is_dependent(self, text: str) -> bool:
        """Whether the question likely needs the conversation to be understood."""
        return self._points_back(text) or len(self._own_terms(text)) < self.min_own_terms

    def _points_back(self, text: str) -> bool:
        """"it", "they", "What about ...?", "and ...?"."""
        return (any(t in self.grammar.anaphora for t in words(self.grammar.pointing(text)))
                or bool(self.grammar.ellipsis.match(text)))

    def _own_terms(self, text: str) -> set[str]:
        # "ok but whats the exact capacity?": fillers and words that ask nothing are no content.
        return {t for t in content_terms(text) if t not in self.grammar.light_stems}

    def _opens_a_topic(self, text: str) -> bool:
        """A question that points back at nothing and asks a word of its own ("How much does a
        service cost?", "Do you deliver?"): a later "it" is the newest such thing asked about,
        even when the question itself was short enough to be searched with the one before."""
        return _is_question(text) and not self._points_back(text) and bool(self._own_terms(text))

    def _switches_topic(self, text: str, topic: str) -> bool:
        """"what about delivery?" after "How much does the plant care service cost?": an
        elliptical question naming a thing of its own, not a qualifier of the last one ("and for
        orders over £500?", "and on Sundays?") nor a word of ``topic``, the question it follows."""
        match = self.grammar.ellipsis.match(text)
        if not match or not _is_question(text) or any(t in self.grammar.anaphora for t in words(text)):
            return False
        rest = words(text[match.end():])
        if not rest or rest[0] in self.grammar.refining_prepositions:
            return False
        own = {t for t in self._own_terms(text) if not self.vocabulary.is_calendar(t)}
        return bool(own) and not own & set(content_terms(topic))

    def salient_terms(self, query: Query) -> list[str]:
        """Terms naming what the conversation is about, best first, none already in the query.

        1. Candidates are the names, acronyms and codes the user wrote in the last
           ``lookback`` turns.
        2. Each is ranked by its mentions anywhere in those turns, questions and answers
           (answers count ``ANSWER_WEIGHT``), each mention weighted ``decay ** age`` where
           age counts user turns since it: the conversation's subject, named at the start and
           mentioned again and again, outranks a name dropped once, and a name in the newest
           turn outranks an older one mentioned as often. Ties go to the newest.
        3. When the user named nothing, the names the latest answer introduced stand in
           ("Which phone has the best camera?" ... "How much is it?"), unless ``use_answers``
           is off; an answer's acronyms and codes (48 MP, 1-inch) are details, never
           candidates.
        4. When nobody named anything, the topic words of the newest user turn are used.
        """
        window, turns = [], 0  # the messages of the last ``lookback`` user turns, newest first
        for message in reversed(query.history):
            if turns >= self.lookback:
                break
            window.append(message)
            turns += message.role == "user"
        known = mid_sentence_names([m.content for m in window])
        own = {stem(w) for w in words(query.text)}
        votes: dict[str, float] = {}
        surface: dict[str, str] = {}  # the newest spelling of each term
        user_names: list[str] = []
        answer_names: list[str] = []
        topic_words: list[str] = []
        age = 0  # user turns newer than the message being read
        seen_user = seen_answer = False
        for message in window:
            from_user = message.role == "user"
            weight = self.decay ** age * (1.0 if from_user else self.ANSWER_WEIGHT)
            for token, kind in classify_tokens(message.content, known):
                key = stem(normalize(token))
                if key in own:
                    continue
                surface.setdefault(key, token)
                if kind == TOPIC:
                    if from_user and not seen_user and key not in topic_words:
                        topic_words.append(key)
                    continue
                votes[key] = votes.get(key, 0.0) + weight
                if from_user:
                    if key not in user_names:
                        user_names.append(key)
                elif not seen_answer and kind == NAME and key not in answer_names:
                    answer_names.append(key)
            if from_user:
                seen_user = True
                age += 1
            else:
                seen_answer = True
        candidates = user_names or (answer_names if self.use_answers else [])
        # sorted() is stable: equal votes keep the newest-first order of first mention.
        ranked = sorted(candidates, key=lambda key: -votes[key]) or topic_words
        return [surface[key] for key in ranked[: self.max_terms]]

    def transform(self, query, turn):
        """The follow-up resolved (see the class docstring). With a turn, the corpus's subject
        names are looked up first (one query, cached); without one (unit use) there are none."""
        # A first message is looked at only when it may name a kind ("the tablet").
        if not self.track_subjects or turn is None or not (query.history or self.grammar.kind_pointer.search(query.text)):
            return self._resolve_own_answer_first(query, turn, None)
        return self._resolve_with_subjects(query, turn)

    def _resolve_own_answer_first(self, query: Query, turn: TurnContext | None, index: SubjectIndex | None):
        """``resolve``, unless the question points back at an answer about the asker's own things
        (read in the search's thread: the cited sources' titles are one statement)."""
        answer = self._answer_about_own_things(query, turn) if index is not None else ""
        if answer:
            return _noted(query, f"follow-up: added the words of the answer about the asker's own things {answer!r}",
                          text=f"{query.text} {answer}")
        return self.resolve(query, turn, index)

    async def _resolve_with_subjects(self, query, turn):
        # In the thread: "Do you sell blenders?" may read the current subject's documents.
        return await sync_to_async(self._resolve_in_thread)(query, turn)

    def _resolve_in_thread(self, query, turn):
        index = subject_index(turn.components.embedder.space, language=self.vocabulary.language,
                              principals=getattr(turn, "principals", None))
        return self._resolve_own_answer_first(query, turn, index)

    def state_of(self, query: Query, index: SubjectIndex) -> tuple[ConversationState, ConversationState, Reading]:
        """(the state before the question, after it, and the question's reading), from the
        user messages of the last ``lookback`` turns, oldest first."""
        messages = [m.content for m in query.history if m.role == "user"][-self.lookback:] if self.lookback else []
        state = ConversationState()
        for text in messages:
            state = state.step(read_message(text, index, self.grammar), self.grammar, index)
        reading = read_message(query.text, index, self.grammar)
        return state, state.step(reading, self.grammar, index), reading

    def since_fresh_start(self, query: Query, index: SubjectIndex) -> Query:
        """``query`` with the history before the last fresh start dropped: what the user left
        behind with "Thanks. Now, ..." is never carried into a later follow-up."""
        start, state = 0, ConversationState()
        for position, message in enumerate(query.history):
            if message.role == "user":
                state = state.step(read_message(message.content, index, self.grammar), self.grammar, index)
                if state.subject_rule == "fresh":
                    start = position
        return query.replace(history=query.history[start:]) if start else query

    def resolve(self, query: Query, turn: TurnContext | None, index: SubjectIndex | None):
        """The transformed query, given the corpus's subjects (``index``; ``None``: the
        subject-blind behaviour of ``track_subjects: False``). What the memory wrote ("Facts
        about me: ...") is no message of the user's: it is never carried nor read as one."""
        if any(m.from_memory for m in query.history):
            said = query.replace(history=tuple(m for m in query.history if not m.from_memory))
            return self.resolve(said, turn, index).replace(history=query.history)
        if not query.history:
            return self._first_message(query, index)
        if index is None or not len(index):
            if index is None:  # the subject-blind behaviour (track_subjects: False)
                return self.enrich(query, newest_topic=True)
            return self._without_subjects(query, index)
        _before, after, reading = self.state_of(query, index)
        if turn is not None and isinstance(getattr(turn, "trace", None), dict):
            turn.trace.setdefault("queries", {})["followup"] = after.describe()
        rules = (f"subject {after.subject_rule}"
                 + (f" ({after.subject.name})" if after.subject else "")
                 + f", attribute {after.attribute_rule}"
                 + (f" ({' '.join(after.attribute)})" if after.attribute else ""))
        if reading.fresh:
            return _noted(query, f"fresh start: nothing carried; {rules}")
        if after.subject_rule == "fresh":
            # "Do you sell blenders?" after the Zephyr Buds: a thing their documents never write
            # is the question's own subject; the conversation's would pull its passages first.
            asked = reading.thing or " ".join(reading.topic_words)
            return _noted(query, f"asks about a thing of its own ({asked}): nothing carried; {rules}")
        if (not reading.named and after.subject is not None and after.subject in index.kind_keys
                and self._asks_a_shop_policy(query.text)):
            # "I'd like to return my Zephyr Buds." / "Will I get my money back?": the shop's
            # returns page answers for every product; the product's name would pull its own
            # passages above it.
            return _noted(query, f"asks a shop policy: nothing carried; {rules}")
        if reading.named and (after.subject_rule != "kept" or after.attribute_rule == "inherited"):
            return self._named(query, after, rules)
        if not self.carry_opening and not self.is_dependent(query.text):
            return _noted(query, f"self-contained; {rules}")
        if after.subject is not None and after.switched:
            # The conversation switched subjects: only the current one is carried, never the
            # names of the subjects it left (which the subject-blind ranking would add).
            return self._added(query, [after.subject.name] if not self._names_it(query.text, after.subject) else [],
                               rules)
        return self._enriched(query, index, after, rules)

    def _without_subjects(self, query: Query, index: SubjectIndex) -> Query:
        """A follow-up in a corpus naming no subject (a helpdesk's topic pages): ``enrich``, but a
        message that starts afresh ("Thanks. Now, how long does a new laptop take?") carries
        nothing, and nothing said before it is carried later."""
        if read_message(query.text, index, self.grammar).fresh:
            return _noted(query, "fresh start: nothing carried")
        start = max((position for position, message in enumerate(query.history) if message.role == "user"
                     and read_message(message.content, index, self.grammar).fresh), default=0)
        return self.enrich(query.replace(history=query.history[start:]), newest_topic=True).replace(
            history=query.history)

    @staticmethod
    def _first_message(query: Query, index: SubjectIndex | None) -> Query:
        """"How much is the tablet?": the one subject the corpus defines as a tablet."""
        kinds = [s for s, _ in index.kind_named(query.text)] if index is not None and len(index) else []
        if kinds and not index.find(query.text, kinds=False):
            return _noted(query, f"no history; names a kind: added {[kinds[0].name]}",
                          text=f"{query.text} {kinds[0].name}")
        return _noted(query, "no history")

    @staticmethod
    def _names_it(text: str, subject: Subject) -> bool:
        return set(subject.tokens) <= {stem(w) for w in words(text)}

    @staticmethod
    def _added(query: Query, added: list[str], rules: str) -> Query:
        if added:
            return _noted(query, f"follow-up: {rules}: added {added}", text=f"{query.text} {' '.join(added)}")
        return _noted(query, f"self-contained (names its subject); {rules}")

    def _named(self, query: Query, after: ConversationState, rules: str) -> Query:
        """A message naming a subject that moves the conversation, or inherits its attribute."""
        own = {stem(w) for w in words(query.text)}
        added = []
        if after.subject is not None and not set(after.subject.tokens) <= own:
            added.append(after.subject.name)  # "And the tablet?": the one subject that is a tablet
        if after.attribute_rule == "inherited":
            added += [w for w in after.attribute if stem(normalize(w)) not in own]
        return self._added(query, added, rules)

    def _enriched(self, query: Query, index: SubjectIndex, after: ConversationState, rules: str) -> Query:
        """A dependent question in a conversation on one subject: ``enrich``, and the attribute
        it inherits ("How long is it?" after the warranty: its length)."""
        result = self._subject_for_opening(self.since_fresh_start(query, index), index, after)
        if after.attribute_rule == "inherited":
            own = {stem(w) for w in words(result.text)}
            added = [w for w in after.attribute if stem(normalize(w)) not in own]
            if added:
                result = _noted(result, f"{result.metadata['transform_note']}; added {added}",
                                text=f"{result.text} {' '.join(added)}")
        return _noted(result.replace(history=query.history), f"{result.metadata['transform_note']}; {rules}")

    def _subject_for_opening(self, query: Query, index: SubjectIndex, after: ConversationState) -> Query:
        """``enrich``, unless the opening message it would carry is about something else than the
        subject of the latest turns ("Do you sell espresso machines?" before the Millstone G2 was
        asked about): then the subject's name, as the ranked names would, for the opening's words
        would pull the search away from what is talked about."""
        if after.subject is None:
            return self.enrich(query, newest_topic=True)
        opening = self.opening_message(query) if self.carry_opening else ""
        if not opening:
            return self.enrich(query)
        switch = self._later_switch(query, index, after.subject, opening)
        if switch:
            return _noted(query, f"follow-up: added {switch!r}, which turned from {after.subject.name!r}",
                          text=f"{query.text} {switch}")
        if not self._elsewhere(opening, index, after.subject):
            enriched = self.enrich(query)
            users = [m.content for m in query.history if m.role == "user"]
            naming = next((m for m in reversed(users) if self._names_it(m, after.subject)), "")
            if self._names_it(enriched.text, after.subject) or not naming.rstrip().endswith("?"):
                return enriched  # "I want to visit Central Library.": context, as the opening is
            # "My dad is 80 and new to smartphones." then "Is the Aurora X2 easy to see outdoors?",
            # then "How bright does it go?": the opening is context; "it" is the subject asked about.
            return _noted(enriched, f"{enriched.metadata['transform_note']} and the subject {after.subject.name!r}",
                          text=f"{enriched.text} {after.subject.name}")
        if self._names_it(query.text, after.subject):
            return _noted(query, "self-contained (names its subject)")
        return _noted(query, f"follow-up: added the subject {after.subject.name!r}, not the opening message",
                      text=f"{query.text} {after.subject.name}")

    def _later_switch(self, query: Query, index: SubjectIndex, subject: Subject, opening: str) -> str:
        """The newest earlier message that turned the conversation from ``subject`` to a thing of
        its own that ``subject``'s documents never write ("what about delivery?" after "How much
        does the plant care service cost?"), or "": "and how long does that take?" asks of it."""
        users = [m.content[:_MAX_SCAN_CHARS].strip() for m in query.history if m.role == "user"][-self.lookback:]
        for text in reversed(users[1:] if self.lookback else []):
            if self._switches_topic(text, opening) and all(
                    index.uses(subject, term) is False for term in self._own_terms(text)):
                return text
        return ""

    def _elsewhere(self, opening: str, index: SubjectIndex, subject: Subject) -> bool:
        """Whether ``opening`` names another subject, asks about a thing of its own that
        ``subject``'s documents never write, or is a question naming nothing ("What is the
        status of my order?": it asked its own thing, and ``subject`` was named after it). One
        that says something and names nothing ("I'm a wheelchair user.") is context for whatever
        is asked next, and still carried."""
        reading = read_message(opening, index, self.grammar)
        if reading.named:
            return subject not in reading.named
        if opening.rstrip().endswith("?"):
            return True
        return bool(reading.thing) and index.uses(subject, reading.thing) is False

    def enrich(self, query: Query, *, newest_topic: bool = False) -> Query:
        """The subject-blind follow-up: salient names of the history appended to a dependent
        question (the behaviour before subjects were tracked, and the fallback when the
        conversation names no subject of the corpus). With ``carry_opening`` (a semantic
        embedder), every question that does not start afresh is searched with the conversation's
        opening message instead, whatever its own words: the embedding reads the question's words
        and the opening's together. ``newest_topic``: in a conversation that names no subject of
        the corpus, the newest question that opened a topic stands in for an opening question
        (``opening_message``)."""
        opening = self.opening_message(query, newest_topic=newest_topic) if self.carry_opening else ""
        if opening:
            which = "the opening message" if not newest_topic or opening == self.opening_message(query) else \
                "the question that opened the topic"
            return _noted(query, f"follow-up: added {which} {opening!r}", text=f"{query.text} {opening}")
        if not self.is_dependent(query.text):
            return _noted(query, "self-contained")
        terms = self.salient_terms(query)
        if not terms:
            return _noted(query, "no salient terms")
        return _noted(query, f"follow-up: added {terms}", text=f"{query.text} {' '.join(terms)}")

    def _answer_about_own_things(self, query: Query, turn: TurnContext | None) -> str:
        """What the answer to the question that opened the topic was about, when that question
        asked about the asker's own things (the language's ``asker_owns``), the asker is signed
        in (their rows may have answered) and the question points back with a pronoun: after
        "When is my next appointment?", "And how much does that cost?" asks of the check-up their
        row says, which the question's words ("appointment") do not name; after "When is my next
        stay?", "Is breakfast included in that?" asks of the Heron Suite. That is the answer's
        topic words and what the titles of the sources it cited name ("Your reservation: Heron
        Suite": one statement, in those turns only), when some of those sources were the asker's
        own rows; "" otherwise."""
        owns = self.vocabulary.language.patterns.get("asker_owns")  # optional: a language may have none
        if (owns is None or turn is None or not users_only(turn.principals).tokens
                or not any(t in self.grammar.anaphora for t in words(self.grammar.pointing(query.text)))):
            return ""
        said = [m for m in query.history if not (m.is_tool_exchange or m.from_memory)]
        # "Who is it with?" after "And how much does that cost?" still asks of the check-up.
        opened = max((i for i, m in enumerate(said) if m.role == "user" and not self._points_back(m.content)),
                     default=-1)
        if (opened < 0 or not owns.search(said[opened].content) or opened + 1 >= len(said)
                or said[opened + 1].role != "assistant"):
            return ""
        answer = said[opened + 1]
        cited = MessageSource.objects.filter(message__conversation_id=turn.conversation.pk, message__seq=answer.seq,
                                             cited=True).values_list("title", "access")
        # Only an answer that quoted the asker's own rows was about them: "When is my next
        # class?" answered from the public timetable is carried as any follow-up is. Who could
        # read each source is the copy saved with the answer: a row deleted since still counts.
        named = [title.rsplit(":", 1)[-1].strip() for title, access in cited if only_for(access, turn.principals)]
        if not named:
            return ""
        # Its topic words, not its names ("Dr James Patel", "Tuesday"): those are the row's
        # details, not a subject every passage must name ("A check-up ... costs £55" names none).
        topic = [token for token, kind in classify_tokens(_CITATION_MARK.sub("", answer.content))
                 if kind == TOPIC and not any(c.isdigit() for c in token)]
        return " ".join(dict.fromkeys(word for word in [*topic, *named] if word))

    def opening_message(self, query: Query, *, newest_topic: bool = False) -> str:
        """The user's first message within ``lookback`` user turns (``query``'s history starts at
        the last fresh start when subjects are tracked): what the conversation is about, in the
        user's words; with ``newest_topic``, when that was a question (naming nothing of the
        corpus, or only a thing of its own: "When is the appointment for Rex?"), the newest later
        one that opened a topic of its own (``_opens_a_topic``); "" when there is none or the
        question already holds all its words."""
        users = [m.content for m in query.history if m.role == "user"][-self.lookback:] if self.lookback else []
        if not users:
            return ""
        opening = users[0][:_MAX_SCAN_CHARS].strip()
        if newest_topic and _is_question(opening):
            # "Do you deliver on Saturdays?", then "How much does a service cost?", then "and how
            # long does it take?": a question that asks its own thing opened a topic, and a later
            # one pointing back at nothing opened the next; "it" is the newest.
            opening = next((text[:_MAX_SCAN_CHARS].strip() for text in reversed(users[1:])
                            if self._opens_a_topic(text)), opening)
        if set(content_terms(opening)) <= set(content_terms(query.text)):
            return ""
        return opening


def _is_question(text: str) -> bool:
    return text[:_MAX_SCAN_CHARS].rstrip().endswith("?")


def _noted(query: Query, note: str, **changes: Any) -> Query:
    return query.replace(metadata={**query.metadata, "transform_note": note}, **changes)


@hookimpl
def register_query_transformers(register):
    register(FollowUpEnricher)
