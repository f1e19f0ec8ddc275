"""Profiles: named assistants, each with its own prompt, memory, retrieval and model.

A site declares them in settings::

    RAGCHAT = {
        "PROFILES": {
            "default": {"system_prompt": "You answer questions about our products."},
            "support": {
                "llm": "openai",
                "options": {"openai": {"model": "gpt-4o-mini"}},
                "memory": "token_window",
                "top_k": 6,
            },
        },
    }

A conversation is bound to one profile by name. The system prompt is read from the profile at
call time and never stored as a message, so a conversation never carries two of them and a
changed prompt applies to every conversation at once.

Component lists (``query_transformers``, ``retrievers``...) are names of registered
components. ``None`` means "every component of that stage that is enabled by default", which
is how an installed plugin joins every profile that does not pin its list.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ImproperlyConfigured

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant. Answer the user's question using the numbered context "
    "passages given with it, and cite the passages you use as [1], [2]. If the context does not "
    "contain the answer, say that you don't know rather than guessing."
)


@dataclass(frozen=True)
class Profile:
    """One named assistant configuration. Every field has a default; see docs/profiles.md."""

    name: str = "default"
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    # Single-choice stages: the name of one registered component.
    llm: str = "extractive"
    embedder: str = "hashing"
    memory: str = "token_window"
    joiner: str = "rrf"
    prompt_augmenter: str = "context"
    # Multi-component stages: names, or None for every component enabled by default.
    guardrails: list[str] | None = None
    query_transformers: list[str] | None = None
    query_expanders: list[str] | None = None
    retrievers: list[str] | None = None
    document_postprocessors: list[str] | None = None
    response_augmenters: list[str] | None = None
    # Around-advice (django_ragchat.advisors), the first outermost.
    advisors: list[str] | None = None
    # Per-component options: {"component name": {option: value}}.
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Retrieval.
    top_k: int = 4
    # Candidates each (query, retriever) pair returns before joining.
    retrieval_k: int = 10
    similarity_threshold: float | None = None
    # How many (query, retriever) searches run at once.
    retrieval_concurrency: int = 4
    # What happens when no document is found: "decline" answers with no_context_answer
    # without calling the model; "answer" lets the model answer from the history alone.
    empty_context: str = "decline"
    no_context_answer: str = (
        "I couldn't find anything about that in the documents I can search, so I can't answer it."
    )
    # Token budget of the prompt. The model's context window minus the answer's reserve is
    # split: history gets at most history_share of it, retrieved context the rest, so
    # retrieval never silently crowds out the conversation (and vice versa).
    context_window: int = 8192
    max_answer_tokens: int = 1024
    history_share: float = 0.35
    # Stream answers token by token where the transport allows it.
    stream: bool = True
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def prompt_budget(self) -> int:
        """Tokens available for system prompt, history, context and question."""
        return max(0, self.context_window - self.max_answer_tokens)

    def options_for(self, component_name: str) -> dict[str, Any]:
        return dict(self.options.get(component_name, {}))


PROFILE_FIELDS = {f.name for f in dataclasses.fields(Profile)}
CHOICE_STAGES = {
    "llm": "llm",
    "embedder": "embedder",
    "memory": "memory",
    "joiner": "joiner",
    "prompt_augmenter": "prompt_augmenter",
}
LIST_STAGES = {
    "guardrails": "guardrail",
    "query_transformers": "query_transformer",
    "query_expanders": "query_expander",
    "retrievers": "retriever",
    "document_postprocessors": "document_postprocessor",
    "response_augmenters": "response_augmenter",
    "advisors": "advisor",
}
EMPTY_CONTEXT_POLICIES = ("decline", "answer")


class UnknownProfile(ImproperlyConfigured):
    pass


def build_profile(name: str, config: dict[str, Any]) -> Profile:
    """A ``Profile`` from one entry of ``RAGCHAT["PROFILES"]``; raises on unknown keys."""
    unknown = sorted(set(config) - PROFILE_FIELDS - {"name"})
    if unknown:
        raise ImproperlyConfigured(
            f"Profile {name!r} has unknown option(s) {unknown}; valid options are "
            f"{sorted(PROFILE_FIELDS - {'name'})}."
        )
    return Profile(**{**config, "name": name})


@functools.lru_cache(maxsize=None)
def get_profile(name: str | None = None) -> Profile:
    """The profile called ``name`` (the default profile when ``None``)."""
    from django_ragchat.conf import ragchat_settings

    name = name or ragchat_settings.DEFAULT_PROFILE
    configs = ragchat_settings.PROFILES
    if name not in configs:
        raise UnknownProfile(
            f"No profile named {name!r}; RAGCHAT['PROFILES'] defines {sorted(configs)}."
        )
    return build_profile(name, configs[name] or {})


def profile_names() -> list[str]:
    from django_ragchat.conf import ragchat_settings

    return list(ragchat_settings.PROFILES)
