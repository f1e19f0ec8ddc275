"""SQLite (and any database without pgvector): FTS5 full text, filters resolved in SQL.

Full text uses an FTS5 table over the chunks' text, ``<chunk table>_fts``, an external-content
table (it stores only the index; the text stays in the chunk table) with the Porter stemmer.
Triggers on the chunk table keep it in step with every insert, update and delete, whoever makes
them (ingestion, re-embedding, the admin, a test's ``Chunk.objects.create``). Migration 0003
creates both. Rebuilding the chunk table in a later migration (SQLite's ALTER TABLE does that)
drops the triggers: the system check ``ragchat.W012`` notices and ``manage.py ragchat_index``
puts them back and rebuilds the index.

Vector search stays in process (``django_ragchat.search.vectorindex``); filters are resolved first by
one query to the ids of the chunks that pass them. Access (``django_ragchat.access``) is checked
in the SQL of the full-text search and of the fetch that follows every search; the in-process
index keeps each chunk's access so that a vector search finds ``k`` readable chunks.
"""

from __future__ import annotations

import numpy as np
from django.db import OperationalError, connections

from django_ragchat.access import UNRESTRICTED, Principals, access_sql
from django_ragchat.models import Chunk, Document
from django_ragchat.search.filters import SearchFilters

TOKENIZER = "porter unicode61 remove_diacritics 2"


def _names(connection) -> tuple[str, str, str, str]:
    """(chunk table, document table, FTS table, trigger prefix), quoted except the prefix."""

    qn = connection.ops.quote_name
    table = Chunk._meta.db_table
    return qn(table), qn(Document._meta.db_table), qn(f"{table}_fts"), f"{table}_fts"


def fts5_available(connection) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT sqlite_compileoption_used('ENABLE_FTS5')")
        return bool(cursor.fetchone()[0])


def fulltext_sql(connection) -> list[str]:
    """The statements that create the FTS5 table and its triggers and fill it (idempotent)."""
    chunk, _, fts, prefix = _names(connection)
    qn = connection.ops.quote_name
    delete = f"INSERT INTO {fts}({fts}, rowid, text) VALUES ('delete', old.id, old.text);"
    insert = f"INSERT INTO {fts}(rowid, text) VALUES (new.id, new.text);"
    return [
        f"CREATE VIRTUAL TABLE IF NOT EXISTS {fts} USING fts5(text, content={chunk}, content_rowid='id', "
        f"tokenize='{TOKENIZER}')",
        f"CREATE TRIGGER IF NOT EXISTS {qn(prefix + '_insert')} AFTER INSERT ON {chunk} BEGIN {insert} END",
        f"CREATE TRIGGER IF NOT EXISTS {qn(prefix + '_delete')} AFTER DELETE ON {chunk} BEGIN {delete} END",
        f"CREATE TRIGGER IF NOT EXISTS {qn(prefix + '_update')} AFTER UPDATE OF text ON {chunk} "
        f"BEGIN {delete} {insert} END",
        f"INSERT INTO {fts}({fts}) VALUES ('rebuild')",
    ]


def drop_fulltext_sql(connection) -> list[str]:
    _, _, fts, prefix = _names(connection)
    qn = connection.ops.quote_name
    return [f"DROP TRIGGER IF EXISTS {qn(prefix + suffix)}" for suffix in ("_insert", "_delete", "_update")] + [
        f"DROP TABLE IF EXISTS {fts}"
    ]


def fulltext_state(using: str = "default") -> str:
    """``ok``, ``missing`` (table or a trigger absent: run ``ragchat_index``) or ``unavailable``
    (this SQLite was built without FTS5)."""
    connection = connections[using]
    _, _, _, prefix = _names(connection)
    if not fts5_available(connection):
        return "unavailable"
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM sqlite_master WHERE name IN (%s, %s, %s, %s)",
                       [prefix, prefix + "_insert", prefix + "_delete", prefix + "_update"])
        return "ok" if len(cursor.fetchall()) == 4 else "missing"


def create_fulltext(using: str = "default") -> None:
    """Create (or repair) the FTS5 table and triggers, and rebuild the index from the chunks."""
    connection = connections[using]
    with connection.cursor() as cursor:
        for statement in fulltext_sql(connection):
            cursor.execute(statement)


class FullTextUnavailable(RuntimeError):
    """Full-text search was asked of a SQLite built without FTS5, or before migrating."""


def fulltext_ids(space: str, terms: list[str], k: int, *, filters: SearchFilters = SearchFilters(),
                 using: str = "default", principals: Principals = UNRESTRICTED) -> list[tuple[int, float]]:
    """(chunk id, BM25 score, higher is better) of the best ``k`` chunks matching any term that
    ``principals`` may read."""
    connection = connections[using]
    chunk, document, fts, _ = _names(connection)
    where, params = filters.sql("sqlite", document)
    readable, access_params = access_sql("sqlite", "c.access", principals)
    if readable:
        where, params = f"{where} AND {readable}", [*params, *access_params]
    match = " OR ".join(f'"{term}"' for term in terms)  # terms are \w+ tokens: no quotes inside
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT c.id, -bm25({fts}) FROM {fts} JOIN {chunk} c ON c.id = {fts}.rowid "
                f"WHERE {fts} MATCH %s AND c.space = %s{where} ORDER BY bm25({fts}), c.id LIMIT %s",
                [match, space, *params, k],
            )
            return [(int(i), float(s)) for i, s in cursor.fetchall()]
    except OperationalError:
        state = fulltext_state(using)
        if state == "unavailable":
            raise FullTextUnavailable("This SQLite was built without FTS5, which full-text search needs.") from None
        if state == "missing":
            raise FullTextUnavailable("The full-text index is missing: run `python manage.py ragchat_index` "
                                      "(or `migrate`).") from None
        raise


def allowed_ids(space: str, filters: SearchFilters, using: str = "default") -> np.ndarray:
    """The ids of ``space``'s chunks that pass ``filters``, for the in-process vector search."""
    connection = connections[using]
    chunk, document, _, _ = _names(connection)
    where, params = filters.sql("sqlite", document)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT c.id FROM {chunk} c WHERE c.space = %s{where}", [space, *params])
        return np.fromiter((row[0] for row in cursor.fetchall()), dtype=np.int64)
