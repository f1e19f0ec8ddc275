"""The guardrail ``prompt_guard``: refuses (or only flags) messages that try to instruct the
assistant instead of asking it something."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured

from django_ragchat.stages.guardrails import Guardrail
from django_ragchat.types import Refusal

from ragchat_prompt_guard.detect import DEFAULT_THRESHOLD, assess

if TYPE_CHECKING:
    from django_ragchat.turn.context import TurnContext

DEFAULT_REFUSAL = ("Your message looks like an attempt to change how I work rather than a question, so I "
                   "won't act on it. Please ask your question directly.")
ACTIONS = ("refuse", "flag")


class PromptGuard(Guardrail):
    """Scores the user's message for prompt injection (``ragchat_prompt_guard.detect.assess``).

    Options (``profile.options["prompt_guard"]``):

    * ``threshold`` (``1.0``): the score at or above which a message counts as an injection;
      one strong signal scores 1.0, weak ones 0.25-0.75.
    * ``action`` (``"refuse"``): ``"refuse"`` ends the turn with ``refusal`` before retrieval,
      ``"flag"`` only records the assessment in the trace and lets the turn go on (to measure
      on real traffic before refusing anything).
    * ``refusal``: the answer given on refusal.

    Every turn's trace gets ``prompt_guard: {"score", "signals", "action"}``: signal names only,
    never the matched text.
    """

    name = "prompt_guard"
    order = 5  # before retrieval and before other guardrails: nothing else should see the attempt

    def __init__(self, profile, *, threshold: float = DEFAULT_THRESHOLD, action: str = "refuse",
                 refusal: str = DEFAULT_REFUSAL, **options: Any):
        super().__init__(profile, **options)
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or threshold <= 0:
            raise ImproperlyConfigured(f"prompt_guard in profile {profile.name!r}: threshold must be a "
                                       f"positive number, not {threshold!r}.")
        if action not in ACTIONS:
            raise ImproperlyConfigured(f"prompt_guard in profile {profile.name!r}: action must be one of "
                                       f"{ACTIONS}, not {action!r}.")
        if not isinstance(refusal, str) or not refusal.strip():
            raise ImproperlyConfigured(f"prompt_guard in profile {profile.name!r}: refusal must be a non-empty string.")
        self.threshold = float(threshold)
        self.action = action
        self.refusal = refusal

    def check_input(self, text: str, turn: TurnContext) -> Refusal | None:
        assessment = assess(text)
        flagged = assessment.is_injection(self.threshold)
        turn.trace["prompt_guard"] = {
            "score": assessment.score,
            "signals": list(assessment.signals),
            "action": ("refused" if self.action == "refuse" else "flagged") if flagged else "passed",
        }
        if flagged and self.action == "refuse":
            return Refusal(self.refusal, reason=f"prompt injection suspected ({', '.join(assessment.signals)})")
        return None
