"""Static embedding models that ship inside an installed Python package, loaded with no network.

A static model is a table of token vectors and a tokenizer: a text's vector is the mean of its
tokens' rows, L2-normalised (no network, no GPU, about 30 µs a sentence). The one the default
profile uses is WordLlama's (``pip install "django-ragchat[semantic]"``, the ``wordllama``
package, MIT): its wheel carries ``weights/l2_supercat_256.safetensors`` (32,000 tokens x 256,
float16) and ``tokenizers/l2_supercat_tokenizer_config.json``.

WordLlama's own loader looks for the tokenizer under ``tokenizer/`` while the wheel ships
``tokenizers/``, and downloads from a model hub whatever it does not find (and its inference
module configures the root logger on import). So none of its code runs here: both files are
opened by path inside the installed package (found with ``importlib.util.find_spec``, which
does not import it), the weights read with ``numpy.memmap`` (the pages are shared by every
worker process of a machine) and the tokenizer with ``tokenizers.Tokenizer.from_file``. Nothing
here can download: a missing file is ``StaticModelUnavailable``.

The model is loaded once per process (``wordllama_model()``), whatever the number of profiles
and components that use it.
"""

from __future__ import annotations

import importlib.util
import json
import struct
import threading
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

#: safetensors dtype names -> numpy dtypes (those static models use).
_DTYPES = {"F16": np.float16, "F32": np.float32, "I8": np.int8, "I64": np.int64, "BF16": None}

WORDLLAMA_WEIGHTS = ("weights", "l2_supercat_256.safetensors")
WORDLLAMA_TOKENIZER = ("tokenizers", "l2_supercat_tokenizer_config.json")
#: Texts longer than this many tokens are cut (a chunk's vector is its first 512 tokens' mean).
MAX_TOKENS = 512
#: Batches of at most this many texts are tokenized one text after another in the calling thread:
#: the tokenizer's batch call hands the texts to its thread pool, and on a busy machine waiting
#: for those threads costs more than the tokenizing (a question, a turn's words or sentences).
SERIAL_TEXTS = 64
#: Texts of at most this many tokens (words) are summed together, longer ones one by one.
SHORT_TEXT_TOKENS = 4
#: Every float16 bit pattern's float32 value (index: the pattern as an unsigned 16-bit number).
_HALF_TO_FLOAT = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


class StaticModelUnavailable(Exception):
    """The package holding a static model is not installed, or lacks its files."""


def package_file(package: str, *parts: str) -> Path:
    """The path of ``parts`` inside the installed ``package``, without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise StaticModelUnavailable(
            f"The package {package!r} is not installed: pip install \"django-ragchat[semantic]\".")
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*parts)
    if not path.is_file():
        raise StaticModelUnavailable(f"{path} is missing from the installed {package!r} package; reinstall it.")
    return path


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """The tensors of a safetensors file, memory-mapped read-only (the format is an 8-byte
    little-endian header length, a JSON header of dtype, shape and byte offsets, then the data)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        try:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length)) if 8 + length <= size else None
        except (struct.error, ValueError):
            header = None
    if not isinstance(header, dict):
        raise StaticModelUnavailable(f"{path} is not a safetensors file (its header cannot be read)")
    tensors = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(meta["dtype"])
        if dtype is None:
            raise StaticModelUnavailable(f"{path}: tensor {name!r} has dtype {meta['dtype']}, not supported")
        start, end = meta["data_offsets"]
        count = int(np.prod(meta["shape"])) if meta["shape"] else 1
        if (end - start) != count * np.dtype(dtype).itemsize or 8 + length + end > size:
            raise StaticModelUnavailable(f"{path}: tensor {name!r} has {end - start} bytes for shape {meta['shape']}")
        tensors[name] = np.memmap(path, dtype=dtype, mode="r", offset=8 + length + start,
                                  shape=tuple(meta["shape"]))
    return tensors


class StaticModel:
    """Token vectors and a tokenizer: ``embed(texts)`` is each text's mean token vector,
    L2-normalised (float32, shape (len(texts), dimension)).

    ``table`` is (vocabulary, dimension); ``mapping`` (optional) maps a token id to its row
    (quantised vocabularies) and ``token_weights`` (optional) weighs each token id.
    """

    def __init__(self, tokenizer, table: np.ndarray, *, name: str, mapping: np.ndarray | None = None,
                 token_weights: np.ndarray | None = None):
        self.tokenizer = tokenizer
        # Plain ndarray views of the mapped file (no copy): numpy.memmap's subclass hooks make a
        # gather of rows some 30 times slower.
        self.table = np.asarray(table)
        self.name = name
        self.mapping = None if mapping is None else np.asarray(mapping)
        self.token_weights = None if token_weights is None else np.asarray(token_weights)
        self.dimension = int(table.shape[1])
        self.rows = int(table.shape[0] if mapping is None else mapping.shape[0])
        self._lock = threading.Lock()  # a Tokenizer is not documented as safe to share across threads
        # Half floats are read through a table of every one of their 65,536 bit patterns (256 KB):
        # the same float32 values as ``astype``, whose element-wise conversion is some 10 times slower.
        self._halves = _HALF_TO_FLOAT if self.table.dtype == np.float16 else None
        # The tokenizer's batch call without character offsets (tokenizers >= 0.21): the same ids.
        self._encode_batch = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)

    @classmethod
    def from_files(cls, tokenizer_file: Path, weights_file: Path, *, name: str, tensor: str = "embedding.weight",
                   mapping: str | None = None, token_weights: str | None = None) -> StaticModel:
        """Load a model from its tokenizer (a ``tokenizers`` JSON file) and its safetensors file."""
        from tokenizers import Tokenizer  # noqa: PLC0415 - an optional dependency (the semantic extra)

        tensors = read_safetensors(weights_file)
        if tensor not in tensors:
            raise StaticModelUnavailable(f"{weights_file} has no tensor {tensor!r} (it has {sorted(tensors)})")
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
        tokenizer.no_padding()
        tokenizer.no_truncation()
        return cls(tokenizer, tensors[tensor], name=name, mapping=tensors.get(mapping) if mapping else None,
                   token_weights=tensors.get(token_weights) if token_weights else None)

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        with self._lock:
            if len(texts) <= SERIAL_TEXTS:
                encoded = [self.tokenizer.encode(text, add_special_tokens=False) for text in texts]
            else:
                encoded = self._encode_batch(list(texts), add_special_tokens=False)
        return [e.ids[:MAX_TOKENS] for e in encoded]

    def rows_of(self, ids: np.ndarray) -> np.ndarray:
        """The table's rows ``ids`` as float32 (a copy)."""
        if self._halves is not None:
            return np.take(self._halves, np.take(self.table.view(np.uint16), ids, axis=0))
        return self.table[ids].astype(np.float32)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed_ids(self.token_ids(texts) if len(texts) else [])

    def word_norms(self, words: Sequence[str]) -> list[float]:
        """The length of each word's vector before it is normalised (the sum of its tokens'
        vectors): a static model gives a word that says little ("always", "put", "main") a short
        vector and a word that says much ("parking", "overdue") a long one."""
        norms = []
        for ids in self.token_ids(words) if len(words) else []:
            if not ids:
                norms.append(0.0)
                continue
            ids_array = np.clip(np.asarray(ids, dtype=np.int64), 0, self.rows - 1)
            rows = self.rows_of(ids_array if self.mapping is None else self.mapping[ids_array])
            if self.token_weights is not None:
                rows *= self.token_weights[ids_array].astype(np.float32)[:, None]
            norms.append(float(np.linalg.norm(rows.sum(axis=0))))
        return norms

    def embed_ids(self, ids_per_text: Sequence[Sequence[int]]) -> np.ndarray:
        """``embed`` of texts already tokenized (``token_ids``): the same vectors, bit for bit."""
        out = np.zeros((len(ids_per_text), self.dimension), dtype=np.float32)
        if not len(ids_per_text):
            return out
        lengths = np.fromiter((len(ids) for ids in ids_per_text), dtype=np.int64, count=len(ids_per_text))
        filled = lengths > 0
        if not filled.any():
            return out
        ids = np.fromiter((i for ids in ids_per_text for i in ids), dtype=np.int64, count=int(lengths.sum()))
        np.clip(ids, 0, self.rows - 1, out=ids)
        rows = self.rows_of(ids if self.mapping is None else self.mapping[ids])
        if self.token_weights is not None:
            rows *= self.token_weights[ids].astype(np.float32)[:, None]
        # Each text's own sum, token after token from zero: the same additions as the text embedded
        # alone, so a text's vector does not depend on the other texts of its batch. (A running sum
        # over the whole batch, less the part before the text, differed in the last bits with the
        # texts before it, and numpy's running sum adds one number at a time: 5 to 10 times slower.)
        ends = np.cumsum(lengths)
        starts = ends - lengths
        for length in range(1, SHORT_TEXT_TOKENS + 1):  # short texts (words) by length, all at once
            found = np.flatnonzero(lengths == length)
            if len(found):
                first = starts[found]
                total = rows[first] + np.float32(0.0)  # from zero, as a sum starts (-0.0 becomes 0.0)
                for offset in range(1, length):
                    total += rows[first + offset]
                out[found] = total
        for k in np.flatnonzero(lengths > SHORT_TEXT_TOKENS):
            out[k] = rows[starts[k]:ends[k]].sum(axis=0)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        np.divide(out, norms, out=out, where=norms > 0)
        return out


@lru_cache(maxsize=1)
def wordllama_model() -> StaticModel:
    """WordLlama's 256-dimension model from the installed ``wordllama`` package, once per process."""
    return StaticModel.from_files(package_file("wordllama", *WORDLLAMA_TOKENIZER),
                                  package_file("wordllama", *WORDLLAMA_WEIGHTS), name="wordllama-l2-supercat-256")


def wordllama_installed() -> bool:
    """Whether the ``wordllama`` package and its two files are installed (nothing is loaded)."""
    try:
        package_file("wordllama", *WORDLLAMA_TOKENIZER)
        package_file("wordllama", *WORDLLAMA_WEIGHTS)
    except StaticModelUnavailable:
        return False
    return importlib.util.find_spec("tokenizers") is not None
