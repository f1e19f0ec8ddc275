"""Chunks read once, at ingestion: what the answerer reads of a passage, stored with its chunk.

Most of a turn's cost over passages it has not seen was reading them (sentences, name runs,
stems) and embedding their sentences, and all of that depends only on the chunk's text, the
language data and the model. So the answerer reads a chunk when it is stored
(``analyse_chunks``: ingestion and ``ragchat_reembed`` call it for a profile whose answerer reads
passages, ``ExtractiveAnswerer.analyse_chunks``); the bytes go into ``Chunk.analysis`` and come
back with the chunk, in the search's own query, as ``RetrievedChunk.analysis``. A turn then
decodes them (``read_stored``) instead of reading the text, embeds the passages' candidate words
(the neighbours' matrix, about 50 words) from their stored token ids, and tokenizes only its
question.

A stored reading is used only when it was made by this code with this language: its key is a
hash of the reading code's version (``READING_VERSION``) and of the language data
(``reading_key``); its vectors only
when they are of the answerer's embedding space. Anything else (a site that edited its language
files, upgraded, or changed model) is read from the text in the turn, as before, until
``ragchat_reembed --analysis`` stores it again.

Format: ``MAGIC``, the key's length (2 bytes) and the key (``<reading key>|<space>``), the JSON
header's length (4 bytes) and the header, then one float32 row per entry of the header's
``texts`` (little endian). No pickle: a row's bytes are data, never code.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Any

import numpy as np

from django_ragchat.answerer.passages import Sentence, analyse_text, candidate_words
from django_ragchat.answerer.vocabulary import Vocabulary

MAGIC = b"RCA1"
#: The version of what a reading holds, raised with every change to the code that makes one
#: (``passages.analyse_text``, ``candidate_words``, ``_header``...): the stored readings of an
#: older version are stale (read from the text in the turn until ``ragchat_reembed --analysis``).
#: An edit elsewhere keeps them. ``tests/test_stored_reading.py`` reads a fixed corpus with
#: fixed language data and fails, naming this constant, when the readings change without it.
READING_VERSION = 11


@dataclass(frozen=True)
class StoredReading:
    """One chunk's stored reading: ``analysis`` as ``passages.analyse_text`` returns it, the
    candidate words of its sentences and of its heading's leaf (for the model's word
    neighbours), and sentence -> vector ({} when the vectors are of another space or there are
    none)."""

    analysis: tuple[str, tuple[Sentence, ...], str, bool, str]
    words: tuple[tuple[str, str], ...]
    leaf_words: tuple[tuple[str, str], ...]
    vectors: dict[str, np.ndarray]
    tokens: dict[str, list[int]]  # word -> its token ids ({} as ``vectors``)


def _canonical(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, dict) or hasattr(value, "items"):
        return {str(k): _canonical(v) for k, v in sorted(value.items())}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)


@lru_cache(maxsize=64)
def reading_key(vocabulary: Vocabulary) -> str:
    """A hash of what a reading depends on: the reading code (``READING_VERSION``) and
    ``vocabulary``'s language data (words, patterns, messages...; not its folder's path)."""
    digest = hashlib.sha256(MAGIC)
    digest.update(str(READING_VERSION).encode())
    language = vocabulary.language
    data = {f.name: _canonical(getattr(language, f.name)) for f in fields(language)
            if f.name not in ("directory", "patterns")}  # ``sources`` holds the patterns' text
    digest.update(json.dumps(data, sort_keys=True, ensure_ascii=False).encode())
    return digest.hexdigest()[:24]


def analysis_key(vocabulary: Vocabulary, embedder: Any = None) -> str:
    """The key of a reading made with ``vocabulary`` and the vectors of ``embedder`` (None: none)."""
    return f"{reading_key(vocabulary)}|{embedder.space if embedder is not None else ''}"


def stored_key(blob: bytes | memoryview | None) -> str:
    """The key ``blob`` was made with ("" for none)."""
    if not blob or bytes(blob[:4]) != MAGIC:
        return ""
    return bytes(blob[6:6 + int.from_bytes(bytes(blob[4:6]), "little")]).decode()


def _sentence_row(s: Sentence, sets: dict[frozenset[str], int]) -> list:
    """A sentence as a JSON row; its word positions' stem sets as indexes into the chunk's
    ``sets`` (a word's stems repeat: decoded once a chunk)."""
    flags = s.has_currency | s.has_number << 1 | s.has_money << 2 | s.item << 3 | s.row << 4
    sequence = [sets.setdefault(found, len(sets)) for found in s.sequence]
    return [s.text, s.position, flags, list(s.names), sorted(s.stems), sequence, sorted(s.loose)]


def _checksum(text: str, heading: str, title: str) -> int:
    """What a reading was made from: a chunk whose text, heading or title was changed after it
    (a document postprocessor, an edited title) is read from its text."""
    return zlib.crc32(f"{text}\0{heading or ''}\0{title or ''}".encode())


def _header(text: str, heading: str, title: str, vocabulary: Vocabulary, light: frozenset[str]) -> dict:
    leaf, found, subject, mentions_the, kind = analyse_text(text, heading or "", title or "", vocabulary)
    words: dict[str, str] = {}
    for s in found:
        for st, w in candidate_words(s.text, light):
            words.setdefault(st, w)
    sets: dict[frozenset[str], int] = {}
    rows = [_sentence_row(s, sets) for s in found]
    return {"of": _checksum(text, heading, title), "leaf": leaf, "subject": subject, "the": mentions_the,
            "kind": kind, "sentences": rows,
            "sets": [sorted(found) for found in sets], "words": list(words.items()),
            "leaf_words": candidate_words(leaf, light)}


def analyse_chunks(chunks: Iterable[tuple[str, str, str]], vocabulary: Vocabulary, embedder: Any = None) -> list[bytes]:
    """Each chunk's (text, heading, document title) read as the answerer reads it, with the
    vectors of its sentences and the token ids of its candidate words by ``embedder`` (a
    semantic model running in process; None: neither), as ``Chunk.analysis`` stores it."""
    light = vocabulary.stopwords | vocabulary.generic
    headers = [_header(text, heading, title, vocabulary, light) for text, heading, title in chunks]
    tokenize = getattr(embedder, "token_ids", None)
    for header in headers:
        # The sentences' vectors; the words' token ids, not their vectors: a vector is 1 KB and
        # would make a row four times as large, ids are a few bytes and spare the turn the
        # tokenizer (a model with ``token_ids`` and ``embed_ids``; else the turn embeds them).
        header["texts"] = list(dict.fromkeys(row[0] for row in header["sentences"])) if embedder else []
        pieces = list(dict.fromkeys(w for _, w in header["words"] + header["leaf_words"]))
        header["tokens"] = dict(zip(pieces, tokenize(pieces), strict=True)) if tokenize and pieces else {}
    every = list(dict.fromkeys(t for header in headers for t in header["texts"]))
    found = dict(zip(every, np.asarray(embedder.embed(every), dtype="<f4"), strict=True)) if every else {}
    key = analysis_key(vocabulary, embedder).encode()
    encoded = []
    for header in headers:
        head = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode()
        rows = b"".join(found[t].tobytes() for t in header["texts"])
        encoded.append(b"".join((MAGIC, len(key).to_bytes(2, "little"), key, len(head).to_bytes(4, "little"),
                                 head, rows)))
    return encoded


def decode(blob: bytes | memoryview | None, key: str, space: str = "",
           source: tuple[str, str, str] | None = None) -> StoredReading | None:
    """The reading ``blob`` holds when it was made with ``key`` (``reading_key``) and, when
    given, from ``source`` (text, heading, title), else None (also for bytes that cannot be
    read: a turn never fails on its passages' readings); its vectors when they are of ``space``."""
    if not blob or bytes(blob[:4]) != MAGIC:
        return None
    try:
        return _decoded(bytes(blob), key, space, source)
    except (ValueError, KeyError, TypeError, IndexError):  # cut or damaged bytes (JSON, lengths)
        return None


def _decoded(blob: bytes, key: str, space: str, source: tuple[str, str, str] | None) -> StoredReading | None:
    length = int.from_bytes(blob[4:6], "little")
    made_with, _, stored_space = blob[6:6 + length].decode().partition("|")
    if made_with != key:
        return None
    start = 6 + length + 4
    end = start + int.from_bytes(blob[start - 4:start], "little")
    head = json.loads(blob[start:end])
    if source is not None and head["of"] != _checksum(*source):
        return None
    sets = [frozenset(found) for found in head["sets"]]
    sentences = tuple(
        Sentence(text=text, position=position, stems=frozenset(st), has_currency=bool(flags & 1),
                 has_number=bool(flags & 2), names=tuple(names), sequence=tuple(map(sets.__getitem__, sequence)),
                 has_money=bool(flags & 4), loose=frozenset(loose), item=bool(flags & 8),
                 row=bool(flags & 16))
        for text, position, flags, names, st, sequence, loose in head["sentences"])
    vectors: dict[str, np.ndarray] = {}
    texts = head["texts"]
    ours = bool(space) and stored_space == space
    if ours and texts:
        matrix = np.frombuffer(blob, dtype="<f4", offset=end).reshape(len(texts), -1)
        vectors = dict(zip(texts, matrix, strict=True))
    return StoredReading((head["leaf"], sentences, head["subject"], head["the"], head["kind"]),
                         tuple(map(tuple, head["words"])), tuple(map(tuple, head["leaf_words"])), vectors,
                         head["tokens"] if ours else {})


def read_stored(documents: Sequence[Any], vocabulary: Vocabulary, space: str = "") -> list[StoredReading | None]:
    """Each retrieved chunk's stored reading (``RetrievedChunk.analysis``) usable with
    ``vocabulary`` (and vectors of ``space``), else None (read from its text)."""
    if not any(getattr(d, "analysis", None) for d in documents):
        return [None] * len(documents)
    key = reading_key(vocabulary)
    return [decode(d.analysis, key, space, (d.text, d.heading, d.title)) if getattr(d, "analysis", None) else None
            for d in documents]
