"""Query expanders: one query in, several out (the original plus variants).

Every (query, retriever) pair is then retrieved concurrently and the joiner fuses the lists.
``synonyms`` (offline, on by default) adds the synonym-group names of the query's phrases as a
second query; ``multi_query`` (an LLM proposes variants) is provided by
``django_ragchat.llm_transformers`` when a model is configured.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django_ragchat import hookimpl
from django_ragchat.components import Component
from django_ragchat.extractive import group_names, table_for
from django_ragchat.types import EndTurn, Query, SkipRetrieval

if TYPE_CHECKING:
    from django_ragchat.context import TurnContext


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
    vector search both meet the passage. The groups are the extractive answerer's table
    (``django_ragchat.extractive.SYNONYMS``, extended by the profile's ``extractive``
    ``synonyms`` option), so retrieval and answering read a question the same way. No variant
    when every group the query names is already spelled out in it.
    """

    name = "synonyms"
    description = "adds the synonym-group names of the query's phrases as a second query (offline)"

    def __init__(self, profile, **options):
        super().__init__(profile, **options)
        self.table = table_for(profile)  # once per profile, as the answerer's own: never per turn

    def expand(self, query: Query, turn: TurnContext) -> list[Query]:
        names = group_names(query.text, self.table)
        if not names:
            return []
        return [query.replace(text=f"{query.text} {' '.join(names)}")]


@hookimpl
def register_query_expanders(register):
    register(SynonymExpander)
