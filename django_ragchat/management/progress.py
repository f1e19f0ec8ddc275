"""The progress bar of the long commands (``ragchat_ingest``, ``ragchat_sync``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from tqdm import tqdm


@contextlib.contextmanager
def progress_bar(command, *, off: bool, unit: str, desc: str) -> Iterator[Callable[[int, int, str], None]]:
    """A ``progress(done, total, label)`` callback drawing a tqdm bar on ``command``'s stderr when
    it is a terminal (and ``off`` is false); a no-op otherwise."""
    # The bar goes to the real stream: Django's OutputWrapper appends a newline to every
    # write, which would break tqdm's in-place redraws.
    stream = getattr(command.stderr, "_out", command.stderr)
    bar = tqdm(file=stream, unit=unit, desc=desc, leave=False, dynamic_ncols=True) \
        if not off and stream.isatty() else None

    def progress(done: int, total: int, label: str) -> None:
        if bar is not None:
            bar.total = total
            bar.set_postfix_str(label[-40:], refresh=False)
            bar.update(done - bar.n)

    try:
        yield progress
    finally:
        if bar is not None:
            bar.close()
