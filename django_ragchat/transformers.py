"""Query transformers: change the search query before retrieval.

Each enabled transformer receives the ``Query`` (with the selected history) and returns a new
one, ``SkipRetrieval`` or an ``EndTurn``. The user's original words stay in ``Query.original``;
only what is searched changes, and the trace keeps every step.

Built in: ``followup``, an offline, model-free resolver for dependent follow-ups. After "Tell
me about the Aurora X2 phone", the question "How much does it cost?" names nothing a search
can find; ``followup`` notices that the question depends on the conversation (a pronoun, or
too few content words of its own) and appends what the conversation is about: the names and
model numbers the user wrote, ranked by how often and how recently they were mentioned. Its
retrieval quality is measured on CANARD by ``bench/bench_canard.py``. LLM-based rewriting,
compression and translation are provided by ``django_ragchat.llm_transformers`` when a model
is configured.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from django_ragchat import hookimpl
from django_ragchat.components import Component
from django_ragchat.text import STOPWORDS, content_terms, normalize, stem, words
from django_ragchat.types import EndTurn, Query, SkipRetrieval

if TYPE_CHECKING:
    from django_ragchat.pipeline import TurnContext


class QueryTransformer(Component):
    """Base class: ``transform(query, turn)`` returns a ``Query``, ``SkipRetrieval`` or ``EndTurn``.

    Set ``query.metadata["transform_note"]`` to explain a decision in the trace (e.g. "no
    history: skipped").
    """

    kind = "query_transformer"

    def transform(self, query: Query, turn: TurnContext) -> Query | SkipRetrieval | EndTurn:
        return query


# Words that point back into the conversation.
ANAPHORA = frozenset(
    "it its it's itself they them their theirs this that these those he him his she her hers "
    "there such same former latter above aforementioned one ones another other".split()
)
# Phrases that open an elliptical follow-up ("What about the price?", "And the battery?").
_ELLIPSIS_RE = re.compile(r"^\s*(and|what about|how about|also|then|so|or)\b", re.IGNORECASE)
_TOKEN_RE = re.compile(r"[^\W_]+(?:['’\-][^\W_]+)*")
# How far into a message names are looked for: long answers add cost, not subjects.
_MAX_SCAN_CHARS = 1000

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
        for i, match in enumerate(_TOKEN_RE.finditer(text[:_MAX_SCAN_CHARS])):
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


class FollowUpEnricher(QueryTransformer):
    """Appends the conversation's subject to a follow-up that depends on it.

    A question counts as dependent when it points back (a pronoun such as "it" or "they", or
    an elliptical opening such as "And the battery?") or has fewer than ``min_own_terms``
    content words of its own. Such a question gets up to ``max_terms`` terms appended (see
    ``salient_terms``); a self-contained question is left alone.

    Options: ``max_terms`` (4), ``lookback`` (10) user turns read, newest first;
    ``use_answers`` (True) lets names from the latest answer stand in when the user never
    named anything; ``min_own_terms`` (3); ``decay`` (0.7), the weight of a mention one user
    turn older than another.

    Tuned on the first 100 dialogs of CANARD with ``bench/bench_canard.py`` (see
    bench/README.md): against the first version (names and topic words of the last 3 user
    turns, names of the latest answer), recall@5 of the turn's answer passage rose from 0.43
    to 0.72 there, and from 0.47 to 0.70 on the 50 held-out dialogs.
    """

    name = "followup"
    order = 50
    # A mention in an answer counts half a mention by the user: answers name many things in
    # passing, the user names what they ask about.
    ANSWER_WEIGHT = 0.5

    def __init__(self, profile, *, max_terms: int = 4, lookback: int = 10, use_answers: bool = True,
                 min_own_terms: int = 3, decay: float = 0.7, track_subjects: bool = True,
                 **options: Any):
        super().__init__(profile, **options)
        self.max_terms = max_terms
        self.lookback = lookback
        self.use_answers = use_answers
        self.min_own_terms = min_own_terms
        self.decay = decay
        self.track_subjects = track_subjects

    def is_dependent(self, text: str) -> bool:
        """Whether the question likely needs the conversation to be understood."""
        tokens = words(text)
        if any(t in ANAPHORA for t in tokens) or _ELLIPSIS_RE.match(text):
            return True
        return len(set(content_terms(text))) < self.min_own_terms

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
        if not query.history:
            return query.replace(metadata={**query.metadata, "transform_note": "no history"})
        if not self.is_dependent(query.text):
            return query.replace(metadata={**query.metadata, "transform_note": "self-contained"})
        terms = self.salient_terms(query)
        if not terms:
            return query.replace(metadata={**query.metadata, "transform_note": "no salient terms"})
        return query.replace(
            text=f"{query.text} {' '.join(terms)}",
            metadata={**query.metadata, "transform_note": f"follow-up: added {terms}"},
        )


@hookimpl
def register_query_transformers(register):
    register(FollowUpEnricher)
