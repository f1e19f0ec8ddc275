"""Meaning, for the answerer: how close a sentence is to what was asked, by the profile's own
embedding model when it is a semantic one that runs in process (``Embedder.local_semantic``:
the ``wordllama`` embedder). The answerer does not import a model: the ``extractive`` component
is handed the profile's embedder and gives its ``embed`` to ``SentenceSimilarity``.

Sentence vectors are cached per process (a passage's sentences come back turn after turn), so a
turn embeds its question and the sentences it has not seen before: about 30 µs each. A passage
read at ingestion (``answerer.stored``) brings its sentences' vectors and its words' token ids
from its row (``StoredVectors``): then a turn tokenizes only its question's texts.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from django_ragchat.answerer.passages import clear_passage_cache
from django_ragchat.answerer.vocabulary import Vocabulary

Encode = Callable[[list[str]], np.ndarray]

#: Sentence vectors kept per process (256 floats each: 4,096 of them are 4 MB).
CACHE_SIZE = 8192

_caches: list[dict] = []


def clear_caches() -> None:
    """Forget every cached passage analysis and sentence vector (benchmarks' "cold" runs)."""
    clear_passage_cache()
    for cache in _caches:
        cache.clear()


class _Similarity:
    """Scores from ``vectors`` (L2-normalised): what ``SentenceSimilarity`` and ``StoredVectors`` share."""

    def vectors(self, texts: Sequence[str]) -> np.ndarray:
        raise NotImplementedError

    def is_word(self, word: str) -> bool:
        """Whether the model holds ``word`` as a word of its own (``SentenceSimilarity.is_word``)."""
        return False

    def scores(self, query: str, texts: Sequence[str]) -> list[float]:
        """The similarity of each of ``texts`` to ``query`` (-1 to 1)."""
        return self.scores_per_query([query], texts)[0]

    def scores_per_query(self, queries: Sequence[str], texts: Sequence[str]) -> list[list[float]]:
        """For each of ``queries``, the similarity of each of ``texts`` to it (-1 to 1); the
        queries and the texts are embedded in one batch."""
        if not texts:
            return [[] for _ in queries]
        found = self.vectors([*queries, *texts])
        rows = found[len(queries):]
        return [[float(s) for s in rows @ vector] for vector in found[:len(queries)]]


class SentenceSimilarity(_Similarity):
    """Cosine similarities between a query and sentences, by ``encode`` (L2-normalised vectors)."""

    def __init__(self, encode: Encode, cache_size: int = CACHE_SIZE,
                 encode_ids: Callable[[list[list[int]]], np.ndarray] | None = None,
                 word_norms: Callable[[list[str]], list[float]] | None = None,
                 token_ids: Callable[[list[str]], list[list[int]]] | None = None):
        self.encode = encode
        # The model's tokenizer when it has one: a word it holds as one piece is a word of its own
        # (``is_word``), not a typo of a passage's word.
        self.token_ids = token_ids
        self._whole: dict[str, bool] = {}
        _caches.append(self._whole)
        # The model's ``word_norms`` when it has one: how much each word says (its vector's length
        # before normalising), which weighs the answerer's light words (``norms``).
        self.word_norms = word_norms
        self._norms: dict[str, float] = {}
        _caches.append(self._norms)
        # The model's ``embed_ids`` when it has one: texts already tokenized (a stored chunk's
        # words) are embedded without the tokenizer, to the same vectors.
        self.encode_ids = encode_ids
        self.cache_size = cache_size
        self._vectors: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        _caches.append(self._vectors)

    def norms(self, words: Sequence[str]) -> dict[str, float]:
        """Each of ``words``' vector length before normalising ({} without ``word_norms``); kept
        per process (a question's words come back)."""
        if self.word_norms is None:
            return {}
        with self._lock:
            found = {w: self._norms[w] for w in words if w in self._norms}
            missing = [w for w in dict.fromkeys(words) if w not in found]
            if missing:
                computed = dict(zip(missing, self.word_norms(missing), strict=True))
                if len(self._norms) > self.cache_size:
                    self._norms.clear()  # after ``found`` was read from it
                self._norms.update(computed)
                found.update(computed)
            return found

    def is_word(self, word: str) -> bool:
        """Whether the model's tokenizer holds ``word`` (folded) as one piece: its vocabulary of
        common words ("bring", "someone", "week"), which a misspelling ("warrenty", "weigth",
        "baterry") never is. False without a tokenizer."""
        if self.token_ids is None:
            return False
        found = self._whole.get(word)
        if found is None:
            found = len(self.token_ids([word])[0]) == 1
            if len(self._whole) > self.cache_size:
                self._whole.clear()
            self._whole[word] = found
        return found

    def vectors(self, texts: Sequence[str]) -> np.ndarray:
        cache = self._vectors
        found: dict[str, np.ndarray] = {}
        missing = []
        with self._lock:
            for text in dict.fromkeys(texts):
                if text in cache:
                    cache.move_to_end(text)
                    found[text] = cache[text]
                else:
                    missing.append(text)
            if missing:
                for text, vector in zip(missing, self.encode(missing), strict=True):
                    cache[text] = found[text] = vector
                # Oldest first: what this call asked for is in ``found``, even if its new texts
                # pushed its older ones out.
                while len(cache) > self.cache_size:
                    cache.popitem(last=False)
        return np.vstack([found[t] for t in texts]) if texts else np.zeros((0, 0), dtype=np.float32)


class StoredVectors(_Similarity):
    """``similarity`` for one turn, with what its passages brought from their rows, made at
    ingestion with the same model: ``stored`` (text -> vector: their sentences) and ``tokens``
    (text -> token ids: their words, embedded with ``similarity.encode_ids``, no tokenizer).
    A text's vector does not depend on the batch it was embedded in, so the scores are the same."""

    def __init__(self, similarity: SentenceSimilarity, stored: Mapping[str, np.ndarray],
                 tokens: Mapping[str, list[int]] | None = None):
        self.similarity = similarity
        self.stored = dict(stored)
        self.tokens = tokens if tokens and similarity.encode_ids is not None else {}

    def is_word(self, word: str) -> bool:
        return self.similarity.is_word(word)

    def vectors(self, texts: Sequence[str]) -> np.ndarray:
        stored = self.stored
        missing = [t for t in dict.fromkeys(texts) if t not in stored]
        if not missing:
            return np.vstack([stored[t] for t in texts]) if texts else np.zeros((0, 0), dtype=np.float32)
        tokenized = [t for t in missing if t in self.tokens]
        if tokenized:  # kept for the turn: a word's vector is asked again with each asked word
            stored.update(zip(tokenized, self.similarity.encode_ids([self.tokens[t] for t in tokenized]), strict=True))
            missing = [t for t in missing if t not in stored]
        computed = dict(zip(missing, self.similarity.vectors(missing), strict=True)) if missing else {}
        return np.vstack([stored[t] if t in stored else computed[t] for t in texts])


class NearWords(Vocabulary):
    """The profile's vocabulary for one turn, with the model's word neighbours added: an asked
    word that neither a sentence nor the synonym table states is stated, with ``evidence``, by a
    word of the turn's passages whose vector is at least ``threshold`` close to it ("heavy" is
    stated by "weighs", "guarantee" by "warranty"). Everything else is the vocabulary's (its
    compiled tables are shared, not copied)."""

    def __init__(self, vocabulary: Vocabulary, similarity: _Similarity, passage_words: dict[str, str],
                 surface: dict[str, str], *, threshold: float, evidence: float):
        self.__dict__.update(vocabulary.__dict__)
        self._similarity = similarity
        self._passage_words = passage_words
        self._stems = list(passage_words)
        self._matrix: np.ndarray | None = None  # built when a word the table lacks is first asked
        self._surface = surface
        self._threshold = threshold
        self._evidence = evidence
        self._near: dict[str, frozenset[str]] = {}
        # A turn asks the same (key, sentence) many times (weights, exclusions, coverage, word
        # places): each answer is kept for the turn, as the words' neighbours are.
        self._covered: dict[tuple[str, frozenset[str]], float] = {}

    def is_word(self, word: str) -> bool:
        return self._similarity.is_word(word)

    def near(self, word: str) -> frozenset[str]:
        """The passages' stems whose words the model finds close to ``word`` (a stem)."""
        found = self._near.get(word)
        if found is None:
            found = frozenset()
            surface = self._surface.get(word)
            if surface and self._matrix is None and self._passage_words:
                # The question's words in the same batch: one call to the model for the turn's words.
                found = self._similarity.vectors([*self._passage_words.values(), *self._surface.values()])
                self._matrix = found[:len(self._passage_words)]
            if surface and self._matrix is not None:
                sims = self._matrix @ self._similarity.vectors([surface])[0]
                found = frozenset(s for s in map(self._stems.__getitem__, np.flatnonzero(sims >= self._threshold))
                                  if s != word)
                if self.is_day(word):  # "Sunday" is close to "Monday" and never states it
                    found = frozenset(s for s in found if not self.is_time(s))
                # "wired" is close to "wireless" (0.52) and says the opposite
                found = frozenset(s for s in found if not self.negates(word, s))
            self._near[word] = found
        return found

    def covers(self, key: str, text_stems: frozenset[str]) -> float:
        found = self._covered.get((key, text_stems))
        if found is None:
            found = super().covers(key, text_stems)
            if not found and not key.startswith("~"):
                word = key.partition("=")[0]
                found = self._evidence if word and not self.near(word).isdisjoint(text_stems) else 0.0
            self._covered[key, text_stems] = found
        return found
