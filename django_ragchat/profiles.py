"""Profiles: named assistants, each with its own prompt, memory, retrieval and model.

A site declares them in settings::

    RAGCHAT = {
        "PROFILES": {
            "default": {"system_prompt": "You answer questions about our products."},
            "support": {
                "title": "Customer support",
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
import difflib
import functools
import importlib.util
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from django_ragchat.conf import ragchat_settings

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant. Answer the user's question using the numbered context "
    "passages given with it, and cite the passages you use as [1], [2]. If the context does not "
    "contain the answer, say that you don't know rather than guessing."
)
# The system prompt of a profile whose model searches for itself ("retrieval": "tool") and
# that sets none of its own.
DEFAULT_TOOL_SYSTEM_PROMPT = (
    "You are a helpful assistant. Search the documents with the search_documents tool when a "
    "question needs them, and cite the numbered passages you use as [1], [2]. If the documents "
    "do not contain the answer, say that you don't know rather than guessing."
)


def default_embedder() -> str:
    """``wordllama`` (a static semantic model shipped in a wheel, docs/embedders.md) when the
    ``semantic`` extra is installed, else the ``hashing`` fallback. Found without importing it."""
    installed = all(importlib.util.find_spec(name) is not None for name in ("wordllama", "tokenizers"))
    return "wordllama" if installed else "hashing"


@dataclass(frozen=True)
class Profile:
    """One named assistant configuration. Every field has a default; see docs/profiles.md."""

    name: str = "default"
    # What people see for it (the chat page's conversation list, the admin, the plugin
    # listings); None: its name. The name stays the key in settings, URLs and the API.
    title: str | None = None
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    # Single-choice stages: the name of one registered component.
    llm: str = "extractive"
    embedder: str = field(default_factory=default_embedder)
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
    # Around-advice (django_ragchat.turn.advisors), the first outermost.
    advisors: list[str] | None = None
    # Tools the model may call, by registered name (register_tools; docs/tools.md).
    tools: list[str] = field(default_factory=list)
    # "always": retrieve before every answer; "tool": offer search_documents and let the
    # model decide when to search, and with which query.
    retrieval: str = "always"
    # Rounds of tool calls the model may ask for in one answer; after the last, it is asked to
    # answer without tools.
    max_tool_steps: int = 5
    # Seconds a tool may run (a tool's own ``timeout`` wins), and seconds a call that needs
    # the user's approval waits for it before it is abandoned (not run).
    tool_timeout: float = 30.0
    tool_confirmation_timeout: float = 120.0
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
    # The words the offline components read text with (django_ragchat.language): "language"
    # ("en"), or a "directory" of the site's own language files; "synonyms" added to the
    # language's table ("replace_synonyms": True replaces it); "query_synonyms": whether the
    # query components (followup, synonyms) read the table too (None: only when llm is
    # "extractive"). See docs/answerer.md.
    vocabulary: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.title is None:  # frozen: set as dataclasses set a field
            object.__setattr__(self, "title", self.name)

    @property
    def offers_tools(self) -> bool:
        """Whether the model is offered tools (the profile's, or the search tool)."""
        return bool(self.tools) or self.retrieval == "tool"

    @property
    def prompt_budget(self) -> int:
        """Tokens available for system prompt, history, context and question."""
        return max(0, self.context_window - self.max_answer_tokens)

    def options_for(self, component_name: str) -> dict[str, Any]:
        return dict(self.options.get(component_name, {}))

    def vocabulary_settings(self) -> dict[str, Any]:
        """``vocabulary`` with every key and its default filled in."""
        settings = {**VOCABULARY_DEFAULTS, **self.vocabulary}
        if settings["query_synonyms"] is None:
            # A model reads a question itself: its retrieval does not run on the offline
            # answerer's word lists unless the site says so.
            settings["query_synonyms"] = self.llm == "extractive"
        return settings


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
RETRIEVAL_MODES = ("always", "tool")
VOCABULARY_DEFAULTS: dict[str, Any] = {
    "language": "en", "directory": None, "synonyms": {}, "replace_synonyms": False, "query_synonyms": None,
}


class UnknownProfile(ImproperlyConfigured):
    pass


class InvalidProfile(ImproperlyConfigured):
    """A profile whose values are wrong; ``problems`` lists each one (the system check reports
    them one by one; a turn is refused, ``ProfileUnavailable``, with this as its cause and all of
    them in the log)."""

    def __init__(self, name: str, problems: list[str]):
        self.name = name
        self.problems = problems
        super().__init__("; ".join(f"Profile {name!r}: {problem}" for problem in problems))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _shape_problems(profile: Profile) -> list[str]:
    """Values of the wrong type: names, component lists, dicts."""
    problems = []
    for name in ("system_prompt", "llm", "embedder", "memory", "joiner", "prompt_augmenter", "no_context_answer"):
        if not isinstance(getattr(profile, name), str):
            problems.append(f"{name} must be a string, not {getattr(profile, name)!r}")
    for name in LIST_STAGES:
        value = getattr(profile, name)
        if value is not None and (not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value)):
            problems.append(f"{name} must be a list of component names or None, not {value!r}")
    if not isinstance(profile.options, dict) or not all(
        isinstance(key, str) and isinstance(value, dict) for key, value in profile.options.items()
    ):
        problems.append('options must be a dict of component name -> dict of options, e.g. {"openai": {"model": "..."}}')
    if not isinstance(profile.title, str) or not profile.title.strip():
        problems.append(f"title must be a non-empty string (what people see for the profile), not {profile.title!r}")
    if not isinstance(profile.metadata, dict):
        problems.append("metadata must be a dict")
    if not isinstance(profile.stream, bool):
        problems.append(f"stream must be True or False, not {profile.stream!r}")
    if not isinstance(profile.tools, (list, tuple)) or not all(isinstance(t, str) for t in profile.tools):
        problems.append(f"tools must be a list of tool names, not {profile.tools!r}")
    return problems


def _tool_problems(profile: Profile) -> list[str]:
    problems = []
    if profile.retrieval not in RETRIEVAL_MODES:
        problems.append(f"retrieval must be one of {RETRIEVAL_MODES}, not {profile.retrieval!r}")
    if not _is_int(profile.max_tool_steps) or profile.max_tool_steps < 0:
        problems.append(f"max_tool_steps must be a whole number, 0 or more, not {profile.max_tool_steps!r}")
    for name in ("tool_timeout", "tool_confirmation_timeout"):
        value = getattr(profile, name)
        if not _is_number(value) or value <= 0:
            problems.append(f"{name} must be a positive number of seconds, not {value!r}")
    return problems


def _number_problems(profile: Profile) -> list[str]:
    """Numbers out of range, and sizes that do not fit together."""
    problems = []
    if not _is_number(profile.history_share) or not 0 <= profile.history_share <= 1:
        problems.append("history_share must be between 0 and 1")
    integers = ("top_k", "retrieval_k", "retrieval_concurrency", "context_window", "max_answer_tokens")
    bad_integers = [name for name in integers if not _is_int(getattr(profile, name))]
    for name in bad_integers:
        problems.append(f"{name} must be a whole number, not {getattr(profile, name)!r}")
    if not bad_integers:
        if profile.top_k < 1 or profile.retrieval_k < profile.top_k:
            problems.append("top_k must be at least 1 and retrieval_k at least top_k")
        if profile.retrieval_concurrency < 1:
            problems.append("retrieval_concurrency must be at least 1")
        if profile.max_answer_tokens < 1 or profile.max_answer_tokens >= profile.context_window:
            problems.append("max_answer_tokens must be at least 1 and smaller than context_window")
    threshold = profile.similarity_threshold
    if threshold is not None and (not _is_number(threshold) or not -1 <= threshold <= 1):
        problems.append(f"similarity_threshold must be None or a number from -1 to 1, not {threshold!r}")
    return problems


def profile_problems(profile: Profile) -> list[str]:
    """What is wrong with a profile's values, as sentences (empty when nothing is).

    Component names are not looked up here (that needs the plugin registry, see
    ``checks.check_profiles``); everything a profile says by value is."""
    problems = _shape_problems(profile)
    if profile.empty_context not in EMPTY_CONTEXT_POLICIES:
        problems.append(f"empty_context must be one of {EMPTY_CONTEXT_POLICIES}, not {profile.empty_context!r}")
    return (problems + _number_problems(profile) + _tool_problems(profile)
            + vocabulary_problems(profile.vocabulary))


def vocabulary_problems(vocabulary: Any) -> list[str]:
    """What is wrong with a profile's ``vocabulary`` setting (its values, not its files)."""
    if not isinstance(vocabulary, dict):
        return [f"vocabulary must be a dict, not {vocabulary!r}"]
    problems = []
    unknown = sorted(set(vocabulary) - set(VOCABULARY_DEFAULTS))
    if unknown:
        problems.append(f"vocabulary has unknown key(s) {unknown}; valid keys are {sorted(VOCABULARY_DEFAULTS)}")
    if not isinstance(vocabulary.get("language", "en"), str):
        problems.append("vocabulary language must be a language code such as 'en'")
    if not isinstance(vocabulary.get("directory") or "", str):
        problems.append("vocabulary directory must be a path (a string) or None")
    synonyms = vocabulary.get("synonyms", {})
    if not isinstance(synonyms, dict) or not all(
            isinstance(words, (list, tuple)) and all(isinstance(w, str) for w in words) for words in synonyms.values()):
        problems.append('vocabulary synonyms must be a dict of group name -> list of words, e.g. {"volume": ["roomy"]}')
    for key in ("replace_synonyms", "query_synonyms"):
        if key in vocabulary and not isinstance(vocabulary[key], bool) and vocabulary[key] is not None:
            problems.append(f"vocabulary {key} must be True or False, not {vocabulary[key]!r}")
    return problems


def draft_profile(name: str, config: dict[str, Any]) -> Profile:
    """A ``Profile`` of ``config``'s known keys, its values not checked: what the profile would
    run, for the system checks that can still say something about a profile with a wrong value
    (which components it names, which options it gives them)."""
    known = {key: value for key, value in config.items() if key in PROFILE_FIELDS and key != "name"}
    if known.get("retrieval") == "tool" and "system_prompt" not in known:
        known["system_prompt"] = DEFAULT_TOOL_SYSTEM_PROMPT
    return Profile(**known, name=name)


def did_you_mean(unknown: list[str], valid: list[str]) -> str:
    """" (did you mean 'memory'?)" for the closest valid names to ``unknown`` ones, or ""."""
    close = [match for key in unknown for match in difflib.get_close_matches(key, valid, n=1)]
    return f" (did you mean {' or '.join(map(repr, dict.fromkeys(close)))}?)" if close else ""


def build_profile(name: str, config: dict[str, Any]) -> Profile:
    """A ``Profile`` from one entry of ``RAGCHAT["PROFILES"]``.

    Raises ``InvalidProfile`` (an ``ImproperlyConfigured``) listing every problem, unknown keys
    and wrong values together, in the words of the system check ragchat.E002."""
    unknown = sorted(set(config) - PROFILE_FIELDS - {"name"})
    valid = sorted(PROFILE_FIELDS - {"name"})
    problems = [f"unknown option(s) {unknown}{did_you_mean(unknown, valid)}; valid options are {valid}"] if unknown else []
    profile = draft_profile(name, config)
    problems += profile_problems(profile)
    if problems:
        raise InvalidProfile(name, problems)
    return profile


@functools.lru_cache(maxsize=None)
def get_profile(name: str | None = None) -> Profile:
    """The profile called ``name`` (the default profile when ``None``)."""

    name = name or ragchat_settings.DEFAULT_PROFILE
    configs = ragchat_settings.PROFILES
    if name not in configs:
        raise UnknownProfile(
            f"No profile named {name!r}; RAGCHAT['PROFILES'] defines {sorted(configs)}."
        )
    return build_profile(name, configs[name] or {})


def profile_names() -> list[str]:
    return list(ragchat_settings.PROFILES)


def profile_title(name: str) -> str:
    """What a person sees for the profile called ``name``: its ``title``, else its name (none
    set, or none valid, or no such profile left: a conversation outlives its profile). A profile
    that cannot be built (the system check and the turn say why) keeps a valid title of its own,
    so its conversations are not renamed by a wrong ``top_k``."""
    try:
        return get_profile(name).title
    except ImproperlyConfigured:
        config = ragchat_settings.PROFILES.get(name)
        title = config.get("title") if isinstance(config, dict) else None
        return title if isinstance(title, str) and title.strip() else name
