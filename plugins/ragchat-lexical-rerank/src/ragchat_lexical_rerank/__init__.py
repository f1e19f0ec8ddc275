"""ragchat-lexical-rerank: a django-ragchat plugin that re-ranks retrieved chunks with BM25.

Vector search ranks by meaning and misses exact words: a model number, a name, a rare term.
This plugin registers the document post-processor ``lexical_rerank`` (order 500, enabled by
default), which scores the joined candidates with BM25 for the search query and blends that
with their incoming rank before ``top_k`` cuts the list. See ``LexicalRerank`` for the options.

Installing the distribution registers it (entry point group ``django_ragchat``); listing
``"ragchat_lexical_rerank"`` in ``RAGCHAT["PLUGINS"]`` does the same without entry points.
"""

from django_ragchat import hookimpl

from ragchat_lexical_rerank.rerank import LexicalRerank, bm25_scores

__all__ = ["LexicalRerank", "bm25_scores"]
__version__ = "0.1.0"


@hookimpl
def register_document_postprocessors(register):
    register(LexicalRerank)
