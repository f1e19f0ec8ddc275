"""Whether searches fetch the chunks' stored readings (``Chunk.analysis``, 4-8 KB each).

Only an answerer that reads them (one with ``chunk_reader``, the offline answerer) uses them;
a turn answered by a model server does not carry them out of the database. The turn says which
(``fetching_readings`` around its stages); outside a turn searches fetch them.
"""

from __future__ import annotations

import contextvars

_wanted: contextvars.ContextVar[bool] = contextvars.ContextVar("ragchat_fetch_readings", default=True)


class fetching_readings:  # lower case: used like a function, ``with fetching_readings(False):``
    """Searches inside this block (and the tasks and threads it starts through asyncio or
    asgiref, which copy the context) fetch ``RetrievedChunk.analysis`` only if ``wanted``."""

    __slots__ = ("wanted", "token")

    def __init__(self, wanted: bool):
        self.wanted = wanted

    def __enter__(self) -> None:
        self.token = _wanted.set(self.wanted)

    def __exit__(self, *exc_info: object) -> None:
        _wanted.reset(self.token)


def wanted() -> bool:
    """Whether searches here fetch the stored readings."""
    return _wanted.get()
