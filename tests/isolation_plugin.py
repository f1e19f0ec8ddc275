"""Components of the isolation tests (``tests/test_isolation.py``), off unless a profile lists
them, loaded by the pytest process and the live servers (``tests/live_settings.py``):

* ``raw_words``: a plugin retriever that ignores access altogether: it reads ``Chunk`` rows
  whose text holds a word of the query straight from the ORM. The turn must drop what the
  asker may not read before anything sees it.
* ``plugin_fulltext``: a plugin retriever built on ``django_ragchat.search`` that never names
  whom it searches for: it must read as the turn's asker.
* ``code_expander``: query expansion with variants that match every private row ("code").
"""

from __future__ import annotations

import re

from asgiref.sync import sync_to_async

from django_ragchat import hookimpl, search
from django_ragchat.models import Chunk
from django_ragchat.stages.expanders import QueryExpander
from django_ragchat.stages.retrievers import Retriever
from django_ragchat.types import RetrievedChunk


class RawWordsRetriever(Retriever):
    name = "raw_words"
    enabled_by_default = False

    def _find(self, text: str, k: int) -> list[RetrievedChunk]:
        found = []
        for word in {w for w in re.findall(r"\w{5,}", text.lower())}:
            for chunk in Chunk.objects.filter(text__icontains=word).select_related("document")[:k]:
                found.append(RetrievedChunk(chunk_id=chunk.pk, text=chunk.text, score=1.0,
                                            document_id=chunk.document_id, source=chunk.document.source,
                                            title=chunk.document.title, heading=chunk.heading,
                                            ordinal=chunk.ordinal, retriever=self.name))
        return found[:k]

    async def retrieve(self, query, turn, k):
        return await sync_to_async(self._find)(query.text, k)


class PluginFullTextRetriever(Retriever):
    name = "plugin_fulltext"
    enabled_by_default = False

    async def retrieve(self, query, turn, k):
        return await sync_to_async(search.fulltext_search)(turn.components.embedder.space, query.text, k,
                                                           retriever=self.name)


class CodeExpander(QueryExpander):
    name = "code_expander"
    enabled_by_default = False

    def expand(self, query, turn):
        return [query, query.replace(text=f"{query.text} code"), query.replace(text="locker door code")]


@hookimpl
def register_retrievers(register):
    register(RawWordsRetriever)
    register(PluginFullTextRetriever)


@hookimpl
def register_query_expanders(register):
    register(CodeExpander)
