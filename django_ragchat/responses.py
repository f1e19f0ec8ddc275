"""Response augmenters: work on the answer after the model.

``augment(answer, turn)`` handles a whole answer. For a streamed answer ``on_delta(text,
turn)`` sees each piece as it passes (it runs on the event loop and must not block; return the
text to send, possibly changed), ``finish(turn)`` runs after the model's last piece and may
return text to stream after it (a footer, a sources line: it reaches the client as ``delta``
events like the model's own text), and ``on_complete(answer, turn)`` sees the assembled answer,
tails included.

Built in: ``citations`` parses ``[1]``, ``[1, 2]`` and ``[1-3]`` references into ``Citation``
objects pointing at the prompt's documents (1-based, as Haystack's AnswerBuilder);
out-of-range and ``[0]`` references are skipped and reported in the trace's warnings.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from django_ragchat import hookimpl
from django_ragchat.components import Component
from django_ragchat.types import Answer, Citation

if TYPE_CHECKING:
    from django_ragchat.context import TurnContext


class ResponseAugmenter(Component):
    """Base class; every method defaults to passing the answer through unchanged."""

    kind = "response_augmenter"

    def augment(self, answer: Answer, turn: TurnContext) -> Answer:
        return answer

    def on_delta(self, text: str, turn: TurnContext) -> str:
        return text

    def finish(self, turn: TurnContext) -> str:
        """Text to stream after the model's last piece ("" for none).

        Called once per streamed answer, in augmenter order, before ``on_complete``. The text
        passes through the ``on_delta`` of the augmenters after this one and is sent as
        ``delta`` events, so clients render it like the model's text; it is part of the saved
        answer. A whole (non-streamed) answer has no tail: ``augment`` changes its text.
        May be ``async def``.
        """
        return ""

    def on_complete(self, answer: Answer, turn: TurnContext) -> Answer:
        return self.augment(answer, turn)


REFERENCE_RE = re.compile(r"\[(\d+(?:\s*(?:,|-|–)\s*\d+)*)\]")
MAX_RANGE = 50


def parse_references(text: str) -> tuple[list[int], list[int]]:
    """All referenced indices in order of first appearance, and the malformed ranges' ends."""
    found: list[int] = []
    bad: list[int] = []
    for match in REFERENCE_RE.finditer(text):
        for part in re.split(r"\s*,\s*", match.group(1)):
            if re.search(r"[-–]", part):
                start, end = (int(x) for x in re.split(r"\s*[-–]\s*", part))
                if start > end or end - start > MAX_RANGE:
                    bad.extend([start, end])
                    continue
                numbers = range(start, end + 1)
            else:
                numbers = [int(part)]
            for n in numbers:
                if n not in found:
                    found.append(n)
    return found, bad


class CitationParser(ResponseAugmenter):
    """Resolves ``[n]`` references to the prompt's documents."""

    name = "citations"
    order = 100

    def augment(self, answer, turn):
        documents = turn.prompt.documents if turn.prompt else ()
        indices, bad = parse_references(answer.text)
        citations = []
        for n in indices:
            if 1 <= n <= len(documents):
                citations.append(Citation(index=n, chunk_id=documents[n - 1].chunk_id))
            else:
                turn.warn(f"The answer cites [{n}], but the prompt had {len(documents)} document(s).")
        for n in bad:
            turn.warn(f"Ignored a malformed citation range ending at {n}.")
        return answer.replace(citations=tuple(citations))


@hookimpl
def register_response_augmenters(register):
    register(CitationParser)
