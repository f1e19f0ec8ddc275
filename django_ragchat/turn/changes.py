"""What each document post-processor and response augmenter changed, for the trace.

Both stages are chains: each component receives the previous one's output. The pipeline
records, per component, the difference between what it gave and what it got back, from what it
holds anyway: chunk ids and scores for post-processors; lengths, the texts' common start and end,
and the other fields of the ``Answer`` for response augmenters. No SQL, and never a second copy
of the answer, nor of any text an augmenter removed (a redactor's removals must not reach the
stored trace): counts and positions only.

``trace["postprocess"]``: per post-processor ``{"by", "in", "out", "dropped", "added",
"reordered"}`` (chunk ids; ``order``, the first ids after it, when it reordered; ``rescored``,
how many kept chunks got a new score, when some did).

``trace["response_augmenters"]``: per augmenter ``{"by", "changed"}`` (the ``Answer`` fields
it changed: ``text``, ``citations``, ``sources``, ``metadata``), with ``text`` (``before``,
``after``, ``at``, ``removed``, ``inserted``: characters) when it changed the text, ``streamed``
(``in``, ``out``, ``changed``, ``tail``) for a streamed answer, and ``note``: the short note it
left in ``answer.metadata["transform_note"]``, the key query transformers use, moved here and
taken out of the answer (so it never reaches the saved message).
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from django_ragchat.types import Answer, RetrievedChunk

#: The key of a component's note in the object it returns (a ``Query``'s, an ``Answer``'s metadata).
NOTE_KEY = "transform_note"
#: A note is short: longer ones are cut.
MAX_NOTE_CHARS = 500
#: Chunk ids listed per post-processor as dropped or added (the counts say the rest).
MAX_IDS = 200
#: The first chunk ids after a post-processor that reordered the list.
ORDER_SHOWN = 5


def documents_step(name: str, before: list[RetrievedChunk], after: list[RetrievedChunk]) -> dict[str, Any]:
    """What post-processor ``name`` did to the list: ``before`` in, ``after`` out."""
    before_ids = [d.chunk_id for d in before]
    after_ids = [d.chunk_id for d in after]
    came, left = set(before_ids), set(after_ids)
    kept = [i for i in before_ids if i in left]
    step: dict[str, Any] = {
        "by": name, "in": len(before), "out": len(after),
        "dropped": [i for i in before_ids if i not in left][:MAX_IDS],
        "added": [i for i in after_ids if i not in came][:MAX_IDS],
        "reordered": kept != [i for i in after_ids if i in came],
    }
    if step["reordered"]:
        step["order"] = after_ids[:ORDER_SHOWN]
    scores = {d.chunk_id: d.score for d in before}
    rescored = sum(1 for d in after if d.chunk_id in scores and d.score != scores[d.chunk_id])
    if rescored:
        step["rescored"] = rescored
    return step


def keep_readable(steps: list[dict[str, Any]], readable: set[int] | None) -> None:
    """Only the chunks the asker may read are named (``None``: every one may be)."""
    if readable is None:
        return
    for step in steps:
        for key in ("dropped", "added", "order"):
            if key in step:
                step[key] = [i for i in step[key] if i in readable]


def _common_prefix(a: str, b: str) -> int:
    low, high = 0, min(len(a), len(b))
    while low < high:  # halving: each comparison of slices runs in C
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def text_change(before: str, after: str) -> dict[str, int] | None:
    """Where and by how much ``after`` differs from ``before``: the one span that changed, found
    from their common start and end, in characters; ``None`` when they are the same."""
    if before == after:
        return None
    start = _common_prefix(before, after)
    end = _common_prefix(before[start:][::-1], after[start:][::-1])
    return {"before": len(before), "after": len(after), "at": start,
            "removed": len(before) - start - end, "inserted": len(after) - start - end}


def take_note(answer: Answer) -> tuple[Answer, str]:
    """The answer without its note, and the note ("" for none)."""
    if NOTE_KEY not in answer.metadata:
        return answer, ""
    note = answer.metadata[NOTE_KEY]
    rest = {k: v for k, v in answer.metadata.items() if k != NOTE_KEY}
    note = "" if note is None else str(note)
    if len(note) > MAX_NOTE_CHARS:
        note = note[:MAX_NOTE_CHARS - 1] + "…"
    return answer.replace(metadata=rest), note


def answer_step(name: str, before: Answer, after: Answer, note: str) -> dict[str, Any]:
    """What response augmenter ``name`` changed in the answer (its note already taken out)."""
    changed = [f for f in ("text", "citations", "sources", "metadata") if getattr(before, f) != getattr(after, f)]
    step: dict[str, Any] = {"by": name, "changed": changed}
    if "text" in changed:
        step["text"] = text_change(before.text, after.text)
    if note:
        step["note"] = note
    return step


@dataclass
class StreamTally:
    """What one augmenter's ``on_delta`` received and sent over a streamed answer, and its tail."""

    received: int = 0
    sent: int = 0
    tail: int = 0
    _in: Any = field(default_factory=lambda: hashlib.blake2b(digest_size=16))
    _out: Any = field(default_factory=lambda: hashlib.blake2b(digest_size=16))

    def add(self, text_in: str, text_out: str) -> None:
        self.received += len(text_in)
        self.sent += len(text_out)
        self._in.update(text_in.encode("utf-8", "surrogatepass"))
        self._out.update(text_out.encode("utf-8", "surrogatepass"))

    def trace(self) -> dict[str, Any]:
        return {"in": self.received, "out": self.sent, "changed": self._in.digest() != self._out.digest(),
                "tail": self.tail}


def stream_tallies(state: dict[str, Any]) -> defaultdict[str, StreamTally]:
    """The turn's ``StreamTally`` per augmenter name, kept in ``state`` (``TurnContext.state``)."""
    return state.setdefault("_stream_tallies", defaultdict(StreamTally))


def with_stream(step: dict[str, Any], streamed: StreamTally | None) -> dict[str, Any]:
    """``step`` of a streamed answer, with what the augmenter did while it streamed."""
    if streamed is not None:
        step["streamed"] = streamed.trace()
        if (streamed.tail or step["streamed"]["changed"]) and "text" not in step["changed"]:
            step["changed"] = ["text", *step["changed"]]
    return step
