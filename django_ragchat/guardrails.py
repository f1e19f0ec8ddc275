"""Guardrails: checks on the user's input before retrieval and on the answer before saving.

Malformed input (empty, oversized, NUL bytes) never reaches a guardrail: the pipeline rejects
it before anything is saved (``pipeline.validate_user_message``). Guardrails are for policy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django_ragchat import hookimpl
from django_ragchat.components import Component
from django_ragchat.text import normalize
from django_ragchat.types import Answer, Refusal

if TYPE_CHECKING:
    from django_ragchat.pipeline import TurnContext


class Guardrail(Component):
    """Base class. Return ``None`` to let the turn go on, or a ``Refusal`` to end it.

    ``check_output`` may also return a changed ``Answer`` (e.g. with redactions). For streamed
    answers it runs when the stream ends; a refusal then replaces the streamed text in the
    saved message and the closing event.
    """

    kind = "guardrail"

    def check_input(self, text: str, turn: TurnContext) -> Refusal | None:
        return None

    def check_output(self, answer: Answer, turn: TurnContext) -> Refusal | Answer | None:
        return None


class BlockedPhrases(Guardrail):
    """Refuses input containing any of ``phrases`` (case- and accent-insensitive).

    Does nothing unless the profile gives it phrases::

        "options": {"blocked_phrases": {"phrases": ["ignore previous instructions"]}}
    """

    name = "blocked_phrases"
    order = 10

    def __init__(self, profile, *, phrases: list[str] = (), answer: str = "I can't help with that request.",
                 **options: Any):
        super().__init__(profile, **options)
        self.phrases = [normalize(p) for p in phrases]
        self.answer = answer

    def check_input(self, text, turn):
        folded = normalize(text)
        for phrase in self.phrases:
            if phrase in folded:
                return Refusal(self.answer, reason=f"input contains blocked phrase {phrase!r}")
        return None


@hookimpl
def register_guardrails(register):
    register(BlockedPhrases)
