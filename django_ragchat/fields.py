"""``EmbeddingField``: one model field for vectors on every database.

On PostgreSQL the column is pgvector's untyped ``vector`` (no dimension fixed in migrations: a
reusable app cannot know whether a site embeds with 384 or 3072 dimensions; HNSW indexes are
built per embedding space on an expression cast, see docs/postgresql.md). Elsewhere it is a
BLOB of little-endian float32, four bytes a dimension, searched in process with numpy.
Python values are 1-d ``numpy.float32`` arrays either way.
"""

from __future__ import annotations

import numpy as np
from django.db import models


def _pg_vector():
    # Imported lazily: pgvector-python is an optional dependency (the "postgres" extra).
    from pgvector import Vector

    return Vector


class EmbeddingField(models.Field):
    description = "An embedding vector (pgvector on PostgreSQL, float32 bytes elsewhere)"

    def db_type(self, connection):
        return "vector" if connection.vendor == "postgresql" else "blob"

    def get_db_prep_value(self, value, connection, prepared=False):
        if value is None:
            return None
        array = np.asarray(value, dtype=np.float32).ravel()
        if connection.vendor == "postgresql":
            return _pg_vector()._to_db(array)
        return array.astype("<f4").tobytes()

    def from_db_value(self, value, expression, connection):
        if value is None:
            return None
        if isinstance(value, np.ndarray):
            return value.astype(np.float32, copy=False)
        if isinstance(value, (bytes, bytearray, memoryview)):
            return np.frombuffer(bytes(value), dtype="<f4").astype(np.float32)
        if isinstance(value, str):  # pgvector text form, when no adapter is registered
            return np.asarray(_pg_vector()._from_db(value), dtype=np.float32)
        return np.asarray(value, dtype=np.float32)

    def to_python(self, value):
        if value is None or isinstance(value, np.ndarray):
            return value
        return np.asarray(value, dtype=np.float32)

    def value_to_string(self, obj):
        value = self.value_from_object(obj)
        return None if value is None else [float(x) for x in value]
