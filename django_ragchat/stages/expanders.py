"""Query expanders: one query in, several out (the original plus variants).

Every (query, retriever) pair is then retrieved concurrently and the joiner fuses the lists.
``synonyms`` (offline, on by default) adds the synonym-group names of the query's phrases as a
second query; ``multi_query`` (an LLM proposes variants) is provided by
``django_ragchat.stages.llm_transformers`` when a model is configured.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django_ragchat import hookimpl
from django_ragchat.access import Principals, users_only
from django_ragchat.components import Component
from django_ragchat.types import EndTurn, Query, SkipRetrieval

if TYPE_CHECKING:
    from django_ragchat.answerer.vocabulary import Vocabulary
    from django_ragchat.turn.context import TurnContext


class QueryExpander(Component):
    """Base class: ``expand(query, turn)`` returns a list of queries.

    The pipeline always keeps the incoming query first and drops duplicate texts, so an
    expander may return only its variants.
    """

    kind = "query_expander"

    def expand(self, query: Query, turn: TurnContext) -> list[Query] | SkipRetrieval | EndTurn:
        return [query]


class SynonymExpander(QueryExpander):
    """Offline: one variant with the names of the synonym groups the query's phrases belong to.

    "Changed my mind, can I get my money back?" shares no word with a Returns passage; its
    variant adds "return" (the group of "money back" and "changed my mind"), so keyword and
    vector search both meet the passage. The groups are the profile's vocabulary (handed in by
    the turn runtime: ``lang/<code>/synonyms.toml`` with the profile's ``vocabulary`` setting),
    the table the extractive answerer reads, so retrieval and answering read a question the
    same way. No variant when every group the query names is already spelled out in it, nor
    when the profile does not let query components read the table (a model-backed profile, by
    default: docs/answerer.md).
    """

    name = "synonyms"
    description = "adds the synonym-group names of the query's phrases as a second query (offline)"
    uses_vocabulary = True

    def __init__(self, profile, *, vocabulary: Vocabulary, **options):
        super().__init__(profile, **options)
        self.vocabulary = vocabulary

    def expand(self, query: Query, turn: TurnContext) -> list[Query]:
        if not self.vocabulary.synonyms_in_queries:
            return []
        names = self.vocabulary.group_names(query.text)
        if not names:
            return []
        return [query.replace(text=f"{query.text} {' '.join(names)}")]


#: ``Query.metadata`` key: search only the rows shared with the asker by name (``access.users_only``).
ASKER_ROWS = "asker_rows"


#: How the trace names that variant after its text.
ASKER_ROWS_MARK = "(only the asker's own rows)"


def principals_for_query(query: Query, turn: TurnContext) -> Principals:
    """Whom a retriever reads as for ``query``: the asker, or only their own rows for a query
    marked ``ASKER_ROWS`` (``AskerRowsExpander``); never anyone wider."""
    return users_only(turn.principals) if query.metadata.get(ASKER_ROWS) else turn.principals


class AskerRowsExpander(QueryExpander):
    """Offline: a question about the asker's own things ("Which pets do I have appointments
    for?", "my booking", the language's ``asker_owns`` pattern) is searched a second time among
    the rows only shared with the asker by name (their appointments, orders), so that public
    pages that share its words ("appointments") cannot push them out of the top ``k``: the joiner
    fuses both lists. So is a question asking a window of time (the language's ``time_window``:
    "What is ready this week?"), which their dated rows may answer. Signed-in askers only; the
    variant has the same text, marked ``ASKER_ROWS``."""

    name = "asker_rows"
    description = "searches a question about the asker's own things among the rows shared with them by name too"
    uses_vocabulary = True

    def __init__(self, profile, *, vocabulary: Vocabulary, **options):
        super().__init__(profile, **options)
        # Both optional: a language may have neither.
        self.patterns = [p for p in map(vocabulary.language.patterns.get, ("asker_owns", "time_window")) if p]

    def expand(self, query: Query, turn: TurnContext) -> list[Query]:
        if not users_only(turn.principals).tokens or not any(p.search(turn.question) for p in self.patterns):
            return []
        return [query.replace(metadata={**query.metadata, ASKER_ROWS: True})]


@hookimpl
def register_query_expanders(register):
    register(SynonymExpander)
    register(AskerRowsExpander)
