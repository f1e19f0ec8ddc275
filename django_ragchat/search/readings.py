"""Whether searches fetch the chunks' stored readings (``Chunk.analysis``, 4-8 KB each).

Only an answerer that reads them (one with ``chunk_reader``, the offline answerer) uses them;
a turn answered by a model server does not carry them out of the database. The turn says which
(``fetching_readings`` around its stages); outside a turn searches fetch them.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

_wanted: contextvars.ContextVar[bool] = contextvars.ContextVar("ragchat_fetch_readings", default=True)


@contextlib.contextmanager
def fetching_readings(wanted: bool) -> Iterator[None]:
    """Searches inside this block (and the tasks and threads it starts through asyncio or
    asgiref, which copy the context) fetch ``RetrievedChunk.analysis`` only if ``wanted``."""
    token = _wanted.set(wanted)
    try:
        yield
    finally:
        _wanted.reset(token)


def wanted() -> bool:
    """Whether searches here fetch the stored readings."""
    return _wanted.get()
