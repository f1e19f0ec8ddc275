"""Counting tokens for budgets, offline.

tiktoken is used only when its encoding is already on this machine: tiktoken downloads
encodings on first use, which fails without network (and would stall a request). Otherwise a
documented estimator is used: ``ceil(characters / 4)``, floored by the word count, which is
what OpenAI documents as the rule of thumb for English and errs high for code and non-Latin
scripts (it is used for budgets, where erring high is the safe side).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import os
import tempfile

logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=1)
def _local_tiktoken_encoding():
    """The cl100k_base encoding if tiktoken and a local copy of it exist, else None."""
    try:  # an optional dependency (the "tiktoken" extra)
        import tiktoken  # noqa: PLC0415
        import tiktoken_ext.openai_public  # noqa: F401, PLC0415  (registers the encoding names)
    except ImportError:
        return None
    cache_dir = os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")
    if not cache_dir:
        cache_dir = os.path.join(tempfile.gettempdir(), "data-gym-cache")
    # tiktoken caches the encoding file under a hash of its URL; without it, loading would
    # download. Only load when that file is present.
    url = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
    if not os.path.exists(os.path.join(cache_dir, hashlib.sha1(url.encode()).hexdigest())):
        return None
    try:
        return tiktoken.get_encoding("cl100k_base")
    except Exception:  # a corrupt cache or a changed URL scheme: fall back, don't fail the turn
        logger.warning("tiktoken's local encoding could not be loaded; estimating tokens")
        return None


def estimate_tokens(text: str) -> int:
    """The offline estimator: max(ceil(chars / 4), words)."""
    if not text:
        return 0
    # Words are runs of non-whitespace: ``str.split()`` counts the same runs as ``\S+`` (both
    # use ``str.isspace``, every code point checked) at a quarter of a regex's cost; a turn
    # counts its passages, history and answer this way.
    return max(math.ceil(len(text) / 4), len(text.split()))


def count_tokens(text: str) -> int:
    """Tokens in ``text``: tiktoken's count when available locally, else the estimate."""
    encoding = _local_tiktoken_encoding()
    if encoding is not None:
        return len(encoding.encode(text, disallowed_special=()))
    return estimate_tokens(text)


def tokenizer_name() -> str:
    return "tiktoken:cl100k_base" if _local_tiktoken_encoding() is not None else "estimate:chars/4"
