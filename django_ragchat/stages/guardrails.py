"""Guardrails: checks on the user's input before retrieval and on the answer before saving.

Malformed input (empty, oversized, NUL bytes) never reaches a guardrail: the pipeline rejects
it before anything is saved (``pipeline.validate_user_message``). Guardrails are for policy.

An output guardrail has three outcomes: pass (``None``, or a changed ``Answer``), fail (a
``Refusal``: its text is the saved answer) and reprompt (a ``Reprompt``: the model is called
again, whole-answer, with the rejected answer and the guardrail's feedback appended to the
prompt; at most ``max_reprompts`` times, after which ``exhausted`` decides). On a streamed
turn a reprompt sends a ``retry`` event: clients discard the text streamed so far, and the
new answer follows as ``delta`` events from index 0 (docs/protocol.md).

Built in: ``blocked_phrases`` (input), ``require_citation`` (output, off by default).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django_ragchat import hookimpl
from django_ragchat.components import Component
from django_ragchat.text import normalize
from django_ragchat.types import Answer, Redaction, Refusal, Reprompt

if TYPE_CHECKING:
    from django_ragchat.turn.context import TurnContext


class Guardrail(Component):
    """Base class. Return ``None`` to let the turn go on, or a ``Refusal`` to end it.

    ``check_input`` may also return a ``Redaction``: the turn goes on with its text in place of
    the user's message, which is what is searched, answered and kept (the message's row, the
    trace); a ``Refusal``'s ``redacted`` keeps a refused message so (docs/plugins.md,
    "Redacting the user's message"). ``check_output`` may also return a changed ``Answer`` (e.g. with redactions) or a
    ``Reprompt`` (ask the model again with feedback, at most ``max_reprompts`` times; then
    ``exhausted`` decides). For streamed answers it runs when the stream ends; a refusal then
    replaces the streamed text in the saved message and the closing event.
    """

    kind = "guardrail"
    #: How many times this guardrail may send the model back to answer again in one turn.
    max_reprompts: int = 1
    #: The saved answer when the reprompts are used up (``exhausted``'s default).
    exhausted_answer: str = "I couldn't produce an answer that meets this site's rules."

    def check_input(self, text: str, turn: TurnContext) -> Refusal | Redaction | None:
        return None

    def check_output(self, answer: Answer, turn: TurnContext) -> Refusal | Answer | Reprompt | None:
        return None

    def exhausted(self, answer: Answer, reprompt: Reprompt, turn: TurnContext) -> Refusal | Answer:
        """The last answer still asked for a reprompt, and none are left: a ``Refusal`` (the
        default) or the ``Answer`` to save anyway (possibly marked in its metadata)."""
        return Refusal(self.exhausted_answer, reason=f"reprompts used up: {reprompt.reason}")


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


class RequireCitation(Guardrail):
    """When documents were supplied, an answer must cite at least one of them.

    An answer without a valid citation (``answer.citations`` is empty: run it with the
    ``citations`` response augmenter, which fills them) is sent back to the model once with
    ``feedback``; if the new answer cites nothing either, it is saved as it is, marked
    ``"uncited": true`` in the message's metadata. Off by default::

        "guardrails": ["require_citation"],
        "options": {"require_citation": {"max_reprompts": 1}}
    """

    name = "require_citation"
    order = 200
    enabled_by_default = False
    default_feedback = ("Your answer did not cite the documents. Answer again using only the numbered "
                        "documents, and cite each fact with its number in brackets, like [1].")

    def __init__(self, profile, *, max_reprompts: int = 1, feedback: str | None = None, **options: Any):
        super().__init__(profile, **options)
        if not isinstance(max_reprompts, int) or max_reprompts < 0:
            raise ValueError(f"require_citation: max_reprompts must be a whole number >= 0, not {max_reprompts!r}")
        self.max_reprompts = max_reprompts
        self.feedback = feedback or self.default_feedback

    def check_output(self, answer, turn):
        if not (turn.prompt and turn.prompt.documents) or answer.citations:
            return None
        return Reprompt(self.feedback, reason="the answer cites none of the documents")

    def exhausted(self, answer, reprompt, turn):
        return answer.replace(metadata={**answer.metadata, "uncited": True})


@hookimpl
def register_guardrails(register):
    register(BlockedPhrases)
    register(RequireCitation)
