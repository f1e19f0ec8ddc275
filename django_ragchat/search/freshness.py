"""The corpus stamp: what the per-process caches of the stored corpus (the in-process vector
index, the subject index) compare before each use, so that ingestion in any process is seen.

One query reads it: the embedding space's chunks (count, highest id) and the documents (count,
highest id, newest update). Ids are never reused and ingestion saves a document whenever it
replaces its chunks or their access, so any change to what the caches hold changes the stamp.
Inside ``stamps_kept(memo)`` (a turn's searches, ``pipeline.searching_for``) each stamp is read
once and kept in ``memo``: the subject index and the vector index of one turn share one query,
and a change made during the turn is seen from the next turn on.
"""

from __future__ import annotations

import contextvars

from django.db import connections

from django_ragchat.models import Chunk, Document

_memo: contextvars.ContextVar[dict | None] = contextvars.ContextVar("ragchat_corpus_stamps", default=None)


class stamps_kept:  # lower case: used like a function, ``with stamps_kept(memo):``
    """Stamps read inside the block (and the tasks and threads it starts) are read once, kept
    in ``memo``."""

    __slots__ = ("memo", "token")

    def __init__(self, memo: dict):
        self.memo = memo

    def __enter__(self) -> None:
        self.token = _memo.set(self.memo)

    def __exit__(self, *exc_info: object) -> None:
        _memo.reset(self.token)


def corpus_stamp(space: str, using: str = "default", *, chunks: bool = True) -> tuple:
    """The stamp of embedding space ``space``: without ``chunks``, the documents' part alone (what
    the subject index needs where no in-process vector index reads the whole one)."""
    memo = _memo.get()
    key = (using, space, chunks)
    if memo is not None and key in memo:
        return memo[key]
    stamp = _read(space, using, chunks)
    if memo is not None:
        memo[key] = stamp
    return stamp


def _read(space: str, using: str, chunks: bool) -> tuple:
    connection = connections[using]
    qn = connection.ops.quote_name
    documents = qn(Document._meta.db_table)
    sql = f"SELECT COUNT(id), MAX(id), MAX(updated_at) FROM {documents}"
    params: list = []
    if chunks:
        sql = (f"SELECT COUNT(id), MAX(id), (SELECT COUNT(id) FROM {documents}), (SELECT MAX(id) FROM {documents}), "
               f"(SELECT MAX(updated_at) FROM {documents}) FROM {qn(Chunk._meta.db_table)} WHERE space = %s")
        params = [space]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return tuple(cursor.fetchone())
