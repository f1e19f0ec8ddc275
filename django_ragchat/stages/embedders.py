"""Embedders: texts to vectors of one embedding space.

Built in: ``wordllama`` (the default when installed: ``pip install "django-ragchat[semantic]"``),
a static semantic model shipped inside the ``wordllama`` wheel and loaded with no network
(``django_ragchat.backends.static``): 256 dimensions, tens of microseconds a sentence, once per
process. ``hashing``, an offline embedder that needs no model, no download and no server (the
fallback for installs without the extra).
It hashes stemmed content words (weight 1) and their character trigrams (weight 0.25, so
"pricing" and "prices" share features) into ``dimension`` signed buckets and L2-normalises.
It is deterministic across processes and machines (CRC32, not Python's salted ``hash``).
``openai``: embeddings from any OpenAI-compatible server, through
``django_ragchat.backends.openai`` (docs/openai.md).
"""

from __future__ import annotations

import logging
import zlib
from functools import lru_cache
from typing import Any, ClassVar

import numpy as np
from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured

from django_ragchat import hookimpl
from django_ragchat.backends.openai import (
    CHAT_OPTIONS,
    CONNECTION_OPTIONS,
    DEFAULT_EMBEDDING_MODEL,
    EMBEDDING_MODEL_DIMENSIONS,
    EMBEDDING_OPTIONS,
    USER_MESSAGES,
    OpenAIConnection,
    check_options,
    model_errors,
)
from django_ragchat.backends.static import StaticModelUnavailable, wordllama_model
from django_ragchat.components import Component
from django_ragchat.exceptions import LLMError
from django_ragchat.tables import table_words
from django_ragchat.text import content_terms

logger = logging.getLogger(__name__)


class Embedder(Component):
    """Base class. ``embed`` returns a float32 array of shape (len(texts), dimension).

    ``space`` names the embedding space (model and dimension): chunks are only ever searched
    with query vectors of their own space. Override ``aembed`` for a natively async client.
    """

    kind = "embedder"
    dimension: int = 0
    #: Whether this embedder is a semantic model that runs in process at microseconds a text: the
    #: components that set ``uses_embedder`` (the extractive answerer, the ``followup``
    #: transformer) then compare sentences and questions with it; with any other embedder they
    #: read words only (a remote model would cost a request per turn and sentence).
    local_semantic: ClassVar[bool] = False

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


class WordLlamaEmbedder(Embedder):
    """WordLlama's static model (256 dimensions), from the installed ``wordllama`` package.

    No options. The model is loaded once per process, not per profile or instance, and never
    downloaded: without the package (``pip install "django-ragchat[semantic]"``) building the
    embedder raises ``ImproperlyConfigured``; the ``hashing`` embedder is the fallback.
    """

    name = "wordllama"
    local_semantic = True
    dimension = 256

    def __init__(self, profile, **options: Any):
        super().__init__(profile, **options)
        try:
            self.model = wordllama_model()
        except StaticModelUnavailable as exc:
            raise ImproperlyConfigured(
                f"{exc} Or set the profile {profile.name!r}'s \"embedder\" to \"hashing\" (then run "
                f"manage.py ragchat_reembed).") from exc
        self.dimension = self.model.dimension

    @property
    def space(self) -> str:
        return self.model.name

    def embed(self, texts: list[str]) -> np.ndarray:
        # A table is read as its columns and words: averaged, its numbers would drown its meaning.
        return self.model.embed([table_words(t) for t in texts])

    def token_ids(self, texts: list[str]) -> list[list[int]]:
        """Each text's token ids: what ``embed_ids`` reads (the answerer stores a chunk's words so)."""
        return self.model.token_ids([table_words(t) for t in texts])

    def embed_ids(self, ids_per_text: list[list[int]]) -> np.ndarray:
        """``embed`` of texts already tokenized (``token_ids``): the same vectors, bit for bit."""
        return self.model.embed_ids(ids_per_text)

    def word_norms(self, words: list[str]) -> list[float]:
        """Each word's vector length before normalising: how much it says (the answerer's light words)."""
        return self.model.word_norms(words)

    async def aembed(self, texts: list[str]) -> np.ndarray:
        # A query is embedded in tens of microseconds: a thread hop would cost more than it saves.
        if len(texts) <= 8:
            return self.embed(texts)
        return await super().aembed(texts)


class OpenAIEmbedder(Embedder):
    """Embeddings from an OpenAI-compatible server, in batches.

    Options (in ``options["openai"]``, shared with the ``openai`` LLM backend): the
    connection's, ``embedding_model`` (default ``text-embedding-3-small``),
    ``embedding_dimensions`` (the vector size; for a model not in ``EMBEDDING_MODEL_DIMENSIONS``
    it is learnt from the server's first reply when not set), ``send_dimensions`` (send
    ``dimensions`` to the server so it shortens the vectors; by default only for
    ``text-embedding-3-*`` models, the ones that can), ``batch_size`` (texts per request,
    default 256).

    The space is ``openai/<model>-<dimensions>``: changing either needs a re-embed. Reading
    ``space`` before any embedding call, with the size still unknown, asks the server once
    (one one-word embedding); what was learnt is kept per server and model for the process.
    """

    name = "openai"
    # (server, model) -> vector size learnt from a reply: components are rebuilt with the
    # settings, the server's model does not change size.
    learnt_dimensions: ClassVar[dict[tuple[str, str], int]] = {}

    def __init__(self, profile, **options: Any):
        check_options("The openai embedder", options, (*CONNECTION_OPTIONS, *CHAT_OPTIONS, *EMBEDDING_OPTIONS))
        super().__init__(profile)
        self.connection = OpenAIConnection.from_options(options)
        self.model = options.get("embedding_model") or DEFAULT_EMBEDDING_MODEL
        dimensions = options.get("embedding_dimensions")
        native = EMBEDDING_MODEL_DIMENSIONS.get(self.model)
        if dimensions is not None and (not isinstance(dimensions, int) or dimensions < 1):
            raise ImproperlyConfigured(
                f"openai option 'embedding_dimensions' must be a positive integer, not {dimensions!r}.")
        # None: learnt from the first reply (see _vectors).
        self.dimension: int | None = dimensions or native or self.learnt_dimensions.get(self._key)
        send = options.get("send_dimensions")
        if send is None:
            send = dimensions is not None and dimensions != native and self.model.startswith("text-embedding-3")
        self.send_dimensions = bool(send)
        self.batch_size = int(options.get("batch_size") or 256)

    @property
    def _key(self) -> tuple[str, str]:
        return (self.connection.describe(), self.model)

    @property
    def space(self) -> str:
        if self.dimension is None:
            self.embed(["dimensions"])  # learns the size from the reply
        return f"openai/{self.model}-{self.dimension}"

    def _request(self, texts: list[str]) -> dict[str, Any]:
        # The API rejects empty strings; a blank text embeds like a space.
        kwargs: dict[str, Any] = {"model": self.model, "input": [t if t.strip() else " " for t in texts]}
        if self.send_dimensions:
            kwargs["dimensions"] = self.dimension
        return kwargs

    def _vectors(self, response: Any, expected: int) -> np.ndarray:
        try:
            rows = sorted(response.data, key=lambda d: d.index)
            matrix = np.asarray([row.embedding for row in rows], dtype=np.float32)
        except (AttributeError, TypeError, ValueError) as exc:
            logger.warning("embeddings from %s have an unexpected shape: %r", self.connection.describe(), response)
            raise LLMError("bad_response", USER_MESSAGES["bad_response"]) from exc
        if self.dimension is None and matrix.ndim == 2 and matrix.shape[0] == expected and matrix.shape[1] > 0:
            self.dimension = self.learnt_dimensions[self._key] = int(matrix.shape[1])
            logger.info("embedding model %s at %s answers %d dimensions", self.model, self.connection.describe(),
                        self.dimension)
        if matrix.shape != (expected, self.dimension):
            logger.warning("embedding model %s returned shape %s, expected (%d, %d): set embedding_dimensions "
                           "to the model's size", self.model, matrix.shape, expected, self.dimension)
            raise LLMError("bad_response", USER_MESSAGES["bad_response"])
        return matrix

    def _stack(self, parts: list[np.ndarray]) -> np.ndarray:
        return np.vstack(parts) if parts else np.zeros((0, self.dimension or 0), dtype=np.float32)

    def embed(self, texts: list[str]) -> np.ndarray:
        parts = []
        client = self.connection.sync_client()
        for start in range(0, len(texts), self.batch_size):
            batch = texts[start:start + self.batch_size]
            with model_errors(f"embeddings ({self.model})"):
                response = client.embeddings.create(**self._request(batch))
            parts.append(self._vectors(response, len(batch)))
        return self._stack(parts)

    async def aembed(self, texts: list[str]) -> np.ndarray:
        parts = []
        client = await self.connection.async_client() if texts else None
        for start in range(0, len(texts), self.batch_size):
            batch = texts[start:start + self.batch_size]
            with model_errors(f"embeddings ({self.model})"):
                response = await client.embeddings.create(**self._request(batch))
            parts.append(self._vectors(response, len(batch)))
        return self._stack(parts)


@hookimpl
def register_embedders(register):
    register(WordLlamaEmbedder)
    register(HashingEmbedder)
    register(OpenAIEmbedder)
