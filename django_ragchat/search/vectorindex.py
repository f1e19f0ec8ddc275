"""Exact vector search in process, for databases without pgvector (SQLite, the default).

Embeddings are stored as float32 bytes in the ``Chunk.embedding`` column; the first search in a
space loads them, in batches, into one normalised numpy matrix held per process. Every search
first asks the database for the space's stamp (``search.freshness``: its row count and highest
id, one cheap indexed query, read once per turn) and reloads when it changed, so ingestion in
another process is seen at the next query (the next turn, within a turn). The stamp also holds
the newest ``Document.updated_at`` (an indexed maximum): a change of access rewrites no chunk
id but always touches its document.

Access: the matrix keeps each chunk's access as a small class number (one per distinct access
list), so a search masks out what its reader may not read with no query of its own; the fetch
of the winners (``search.fetch_chunks``) checks the access again in SQL.
The stamp is sound because Django creates SQLite primary keys with AUTOINCREMENT: a deleted
chunk's id is never reused, so replacing chunks always raises the highest id (only a rolled-back
transaction, as in tests, can hand an id out twice; the test suite clears the index per test).
Searching is a matrix-vector product and a partial sort: about a millisecond for 20,000
chunks of 384 dimensions.
"""

from __future__ import annotations

import threading

import numpy as np

from django_ragchat.access import UNRESTRICTED, Principals
from django_ragchat.conf import ragchat_settings
from django_ragchat.models import Chunk
from django_ragchat.search.freshness import corpus_stamp


class _SpaceMatrix:
    __slots__ = ("stamp", "ids", "matrix", "classes", "access")

    def __init__(self, stamp, ids: np.ndarray, matrix: np.ndarray, classes: np.ndarray | None = None,
                 access: list[frozenset[str]] | None = None):
        self.stamp = stamp
        self.ids = ids
        self.matrix = matrix
        # classes[i]: the index in ``access`` of row i's access list.
        self.classes = classes if classes is not None else np.zeros(len(ids), dtype=np.int32)
        self.access = access or []

    def readable(self, principals: Principals) -> np.ndarray | None:
        """A mask of the rows ``principals`` may read, or ``None`` when they may read every row."""
        allowed = [i for i, tokens in enumerate(self.access) if principals.may_read(tokens)]
        if len(allowed) == len(self.access):
            return None
        return np.isin(self.classes, np.asarray(allowed, dtype=np.int32))


class InProcessVectorIndex:
    """Per-process cache of each embedding space's matrix, with exact cosine search."""

    def __init__(self) -> None:
        self._spaces: dict[tuple[str, str], _SpaceMatrix] = {}
        self._lock = threading.Lock()

    def _load(self, space: str, using: str, stamp) -> _SpaceMatrix:
        batch = ragchat_settings.SQLITE_VECTOR_BATCH_SIZE
        ids: list[int] = []
        rows: list[np.ndarray] = []
        classes: list[int] = []
        class_of: dict[tuple[str, ...], int] = {}
        qs = (
            Chunk.objects.using(using).filter(space=space, embedding__isnull=False)
            .order_by("id").values_list("id", "embedding", "access")
        )
        for chunk_id, vector, access in qs.iterator(chunk_size=batch):
            ids.append(chunk_id)
            rows.append(vector)
            classes.append(class_of.setdefault(tuple(sorted(access or ())), len(class_of)))
        if rows:
            matrix = np.vstack(rows).astype(np.float32, copy=False)
            norms = np.linalg.norm(matrix, axis=1, keepdims=True)
            norms[norms == 0] = 1.0
            matrix /= norms
        else:
            matrix = np.zeros((0, 0), dtype=np.float32)
        access = [frozenset(key) for key in class_of]  # in class number order (dicts keep insertion order)
        return _SpaceMatrix(stamp, np.asarray(ids, dtype=np.int64), matrix, np.asarray(classes, dtype=np.int32),
                            access)

    def matrix_for(self, space: str, using: str = "default") -> _SpaceMatrix:
        stamp = corpus_stamp(space, using)
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
               allowed_ids: np.ndarray | None = None,
               principals: Principals = UNRESTRICTED) -> list[tuple[int, float]]:
        """The ``k`` nearest chunk ids to ``vector`` by cosine similarity, best first.

        ``allowed_ids`` restricts the search to those chunk ids (metadata filters are resolved
        to ids by a database query first); ``principals``, to the chunks they may read.
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
        mask = entry.readable(principals)
        if allowed_ids is not None:
            allowed = np.isin(entry.ids, allowed_ids)
            mask = allowed if mask is None else mask & allowed
        if mask is not None:
            scores = np.where(mask, scores, -np.inf)
        k = min(k, scores.shape[0])
        top = np.argpartition(-scores, k - 1)[:k]
        top = top[np.argsort(-scores[top], kind="stable")]
        return [(int(entry.ids[i]), float(scores[i])) for i in top if np.isfinite(scores[i])]

    def clear(self) -> None:
        with self._lock:
            self._spaces.clear()


vector_index = InProcessVectorIndex()
