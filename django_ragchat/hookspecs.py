"""Every hook a django-ragchat plugin can implement.

A plugin is a module (or object) with functions decorated by ``django_ragchat.hookimpl`` and
named after one of the specs below. Load it in one of three ways:

* install a distribution that declares it in the ``django_ragchat`` entry point group::

      [project.entry-points.django_ragchat]
      my_plugin = "my_package.ragchat_plugin"

* list its dotted path in ``RAGCHAT["PLUGINS"]``;
* or be one of the built-in modules in ``django_ragchat.plugins.DEFAULT_PLUGINS``, which use
  exactly these hooks: there is no private path for the built-in components.

Two families of hooks:

**Registration hooks** (``register_*``) are called once when the plugin manager is built. They
receive a ``register`` callable; call ``register(ComponentClass)`` for each component you
provide. The class must subclass the base of its stage (``QueryTransformer``, ``Retriever``...
from the stage's module) and set ``name``; ``order`` (default 100, lower runs first, ties in
registration order) places it among the other components of that stage. A profile then selects
components by name (``django_ragchat.profiles``). Component methods may be ``async def`` or
plain functions, and may return a value or an awaitable.

**Lifecycle hooks** (``on_*``) are called during every turn for observability (logging,
metrics, tracing), through pluggy's hook caller: ``@hookimpl(wrapper=True)`` (code before the
``yield``, the other implementations' results from it, code after) and ``tryfirst``/
``trylast`` work as in pluggy. They may be ``async def``: what they return is awaited after the
hook call, so a wrapper's code after its ``yield`` runs before the ``async`` implementations'
bodies. An exception raised in one is logged and never breaks the turn.

A wrapper (``wrapper=True`` or ``hookwrapper=True``) on a registration hook could wrap nothing
(each implementation is called on its own, to know which plugin registered what): it is the
system check error ``ragchat.E008``.

To wrap a part of the turn itself (change the prompt, short-circuit with a cached answer,
transform the stream), register an ``Advisor`` (``register_advisors``).

A hook implementation whose name matches no spec here is reported by the system check
``ragchat.E005`` (a misspelt hook would otherwise do nothing, silently).
"""

from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("django_ragchat")


# --- Registration hooks, one per pipeline stage, in the order the turn runs them -------------


@hookspec
def register_memory_strategies(register):
    """Register ``django_ragchat.stages.memory.MemoryStrategy`` subclasses.

    A memory strategy chooses which earlier messages of the conversation the model sees, within
    a token budget. Built in: ``message_window``, ``token_window``, ``summary`` (rolling
    summary, ``django_ragchat.stages.summary_memory``).
    """


@hookspec
def register_guardrails(register):
    """Register ``django_ragchat.stages.guardrails.Guardrail`` subclasses.

    A guardrail checks the user's input before retrieval (``check_input``) and the answer before
    it is saved (``check_output``); returning a ``Refusal`` ends the turn, an input guardrail may
    return a ``Redaction`` (or a ``Refusal`` with ``redacted``) to have the turn keep a redacted
    text in place of the user's message, and an output guardrail may return a ``Reprompt`` to
    have the model answer again with its feedback (at most ``max_reprompts`` times). Built in: ``blocked_phrases`` (configurable phrases),
    ``require_citation`` (off by default). Malformed input (empty, oversized, NUL bytes)
    never reaches a guardrail: the pipeline rejects it before anything is saved.
    """


@hookspec
def register_query_transformers(register):
    """Register ``django_ragchat.stages.transformers.QueryTransformer`` subclasses.

    A transformer returns a new ``Query`` (rewritten, compressed, translated, enriched with the
    history), ``SkipRetrieval`` or an ``EndTurn``. All enabled transformers run in order, each
    seeing the previous one's output. Built in: ``followup`` (offline history-aware
    enrichment); ``rewrite``, ``compress``, ``translate`` (LLM, off by default,
    ``django_ragchat.stages.llm_transformers``).
    """


@hookspec
def register_query_expanders(register):
    """Register ``django_ragchat.stages.expanders.QueryExpander`` subclasses.

    An expander turns one query into several (the original plus variants); every (query,
    retriever) pair is then retrieved concurrently. Built in: ``multi_query`` (LLM, off by
    default).
    """


@hookspec
def register_retrievers(register):
    """Register ``django_ragchat.stages.retrievers.Retriever`` subclasses.

    A retriever returns ``RetrievedChunk`` objects for a query, best first. Built in: ``vector``;
    ``fulltext`` and ``hybrid`` (off by default; PostgreSQL full text or SQLite FTS5).
    """


@hookspec
def register_joiners(register):
    """Register ``django_ragchat.stages.joiners.Joiner`` subclasses.

    The profile's one joiner merges the result lists of all (query, retriever) pairs into one
    list, without duplicate chunks. Built in: ``rrf`` (reciprocal rank fusion), ``concat``.
    """


@hookspec
def register_document_postprocessors(register):
    """Register ``django_ragchat.stages.postprocessors.DocumentPostProcessor`` subclasses.

    Post-processors filter, re-rank or cut the joined list, in order. Built in:
    ``similarity_threshold``, ``top_k``.
    """


@hookspec
def register_prompt_augmenters(register):
    """Register ``django_ragchat.stages.prompts.PromptAugmenter`` subclasses.

    The profile's one prompt augmenter builds the ``Prompt`` from the system prompt, the
    history and the documents, within the token budget, and applies the no-context policy.
    Built in: ``context``.
    """


@hookspec
def register_llm_backends(register):
    """Register ``django_ragchat.stages.llms.LLMBackend`` subclasses.

    A backend answers a ``Prompt`` whole (``complete``) or as an async stream of ``LLMDelta``
    (``stream``). Built in: ``extractive`` (offline, no model), ``openai`` (any OpenAI-compatible server).
    """


@hookspec
def register_embedders(register):
    """Register ``django_ragchat.stages.embedders.Embedder`` subclasses.

    An embedder turns texts into vectors of one embedding *space* (model and dimension). Built
    in: ``wordllama`` (a static semantic model shipped in its wheel, no network; the default
    with the ``semantic`` extra), ``hashing`` (offline feature hashing), ``openai``. One that
    sets ``local_semantic`` is read with by the components that set ``uses_embedder``.
    """


@hookspec
def register_response_augmenters(register):
    """Register ``django_ragchat.stages.responses.ResponseAugmenter`` subclasses.

    Response augmenters see the answer after the LLM: ``augment`` for a whole answer,
    ``on_delta`` for each streamed piece (it must not block), ``finish`` after the model's last
    piece (text it returns is streamed as more deltas: a footer, a sources line),
    ``on_complete`` when a stream ends. Built in: ``citations`` (the answer builder,
    ``django_ragchat.stages.answers.build_answer``: references, answer extraction, XML tags) and
    ``sources_filter`` (off unless listed: keeps the sources similar to the answer).
    """


@hookspec
def register_advisors(register):
    """Register ``django_ragchat.turn.advisors.Advisor`` subclasses.

    An advisor is around-advice: ``around_turn(turn, call_next)`` wraps everything after the
    user's message is saved (it may short-circuit with its own answer),
    ``around_llm(prompt, turn, call_next)`` the whole-answer model call and
    ``around_llm_stream(prompt, turn, call_next)`` the streamed one (an async iterator in, an
    async iterator out: it may transform pieces, hold them back and add more after the last);
    in a turn that calls tools, each of the model's calls goes through them.
    ``around_tool(call, turn, call_next)`` wraps one tool call: change its arguments
    (``call.with_arguments({...})``), change the ``ToolResult`` ``await call_next(call)`` returns,
    or return a result of its own without calling the tool (a cached lookup, a refusal).
    The first in ``order`` is the outermost. None built in.
    """


@hookspec
def register_sources(register):
    """Register ``django_ragchat.sources.ModelSource`` subclasses: the site's own models as
    knowledge (docs/sources.md).

    A source names a model, what of it is indexed (``get_queryset``), the text of each object
    (``text`` or ``template_name``), its title, URL, metadata and who may read it (``access``).
    Sources are kept in sync live (signals, after the transaction commits, through the tasks
    framework) and by ``manage.py ragchat_sync``. Each source's ``name`` must be unique. None
    built in.
    """


@hookspec
def register_tools(register):
    """Register tools: functions of the site the assistant may call (docs/tools.md).

    Call ``register(function_or_tool)`` for each; a plain function is made a tool as ``@tool``
    would (``django_ragchat.tools.tool``), and ``register(tool, name="other_name")`` renames it.
    A profile offers tools by name (``"tools": ["order_status"]``); a tool runs as the asking
    user (``turn.user``), only if its ``permission`` lets them, and after their approval when
    it ``requires_confirmation``. Its schema is built when it is registered: a function that
    cannot be described to the model is reported by the system check ragchat.E004. Built in:
    ``search_documents``, offered by profiles with ``"retrieval": "tool"``, which is not
    registered here.
    """


# --- Lifecycle hooks -------------------------------------------------------------------------


@hookspec
def on_turn_started(turn):
    """A turn began: the user's message is saved (``turn.user_message``)."""


@hookspec
def on_stage_completed(turn, stage, elapsed_ms):
    """A pipeline stage finished. ``stage`` is its name, as in the trace's ``timings``.
    ``llm``'s ``elapsed_ms`` includes its tool calls and the user's wait for approving them
    (``turn.trace.get("approval_wait_ms")``)."""


@hookspec
def on_turn_completed(turn, message):
    """The assistant ``message`` is saved with its sources and trace (any status but error)."""


@hookspec
def on_turn_failed(turn, error):
    """The turn failed with ``error`` (an exception); the partial answer is saved as error."""
