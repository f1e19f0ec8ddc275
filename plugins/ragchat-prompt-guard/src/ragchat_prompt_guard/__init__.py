"""ragchat-prompt-guard: a django-ragchat plugin that refuses prompt-injection attempts.

It registers the guardrail ``prompt_guard`` (``PromptGuard``), enabled by default: each user
message is scored by weighted patterns and heuristics (``assess``) for instructions aimed at
the assistant (override its rules, reveal its prompt, change its role, fake a system turn,
exfiltrate through a link), disguised or not; at or above the threshold the turn is refused
before retrieval, or only flagged in the trace (``action="flag"``).

Installing the distribution registers it (entry point group ``django_ragchat``); listing
``"ragchat_prompt_guard"`` in ``RAGCHAT["PLUGINS"]`` does the same without entry points. The
detection (``assess``) needs no Django. The labelled set it is measured on ships in
``data/labelled.jsonl`` (see ``ragchat_prompt_guard.evaluation``).
"""

from django_ragchat import hookimpl

from ragchat_prompt_guard.components import PromptGuard
from ragchat_prompt_guard.detect import DEFAULT_THRESHOLD, Assessment, assess

__all__ = ["DEFAULT_THRESHOLD", "Assessment", "PromptGuard", "assess"]
__version__ = "0.1.0"


@hookimpl
def register_guardrails(register):
    register(PromptGuard)
