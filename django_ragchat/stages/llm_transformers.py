"""Query transformers and a query expander that ask a model (any OpenAI-compatible server).

Built-in plugins, off unless a profile lists them (``enabled_by_default = False``: offline
profiles are unchanged)::

    "query_transformers": ["rewrite"],          # or "compress", "translate"
    "query_expanders": ["multi_query"],
    "options": {
        "openai": {"model": "gpt-4o", ...},      # the server and the answering model
        "rewrite": {"model": "gpt-4o-mini"},     # rewrite with a cheaper model, same server
        "multi_query": {"n": 3},
        "translate": {"language": "English"},
    }

* ``rewrite``: the latest message and the recent history become one standalone *search query*
  ("How much is it?" after "Tell me about the Aurora X2" becomes "Aurora X2 price").
  Skipped when there is no history.
* ``compress``: history and follow-up become one standalone *question* (for retrievers that
  work best with questions). Skipped when there is no history.
* ``translate``: the query is translated into the collection's ``language``.
* ``multi_query`` (expander): ``n`` variants of the query; the pipeline keeps the original
  first, drops duplicates, retrieves all concurrently (``profile.retrieval_concurrency``) and
  the joiner fuses the lists.

Only what is *searched* changes: the model still answers the user's own words
(``Query.original``). Each component takes the model options of
``backends.openai.chat_model_from_options`` (``model``, ``base_url``, ``api_key_env``,
``timeout``, ``max_retries``, ``headers``, ``temperature``, ``max_tokens``, ...; unset ones
come from the profile's ``options["openai"]``), plus ``instructions`` (the system message) and
``prompt`` (the user message), both ``str.format`` templates (``{{``/``}}`` for literal braces).

A reply of the wrong shape (empty, several lines where one was asked, a refusal such as
"I'm sorry, I can't...", far too long) or a failed model call never replaces the query: the
original is kept and the trace says why (``queries.transformed[].note``, and
``queries.expansion_notes`` for expanders). Every model call is listed in the trace's
``llm_calls`` with its model, time and token usage.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured

from django_ragchat import hookimpl
from django_ragchat.backends.openai import ChatModel, chat_model_from_options, record_call
from django_ragchat.exceptions import LLMError
from django_ragchat.stages.expanders import QueryExpander
from django_ragchat.stages.transformers import QueryTransformer
from django_ragchat.types import HistoryMessage, Query

if TYPE_CHECKING:
    from django_ragchat.turn.context import TurnContext

_REFUSAL_RE = re.compile(
    r"^\W*(i'?m sorry|i am sorry|sorry[,.!]|i apologi[sz]e|i cannot|i can'?t|i can not|i'?m unable|"
    r"i am unable|i'?m not able|i am not able|i won'?t|as an ai\b|unfortunately,? i)",
    re.IGNORECASE,
)
_LABEL_RE = re.compile(
    r"^(?:search query|standalone question|rewritten query|query|question|translation)\s*:\s*", re.IGNORECASE
)
_LIST_MARKER_RE = re.compile(r"^\s*(?:[-*•]+|\(?\d+\s*[.):]|\d+\s+-|#+)\s*")
_QUOTES = ("\"\"", "''", "``", "“”", "‘’", "«»")


def is_refusal(text: str) -> bool:
    """Whether a reply opens like a refusal ("I'm sorry, but...", "I cannot...")."""
    return bool(_REFUSAL_RE.match(text))


def clean_reply(text: str) -> str:
    """A one-line reply without the decorations models add: a label ("Search query:"),
    surrounding quotes or backticks, surrounding whitespace."""
    text = _LABEL_RE.sub("", text.strip()).strip()
    for opening, closing in _QUOTES:
        if len(text) >= 2 and text[0] == opening and text[-1] == closing:
            text = text[1:-1].strip()
    return text


def check_reply(reply: str, *, max_lines: int, max_chars: int) -> tuple[str, str]:
    """(cleaned reply, "") when ``reply`` has the asked shape, else ("", why not)."""
    lines = [line for line in reply.strip().splitlines() if line.strip()]
    if not lines:
        return "", "the reply was empty"
    if len(lines) > max_lines:
        return "", f"the reply had {len(lines)} lines where {max_lines} was asked"
    text = clean_reply("\n".join(lines))
    if not text:
        return "", "the reply was empty"
    if is_refusal(text):
        return "", f"the reply looks like a refusal ({text[:60]!r})"
    if len(text) > max_chars:
        return "", f"the reply was too long ({len(text)} characters)"
    return text, ""


def format_history(history: tuple[HistoryMessage, ...], *, messages: int, max_chars: int) -> str:
    """The last ``messages`` messages as "User: ..." / "Assistant: ..." lines, each shortened."""
    lines = []
    for message in history[-messages:] if messages else ():
        if message.is_tool_exchange:
            continue
        role = "User" if message.role == "user" else "Assistant"
        content = " ".join(message.content.split())
        if len(content) > max_chars:
            content = content[:max_chars].rstrip() + " …"
        lines.append(f"{role}: {content}")
    return "\n".join(lines) or "(no earlier messages)"


class PromptedModel:
    """A model asked with two templates: ``instructions`` (system message) and ``prompt``
    (user message). Shared by every component here; the templates are checked when the
    component is built, so a typo in a field name fails ``manage.py check``, not a turn."""

    def __init__(self, component: str, chat: ChatModel, *, instructions: str, prompt: str, fields: tuple[str, ...]):
        self.component = component
        self.chat = chat
        self.instructions = instructions
        self.prompt = prompt
        sample = {f: "x" for f in fields}
        for option, template in (("instructions", instructions), ("prompt", prompt)):
            try:
                template.format(**sample)
            except (KeyError, IndexError, ValueError) as exc:
                raise ImproperlyConfigured(
                    f"{component}: the {option} template is invalid ({exc!r}); it may use "
                    f"{', '.join('{' + f + '}' for f in fields)}, and {{{{ }}}} for literal braces."
                ) from None

    async def ask(self, turn: TurnContext, **fields: Any) -> tuple[str, str]:
        """(the reply, "") or ("", why there is none) when the call failed."""
        messages = [{"role": "system", "content": self.instructions.format(**fields)},
                    {"role": "user", "content": self.prompt.format(**fields)}]
        started = time.perf_counter()
        try:
            response = await self.chat.complete(messages)
        except LLMError as exc:
            record_call(turn, self.component, None, started, error=exc.code)
            return "", f"the model call failed ({exc.code})"
        record_call(turn, self.component, response, started)
        return response.text, ""


def _noted(query: Query, note: str, **changes: Any) -> Query:
    return query.replace(metadata={**query.metadata, "transform_note": note}, **changes)


class LLMQueryTransformer(QueryTransformer):
    """Base of the transformers that ask a model for a new query text.

    Subclasses set the default templates, whether the history is needed
    (``needs_history``: skipped without it) and ``max_tokens``. Options: the model options,
    ``instructions``, ``prompt``, ``history_messages`` (6, the recent messages shown to the
    model), ``max_message_chars`` (600, each shortened to this).
    """

    enabled_by_default = False
    DEFAULT_INSTRUCTIONS = ""
    DEFAULT_PROMPT = ""
    FIELDS: tuple[str, ...] = ("question", "history")
    needs_history = True
    max_tokens = 100

    def __init__(self, profile, *, instructions: str | None = None, prompt: str | None = None,
                 history_messages: int = 6, max_message_chars: int = 600, **options: Any):
        chat = chat_model_from_options(profile, options, max_tokens=self.max_tokens)
        self.configure(options)
        super().__init__(profile, **options)
        self.history_messages = history_messages
        self.max_message_chars = max_message_chars
        self.connection = chat.connection
        self.model = PromptedModel(self.name, chat, instructions=instructions or self.DEFAULT_INSTRUCTIONS,
                                   prompt=prompt or self.DEFAULT_PROMPT, fields=self.FIELDS)

    def configure(self, options: dict[str, Any]) -> None:
        """Take subclass-specific options out of ``options`` (the rest are rejected)."""

    def fields(self, query: Query) -> dict[str, Any]:
        return {"question": query.text,
                "history": format_history(query.history, messages=self.history_messages,
                                          max_chars=self.max_message_chars)}

    def max_lines(self, query: Query) -> int:
        return 1

    async def transform(self, query, turn):
        if self.needs_history and not query.history:
            return _noted(query, "no history: skipped")
        reply, failure = await self.model.ask(turn, **self.fields(query))
        if failure:
            return _noted(query, f"kept the original query: {failure}")
        text, problem = check_reply(reply, max_lines=self.max_lines(query),
                                    max_chars=max(300, 4 * len(query.text)))
        if problem:
            return _noted(query, f"kept the original query: {problem}")
        return _noted(query, f"{self.name} by {self.model.chat.model}", text=text)


# One example of each follow-up rule: (earlier user message, latest message, search query).
# The same rules as the offline ``followup`` transformer (docs/followup.md); the names are
# invented so the examples never match a site's own documents.
REWRITE_EXAMPLES = (
    ("new subject, nothing else asked: keep the attribute",
     "How long is the warranty on the Atlas 5?", "And the Borealis 7?", "Borealis 7 warranty length"),
    ("new subject with its own question: drop the old subject",
     "How much does the Atlas 5 cost?", "What colours does the Borealis 7 come in?", "Borealis 7 colours"),
    ("pronoun with a new question: keep the subject",
     "How much does the Atlas 5 cost?", "And its warranty?", "Atlas 5 warranty"),
    ("a fresh start: carry nothing",
     "How much does the Atlas 5 cost?", "Thanks. Now, what is your return policy?", "return policy"),
)


def _rewrite_instructions() -> str:
    examples = "\n".join(
        f"- {rule}: after \"{earlier}\", the message \"{latest}\" becomes: {query}"
        for rule, earlier, latest, query in REWRITE_EXAMPLES
    )
    return (
        "You turn the user's latest message in a conversation into a standalone search query for a "
        "document search engine. Keep names, model numbers and other specific terms. Track two things "
        "separately: the subject (the product, policy or person the conversation is about) and the "
        "attribute last asked about it (price, warranty, battery life, colours...).\n"
        "- A message that names a new subject replaces the old subject; never add the old subject's name. "
        "If it asks nothing of its own (\"And the X?\", \"What about X?\", \"How about X?\", \"X?\", "
        "\"Same for X\"), it asks the last attribute about the new subject.\n"
        "- A message that asks a new attribute with a pronoun (\"it\", \"its\", \"they\") keeps the "
        "subject.\n"
        "- A message that starts afresh (\"Thanks. Now, ...\") carries nothing from before.\n"
        f"Examples:\n{examples}\n"
        "Reply with the search query only: one line, no explanation, no quotes."
    ).replace("{", "{{").replace("}", "}}")


class RewriteTransformer(LLMQueryTransformer):
    """Rewrites a follow-up into a standalone search query using the conversation.

    The default instructions state the follow-up rules of ``docs/followup.md`` (subject
    replaced / kept, attribute inherited / new, a fresh start carries nothing) with one example
    each (``REWRITE_EXAMPLES``).
    """

    name = "rewrite"
    order = 60
    DEFAULT_INSTRUCTIONS = _rewrite_instructions()
    DEFAULT_PROMPT = "Conversation:\n{history}\n\nLatest message: {question}\n\nSearch query:"


class CompressTransformer(LLMQueryTransformer):
    """Condenses the conversation and a follow-up into one standalone question."""

    name = "compress"
    order = 70
    max_tokens = 150
    DEFAULT_INSTRUCTIONS = (
        "You condense a conversation and the user's follow-up message into one standalone question "
        "that can be understood without the conversation. Keep the user's intent, names and specific "
        "terms. Reply with the question only, on one line."
    )
    DEFAULT_PROMPT = "Conversation:\n{history}\n\nFollow-up message: {question}\n\nStandalone question:"


class TranslateTransformer(LLMQueryTransformer):
    """Translates the query into the language of the document collection.

    Option ``language`` (required), e.g. ``"English"``. Runs after ``rewrite``/``compress``
    (``order``), so it translates their standalone query.
    """

    name = "translate"
    order = 90
    needs_history = False
    max_tokens = 300
    FIELDS = ("question", "history", "language")
    DEFAULT_INSTRUCTIONS = (
        "You translate search queries into {language}. Keep product names, model numbers, code and "
        "numbers unchanged. If the query is already in {language}, repeat it unchanged. Reply with the "
        "translation only."
    )
    DEFAULT_PROMPT = "Query: {question}\n\nTranslation:"

    def configure(self, options):
        language = options.pop("language", None)
        if not language or not isinstance(language, str):
            raise ImproperlyConfigured(
                'The translate transformer needs the option "language": the language of the documents, '
                'e.g. {"translate": {"language": "English"}}.'
            )
        self.language = language

    def fields(self, query):
        return {**super().fields(query), "language": self.language}

    def max_lines(self, query):
        return query.text.count("\n") + 1


class MultiQueryExpander(QueryExpander):
    """Asks the model for ``n`` (3) variants of the query, one per line.

    Tolerates numbering ("1.", "2)"), bullets, quotes, blank lines and an introducing line
    ("Here are the queries:"); drops refusals, copies of the query and duplicates; keeps at
    most ``n``. Options: the model options, ``n``,
    ``instructions`` and ``prompt`` (fields ``{question}``, ``{n}``).
    """

    name = "multi_query"
    enabled_by_default = False
    DEFAULT_INSTRUCTIONS = (
        "You help a document search engine find more relevant passages. Write {n} different search "
        "queries for the user's question: rephrase it, use synonyms, or ask about one aspect of it. "
        "Write one query per line, with no numbering and no explanation."
    )
    DEFAULT_PROMPT = "Question: {question}\n\nSearch queries:"

    def __init__(self, profile, *, n: int = 3, instructions: str | None = None, prompt: str | None = None,
                 **options: Any):
        if not isinstance(n, int) or n < 1:
            raise ImproperlyConfigured(f"multi_query option 'n' must be a positive integer, not {n!r}.")
        chat = chat_model_from_options(profile, options, max_tokens=60 * n)
        super().__init__(profile, **options)
        self.n = n
        self.connection = chat.connection
        self.model = PromptedModel(self.name, chat, instructions=instructions or self.DEFAULT_INSTRUCTIONS,
                                   prompt=prompt or self.DEFAULT_PROMPT, fields=("question", "n"))

    def variants(self, reply: str, query: Query) -> list[str]:
        """The usable variants in ``reply``, at most ``n``, without copies of ``query``."""
        seen = {query.text.casefold().strip()}
        found = []
        for line in reply.splitlines():
            text = clean_reply(_LIST_MARKER_RE.sub("", line))
            key = text.casefold()
            # A line ending in ":" introduces the list ("Here are three queries:").
            if (not text or text.endswith(":") or key in seen or is_refusal(text)
                    or len(text) > max(300, 4 * len(query.text))):
                continue
            seen.add(key)
            found.append(text)
        return found[: self.n]

    def _note(self, turn: TurnContext, note: str) -> None:
        turn.trace["queries"].setdefault("expansion_notes", []).append({"by": self.name, "note": note})

    async def expand(self, query, turn):
        reply, failure = await self.model.ask(turn, question=query.text, n=self.n)
        if failure:
            self._note(turn, f"kept only the original query: {failure}")
            return []
        texts = self.variants(reply, query)
        if not texts:
            self._note(turn, f"kept only the original query: no usable variant in the reply ({reply[:80]!r})")
            return []
        self._note(turn, f"{len(texts)} variant(s) by {self.model.chat.model}")
        return [Query(text=t, original=query.original, history=query.history, metadata=dict(query.metadata))
                for t in texts]


@hookimpl
def register_query_transformers(register):
    register(RewriteTransformer)
    register(CompressTransformer)
    register(TranslateTransformer)


@hookimpl
def register_query_expanders(register):
    register(MultiQueryExpander)
