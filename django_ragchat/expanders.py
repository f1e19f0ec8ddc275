"""Query expanders: one query in, several out (the original plus variants).

Every (query, retriever) pair is then retrieved concurrently and the joiner fuses the lists.
No expander runs offline by default; ``multi_query`` (an LLM proposes variants) is provided by
``django_ragchat.llm_transformers`` when a model is configured.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django_ragchat.components import Component
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
