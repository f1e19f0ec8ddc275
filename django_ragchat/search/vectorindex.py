"""Exact vector search in process, for databases without pgvector (SQLite, the default).

Embeddings are stored as float32 bytes in the ``Chunk.embedding`` column; the first search in a
space loads them, in batches, into one normalised numpy matrix held per process. Every search
first asks the database for the space's (row count, highest id), one cheap indexed query, and
reloads when that stamp changed, so ingestion in another process is seen at the next query.
The stamp is sound because Django creates SQLite primary keys with AUTOINCREMENT: a deleted
chunk's id is never reused, so replacing chunks always raises the highest id (only a rolled-back
transaction, as in tests, can hand an id out twice; the test suite clears the index per test).
Searching is a matrix-vector product and a partial sort: about a millisecond for 20,000
chunks of 384 dimensions.
"""

from __future__ import annotations

import threading

import numpy as np
from django.db.models import Count, Max

from django_ragchat.conf import ragchat_settings
from django_ragchat.models import Chunk


class _SpaceMatrix:
    __slots__ = ("stamp", "ids", "matrix")

    def __init__(self, stamp, ids: np.ndarray, matrix: np.ndarray):
        self.stamp = stamp
        self.ids = ids
        self.matrix = matrix


class InProcessVectorIndex:
    """Per-process cache of each embedding space's matrix, with exact cosine search."""

    def __init__(self) -> None:
        self._spaces: dict[tuple[str, str], _SpaceMatrix] = {}
        self._lock = threading.Lock()

    def _stamp(self, space: str, using: str):
        row = Chunk.objects.using(using).filter(space=space).aggregate(n=Count("id"), top=Max("id"))
        return (row["n"], row["top"])

    def _load(self, space: str, using: str, stamp) -> _SpaceMatrix:
        batch = ragchat_settings.SQLITE_VECTOR_BATCH_SIZE
        ids: list[int] = []
        rows: list[np.ndarray] = []
        qs = (
            Chunk.objects.using(using).filter(space=space, embedding__isnull=False)
            .order_by("id").values_list("id", "embedding")
        )
        for chunk_id, vector in qs.iterator(chunk_size=batch):
            ids.append(chunk_id)
            rows.append(vector)
        if rows:
            matrix = np.vstack(rows).astype(np.float32, copy=False)
            norms = np.linalg.norm(matrix, axis=1, keepdims=True)
            norms[norms == 0] = 1.0
            matrix /= norms
        else:
            matrix = np.zeros((0, 0), dtype=np.float32)
        return _SpaceMatrix(stamp, np.asarray(ids, dtype=np.int64), matrix)

    def matrix_for(self, space: str, using: str = "default") -> _SpaceMatrix:
        stamp = self._stamp(space, using)
        key = (using, space)
        entry = self._spaces.get(key)
        if entry is None or entry.stamp != stamp:
            with self._lock:
                entry = self._spaces.get(key)
                if entry is None or entry.stamp != stamp:
                    entry = self._load(space, using, stamp)
                    self._spaces[key] = entry
        return entry

    def search(self, space: str, vector: np.ndarray, k: int, *, using: str = "default",
               allowed_ids: np.ndarray | None = None) -> list[tuple[int, float]]:
        """The ``k`` nearest chunk ids to ``vector`` by cosine similarity, best first.

        ``allowed_ids`` restricts the search to those chunk ids (metadata filters are resolved
        to ids by a database query first).
        """
        entry = self.matrix_for(space, using)
        if entry.ids.size == 0 or k <= 0:
            return []
        query = np.asarray(vector, dtype=np.float32).ravel()
        if query.shape[0] != entry.matrix.shape[1]:
            raise ValueError(
                f"Query vector has {query.shape[0]} dimensions but space {space!r} stores "
                f"{entry.matrix.shape[1]}."
            )
        norm = float(np.linalg.norm(query))
        if norm == 0:
            return []
        scores = entry.matrix @ (query / norm)
        if allowed_ids is not None:
            mask = np.isin(entry.ids, allowed_ids)
            scores = np.where(mask, scores, -np.inf)
        k = min(k, scores.shape[0])
        top = np.argpartition(-scores, k - 1)[:k]
        top = top[np.argsort(-scores[top], kind="stable")]
        return [(int(entry.ids[i]), float(scores[i])) for i in top if np.isfinite(scores[i])]

    def clear(self) -> None:
        with self._lock:
            self._spaces.clear()


vector_index = InProcessVectorIndex()
