"""Embedders: texts to vectors of one embedding space.

Built in: ``hashing``, an offline embedder that needs no model, no download and no server.
It hashes stemmed content words (weight 1) and their character trigrams (weight 0.25, so
"pricing" and "prices" share features) into ``dimension`` signed buckets and L2-normalises.
It is deterministic across processes and machines (CRC32, not Python's salted ``hash``).
"""

from __future__ import annotations

import zlib
from functools import lru_cache
from typing import Any

import numpy as np
from asgiref.sync import sync_to_async

from django_ragchat import hookimpl
from django_ragchat.components import Component
from django_ragchat.text import content_terms


class Embedder(Component):
    """Base class. ``embed`` returns a float32 array of shape (len(texts), dimension).

    ``space`` names the embedding space (model and dimension): chunks are only ever searched
    with query vectors of their own space. Override ``aembed`` for a natively async client.
    """

    kind = "embedder"
    dimension: int = 0

    @property
    def space(self) -> str:
        raise NotImplementedError

    def embed(self, texts: list[str]) -> np.ndarray:
        raise NotImplementedError

    async def aembed(self, texts: list[str]) -> np.ndarray:
        # numpy releases the GIL in the heavy parts; keep the event loop free.
        return await sync_to_async(self.embed, thread_sensitive=False)(texts)


def _bucket(feature: str, dimension: int) -> tuple[int, float]:
    h = zlib.crc32(feature.encode("utf-8"))
    return h % dimension, (1.0 if (h >> 31) & 1 else -1.0)


@lru_cache(maxsize=200_000)
def _word_features(word: str, dimension: int) -> tuple[np.ndarray, np.ndarray]:
    """Bucket indices and signed weights for one stemmed word (cached: vocabularies are small)."""
    padded = f"<{word}>"
    features = [("w:" + word, 1.0)] + [
        ("c:" + padded[i : i + 3], 0.25) for i in range(len(padded) - 2)
    ]
    idx = np.empty(len(features), dtype=np.int64)
    weights = np.empty(len(features), dtype=np.float32)
    for n, (feature, weight) in enumerate(features):
        idx[n], sign = _bucket(feature, dimension)
        weights[n] = sign * weight
    return idx, weights


class HashingEmbedder(Embedder):
    """Offline feature-hashing embedder. Option: ``dimension`` (default 384)."""

    name = "hashing"
    VERSION = 1

    def __init__(self, profile, *, dimension: int = 384, **options: Any):
        super().__init__(profile, **options)
        if dimension < 16:
            raise ValueError("hashing embedder dimension must be at least 16")
        self.dimension = dimension

    @property
    def space(self) -> str:
        return f"hashing-v{self.VERSION}-{self.dimension}"

    def embed_one(self, text: str) -> np.ndarray:
        parts = [_word_features(w, self.dimension) for w in content_terms(text)]
        vector = np.zeros(self.dimension, dtype=np.float32)
        if parts:
            idx = np.concatenate([p[0] for p in parts])
            weights = np.concatenate([p[1] for p in parts])
            vector = np.bincount(idx, weights=weights, minlength=self.dimension).astype(np.float32)
            norm = float(np.linalg.norm(vector))
            if norm > 0:
                vector /= norm
        return vector

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return np.vstack([self.embed_one(t) for t in texts])


@hookimpl
def register_embedders(register):
    register(HashingEmbedder)
