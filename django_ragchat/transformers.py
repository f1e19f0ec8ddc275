"""Query transformers: change the search query before retrieval.

Each enabled transformer receives the ``Query`` (with the selected history) and returns a new
one, ``SkipRetrieval`` or an ``EndTurn``. The user's original words stay in ``Query.original``;
only what is searched changes, and the trace keeps every step.

Built in: ``followup``, an offline, model-free resolver for dependent follow-ups. After "Tell
me about the Aurora X2 phone", the question "How much does it cost?" names nothing a search
can find; ``followup`` notices that the question depends on the conversation (a pronoun, or
too few content words of its own) and appends the salient terms of recent turns: names,
model numbers, then topic words, newest first. LLM-based rewriting, compression and
translation are provided by ``django_ragchat.llm_transformers`` when a model is configured.
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


def _salient_tokens(text: str) -> list[tuple[str, int, bool]]:
    """(token, salience, is_code) in order: salience 2 = a name or a code (Aurora, X2),
    1 = a topic word."""
    found = []
    for i, match in enumerate(_TOKEN_RE.finditer(text)):
        token = match.group(0)
        folded = normalize(token)
        if folded in STOPWORDS or len(folded) < 2:
            continue
        is_code = any(c.isdigit() for c in token) and any(c.isalpha() for c in token)
        starts_sentence = i == 0 or text[: match.start()].rstrip().endswith((".", "?", "!", ":"))
        is_name = token[0].isupper() and not starts_sentence
        salient = is_code or is_name or (token.isupper() and len(token) > 1)
        found.append((token, 2 if salient else 1, is_code))
    return found


class FollowUpEnricher(QueryTransformer):
    """Appends salient terms of recent turns to a follow-up that depends on them.

    Options: ``max_terms`` (6) terms appended at most; ``lookback`` (3) user turns read;
    ``use_answers`` (True) also reads the latest assistant answer, for names it introduced;
    ``min_own_terms`` (3): a question with fewer content words of its own counts as dependent.
    """

    name = "followup"
    order = 50

    def __init__(self, profile, *, max_terms: int = 6, lookback: int = 3, use_answers: bool = True,
                 min_own_terms: int = 3, **options: Any):
        super().__init__(profile, **options)
        self.max_terms = max_terms
        self.lookback = lookback
        self.use_answers = use_answers
        self.min_own_terms = min_own_terms

    def is_dependent(self, text: str) -> bool:
        """Whether the question likely needs the conversation to be understood."""
        tokens = words(text)
        if any(t in ANAPHORA for t in tokens) or _ELLIPSIS_RE.match(text):
            return True
        return len(set(content_terms(text))) < self.min_own_terms

    def salient_terms(self, query: Query) -> list[str]:
        """Terms from recent turns, deduplicated, best first.

        Order: names and codes of the user's turns (newest first), then topic words of the
        newest user turn together with names from the latest answer (an answer often names
        what "it" refers to, but its numbers and details are noise).
        """
        user_texts = [m.content for m in query.history if m.role == "user"][-self.lookback:]
        sources = [(text, False) for text in reversed(user_texts)]
        if self.use_answers:
            answers = [m.content for m in query.history if m.role == "assistant"]
            if answers:
                sources.insert(1, (answers[-1][:300], True))
        seen = {stem(w) for w in words(query.text)}
        candidates: list[tuple[tuple[int, int, int], str]] = []
        for age, (text, from_answer) in enumerate(sources):
            for position, (token, salience, is_code) in enumerate(_salient_tokens(text)):
                key = stem(normalize(token))
                if from_answer and (is_code or salience < 2 or token.isupper()):
                    continue
                # Topic words of older turns are mostly noise; names are kept from any turn.
                if key in seen or (salience == 1 and age > 0):
                    continue
                seen.add(key)
                rank = 1 if from_answer else 2 - salience
                candidates.append(((rank, age, position), token))
        candidates.sort(key=lambda c: c[0])
        return [token for _, token in candidates[: self.max_terms]]

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
