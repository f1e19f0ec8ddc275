"""``EmbeddingField``: one model field for vectors on every database; ``AccessField``: who may
read a row (see ``django_ragchat.access``).

On PostgreSQL the column is pgvector's untyped ``vector`` (no dimension fixed in migrations: a
reusable app cannot know whether a site embeds with 384 or 3072 dimensions; HNSW indexes are
built per embedding space on an expression cast, see docs/postgresql.md). Elsewhere it is a
BLOB of little-endian float32, four bytes a dimension, searched in process with numpy.
Python values are 1-d ``numpy.float32`` arrays either way.

Vectors travel to PostgreSQL as text literals (Django's psycopg cursors bind parameters on the
client). ``vector_literal`` writes them with nine significant digits, which round-trips every
float32 exactly and is twice as fast as pgvector-python's ``repr`` of each value. Bulk
ingestion does not go through this: ``django_ragchat.search.store_chunks`` sends pgvector's
binary format with COPY.
"""

from __future__ import annotations

import functools
import struct

import numpy as np
from django.db import models
from django.db.models import Lookup

from django_ragchat.access import Principals, access_sql, public_access


@functools.lru_cache(maxsize=16)
def _literal_format(dimension: int) -> str:
    return "[" + ",".join(["%.9g"] * dimension) + "]"


def vector_literal(value) -> str:
    """pgvector's text form of a vector, ``[0.1,-0.25,...]``, exact for float32 values."""
    array = np.asarray(value, dtype=np.float32).ravel()
    return _literal_format(array.shape[0]) % tuple(array.tolist())


def vector_binary(value) -> bytes:
    """pgvector's binary wire form of a vector (``vector_recv``): dimension, a zero, then
    big-endian float32 values. Used by binary COPY."""
    array = np.asarray(value, dtype=np.float32).ravel()
    return struct.pack(">HH", array.shape[0], 0) + array.astype(">f4").tobytes()


def parse_vector_literal(value: str) -> np.ndarray:
    """The float32 array of pgvector's text form (what PostgreSQL returns without adapters)."""
    return np.array(value.strip("[]").split(","), dtype=np.float32) if value != "[]" else np.zeros(0, np.float32)


class EmbeddingField(models.Field):
    description = "An embedding vector (pgvector on PostgreSQL, float32 bytes elsewhere)"

    def db_type(self, connection):
        return "vector" if connection.vendor == "postgresql" else "blob"

    def get_db_prep_value(self, value, connection, prepared=False):
        if value is None:
            return None
        if connection.vendor == "postgresql":
            return vector_literal(value)
        return np.asarray(value, dtype=np.float32).ravel().astype("<f4").tobytes()

    def from_db_value(self, value, expression, connection):
        if value is None:
            return None
        if isinstance(value, np.ndarray):
            return value.astype(np.float32, copy=False)
        if isinstance(value, (bytes, bytearray, memoryview)):
            return np.frombuffer(bytes(value), dtype="<f4").astype(np.float32)
        if isinstance(value, str):  # pgvector's text form: no adapter is registered
            return parse_vector_literal(value)
        return np.asarray(value, dtype=np.float32)

    def to_python(self, value):
        if value is None or isinstance(value, np.ndarray):
            return value
        return np.asarray(value, dtype=np.float32)

    def value_to_string(self, obj):
        value = self.value_from_object(obj)
        return None if value is None else [float(x) for x in value]


class AccessField(models.JSONField):
    """The principal tokens a row was indexed with (a JSON list; ``["public"]`` by default).

    ``filter(access__visible_to=principals)`` keeps the rows ``principals`` may read, in SQL on
    every database (``django_ragchat.access.access_sql``).
    """

    description = "Principal tokens that may read the row"

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("default", public_access)
        super().__init__(*args, **kwargs)


@AccessField.register_lookup
class VisibleTo(Lookup):
    """``access__visible_to=Principals``: the row shares a token with the principals."""

    lookup_name = "visible_to"
    prepare_rhs = False

    def get_prep_lookup(self):
        if not isinstance(self.rhs, Principals):
            raise TypeError(f"visible_to takes a django_ragchat.access.Principals, not {self.rhs!r}")
        return self.rhs

    def as_sql(self, compiler, connection):
        lhs, lhs_params = self.process_lhs(compiler, connection)
        sql, params = access_sql(connection.vendor, lhs, self.rhs)
        if not sql:
            return "1 = 1", []
        return sql, [*lhs_params, *params]
