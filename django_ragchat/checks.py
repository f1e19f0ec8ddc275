"""System checks: misconfiguration is reported by ``manage.py check`` (and at startup), with
a hint that says how to fix it, never by a traceback on the first request.

ragchat.E001  unknown key in RAGCHAT (a typo)
ragchat.E002  invalid profile (unknown option, unknown component or tool, bad value)
ragchat.E003  DEFAULT_PROFILE is not a defined profile
ragchat.E004  a plugin could not be loaded or failed while registering components or tools
ragchat.E005  a hook implementation matches no hook spec (misspelt hook name)
ragchat.E006  a dotted path in settings cannot be imported
ragchat.E007  a setting has a value of the wrong type or range
ragchat.E008  a wrapper (``wrapper=True``/``hookwrapper=True``) on a registration hook
ragchat.W020  a profile uses api.openai.com but the API key's environment variable is not set
ragchat.W030  an ASGI site without a channel layer: sockets work alone (no live second tab,
              no cancel from another tab or worker)
ragchat.W031  settings.LOGIN_URL does not resolve: the chat page would send visitors to a 404
ragchat.W032  the channel layer or the default cache is per process while several worker
              processes are configured (WEB_CONCURRENCY), or, with ``--deploy``, at all: events,
              cancels, logouts and per-user limits would not reach across workers
ragchat.W033  (``--deploy``) USER_RETENTION_DAYS is None: signed-in users' chat data is kept forever
ragchat.W034  several worker processes (WEB_CONCURRENCY) on a SQLite default database: every turn's
              writes wait for one file's lock, so a second worker adds little (bench/README.md)
ragchat.W011  an embedding space with chunks has no valid HNSW index (PostgreSQL); run by plain
              ``check`` too (one query; skipped quietly when the database cannot be reached). Small
              writes build it themselves while the space is small (``postgres.index_when_committed``)
ragchat.W041  a profile offers tools to an LLM backend that calls none (the extractive answerer)
ragchat.W043  a profile's options name no component of the profile (a misspelt name is ignored)
ragchat.W042  a profile that names no embedder gets the word-hashing fallback because the
              semantic extra (the wordllama package) is not installed
ragchat.W040  a component warns about its configuration (``check_warnings()``), e.g. the sources
              filter with an embedder whose similarities never reach its threshold

Model sources (``register_sources``, docs/sources.md); a source with an error is not synced:

ragchat.E050  a class registered in register_sources is not a ModelSource subclass
ragchat.E051  a source's name is missing, malformed or taken by another source
ragchat.E052  a source's model is not an installed model
ragchat.E053  a source has no text: neither text() nor template_name
ragchat.E054  a source's template_name does not exist
ragchat.E055  a depends_on entry names no model, or no relation leading to the source's model
ragchat.E056  a source's updated_field is not a date or date-time field of its model
ragchat.E057  a source names a profile that does not exist
ragchat.W050  a source has objects but nothing indexed yet: run ``ragchat_sync`` (two cheap queries
              a source; nothing when the database cannot be reached). ``ragchat_plugins`` lists
              the sources.

Database checks (run by ``migrate`` and ``check --database default``):

ragchat.E010  PostgreSQL without the pgvector extension available (or older than 0.8)
ragchat.W012  the full-text index is missing (SQLite: its triggers were dropped) or unavailable
"""

from __future__ import annotations

import difflib
import os
from typing import Any

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections
from django.shortcuts import resolve_url
from django.urls import NoReverseMatch, Resolver404, resolve
from django.utils.module_loading import import_string

from django_ragchat import plugins
from django_ragchat.answerer.vocabulary import Vocabulary
from django_ragchat.backends.openai import OpenAIConnection
from django_ragchat.conf import DEFAULTS, ragchat_settings
from django_ragchat.models import Chunk, Document
from django_ragchat.profiles import (
    CHOICE_STAGES,
    LIST_STAGES,
    InvalidProfile,
    build_profile,
    default_embedder,
    did_you_mean,
    draft_profile,
)
from django_ragchat.search import configured_text_configs, postgres, sqlite
from django_ragchat.search.postgres import MIN_PGVECTOR_VERSION, parse_version
from django_ragchat.sources import registry as source_registry
from django_ragchat.turn.context import components_for


@register(Tags.compatibility)
def check_settings(app_configs=None, **kwargs):
    """E001 for each unknown key, E007 for each value of the wrong type or range (every one at
    once, from ``conf.KINDS``, and a lease shorter than two heartbeats), E006 for each dotted
    path of a permission that does not import."""
    errors = []
    for key in ragchat_settings.unknown_keys():
        errors.append(Error(
            f"Unknown django-ragchat setting RAGCHAT[{key!r}]{did_you_mean([key], sorted(DEFAULTS))}.",
            hint=f"Valid keys: {', '.join(sorted(DEFAULTS))}.", id="ragchat.E001",
        ))
    problems = ragchat_settings.problems()
    errors += [Error(f"{problem}.", hint=f"Remove it to use the default, {DEFAULTS[problem.name]!r}.",
                     id="ragchat.E007") for problem in problems]
    wrong = {problem.name for problem in problems}
    return errors + _lease_errors(wrong) + _permission_import_errors(wrong)


def _lease_errors(wrong: set[str]) -> list[Error]:
    """E007 for a lease shorter than two heartbeats, when both are numbers of seconds (a value
    not in ``wrong``)."""
    if wrong & {"STREAM_HEARTBEAT_SECONDS", "STREAM_LEASE_SECONDS"}:
        return []
    if ragchat_settings.STREAM_LEASE_SECONDS >= 2 * ragchat_settings.STREAM_HEARTBEAT_SECONDS:
        return []
    return [Error("RAGCHAT['STREAM_LEASE_SECONDS'] must be at least twice STREAM_HEARTBEAT_SECONDS.",
                  hint="Otherwise a live answer whose heartbeat is a little late is taken for a dead one.",
                  id="ragchat.E007")]


#: The permission settings, each with the signature of the callable it names.
PERMISSION_SIGNATURES = {
    "CONVERSATION_PERMISSION": "(user, conversation, session_key)",
    "CONVERSATION_CHANGE_PERMISSION": "(user, conversation, session_key)",
    "DOCUMENT_PERMISSION": "(user)",
    "PROFILE_PERMISSION": "(user, profile_name)",
}


def _permission_import_errors(wrong: set[str]) -> list[Error]:
    """E006 for each permission path that does not import (one that is no string is in ``wrong``)."""
    errors = []
    for key, signature in PERMISSION_SIGNATURES.items():
        if key in wrong:
            continue
        try:
            import_string(getattr(ragchat_settings, key))
        except ImportError as exc:
            errors.append(Error(f"RAGCHAT[{key!r}] cannot be imported: {exc}",
                                hint=f"Give the dotted path of a callable{signature} -> bool.",
                                id="ragchat.E006"))
    return errors


@register(Tags.compatibility)
def check_plugins(app_configs=None, **kwargs):
    errors = []
    registry = plugins.get_registry()
    for message in registry.errors:
        plugin = getattr(message, "plugin", None)  # a components.PluginProblem
        hint = plugins.plugin_origin(plugin).remedy if plugin else (
            "Fix or uninstall the plugin, or remove it from RAGCHAT['PLUGINS'].")
        errors.append(Error(message, hint=hint, id="ragchat.E004"))
    return errors + _unknown_hook_errors(plugins.get_plugin_manager())


def _unknown_hook_errors(pm) -> list[Error]:
    """E005 for every hook implementation that matches no hook spec (pluggy's ``check_pending``
    stops at the first), naming the plugin as it was loaded and the hooks its name is close to."""
    specs = sorted(name for name in vars(pm.hook) if not name.startswith("_") and getattr(pm.hook, name).has_spec())
    errors = []
    for name in sorted(vars(pm.hook)):
        caller = getattr(pm.hook, name)
        if name.startswith("_") or caller.has_spec():
            continue
        for impl in caller.get_hookimpls():
            if impl.optionalhook:
                continue
            close = difflib.get_close_matches(name, specs, n=3, cutoff=0.8)
            guess = f"Did you mean {_either(close)}? " if close else ""
            errors.append(Error(
                f"Plugin {impl.plugin_name!r} implements a hook that does not exist: {name!r} (a misspelt hook is "
                f"never called).",
                hint=f"{guess}The plugin is {plugins.plugin_origin(impl.plugin_name).where}; compare the function's "
                     f"name with django_ragchat.hookspecs.",
                id="ragchat.E005",
            ))
    return errors


def _either(names: list[str]) -> str:
    """``'a'``, ``'a' or 'b'``, ``'a', 'b' or 'c'``."""
    quoted = [repr(name) for name in names]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


@register(Tags.compatibility)
def check_registration_wrappers(app_configs=None, **kwargs):
    """A wrapper on a ``register_*`` hook would wrap nothing: each implementation is called on
    its own (to know which plugin registered what), so its code would never run."""

    pm = plugins.get_plugin_manager()
    errors = []
    for hook_name in (*plugins.REGISTRATION_HOOKS, plugins.SOURCES_HOOK, plugins.TOOL_HOOK):
        for impl in getattr(pm.hook, hook_name).get_hookimpls():
            if impl.wrapper or impl.hookwrapper:
                option = "wrapper" if impl.wrapper else "hookwrapper"
                errors.append(Error(
                    f"Plugin {impl.plugin_name!r} implements {hook_name} with {option}=True; a registration "
                    f"hook cannot be wrapped, so it never runs.",
                    hint="Drop the wrapper option and call register(...) directly; to wrap part of a turn, "
                         "register an Advisor (register_advisors), or use wrapper=True on an on_* hook.",
                    id="ragchat.E008",
                ))
    return errors


PROFILE_HINT = "See docs/profiles.md for the options."


def _profile_error(name: str, problem: str, hint: str = PROFILE_HINT) -> Error:
    return Error(f"Profile {name!r}: {problem}", hint=hint, id="ragchat.E002")


def _well_formed_names(profile) -> list[tuple[str, str, str]]:
    """``(field, kind, name)`` of every component ``profile`` names, from the fields whose value
    has the right shape (a wrong shape is its own E002, from ``profiles.profile_problems``)."""
    named = [(field, kind, getattr(profile, field)) for field, kind in CHOICE_STAGES.items()
             if isinstance(getattr(profile, field), str)]
    for field, kind in LIST_STAGES.items():
        value = getattr(profile, field)
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            named += [(field, kind, component) for component in value]
    return named


def _name_problems(profile, registry) -> tuple[list[str], list[str]]:
    """(components ``profile`` names that no plugin registered, tools it names that none did)."""
    components = []
    for field, kind, component in _well_formed_names(profile):
        try:
            registry.get(kind, component)
        except ImproperlyConfigured as exc:
            components.append(f"{field}: {exc}")
    tools, missing = plugins.get_tools(), []
    names = profile.tools if isinstance(profile.tools, (list, tuple)) else ()
    for tool_name in names:
        if isinstance(tool_name, str) and tools.get(tool_name) is None:
            known = ", ".join(tools.names()) or "none"
            close = difflib.get_close_matches(tool_name, tools.names(), n=3)
            guess = f" Did you mean {_either(close)}?" if close else ""
            missing.append(f"tools: no tool named {tool_name!r} is registered (registered: {known}).{guess} Is the "
                           f"plugin that provides it listed in RAGCHAT['PLUGINS'], or installed with an entry point "
                           f"of the django_ragchat group?")
    return components, missing


BUILD_ERRORS = (ImproperlyConfigured, TypeError, ValueError)


def _build_each(profile, registry) -> tuple[list, list[tuple[str, str]]]:
    """(the components of ``profile`` that build from the profile's options, ``(problem, hint)``
    of each that does not: every one, not only the first, each hint saying where its plugin came
    from). One that needs the vocabulary or the embedder is not built when that failed."""
    built, problems, vocabulary, embedder = [], [], None, None
    try:
        vocabulary = Vocabulary.for_profile(profile)
    except BUILD_ERRORS as exc:
        problems.append((f"building its components failed: {exc}", PROFILE_HINT))
    for field in ("embedder", *(f for f in plugins.PIPELINE_ORDER if f != "embedder")):  # the others may use it
        value = getattr(profile, field)
        for registration in registry.ordered(plugins.STAGE_KINDS[field], [value] if field in CHOICE_STAGES else value):
            cls = registration.cls
            if (cls.uses_vocabulary and vocabulary is None) or (cls.uses_embedder and embedder is None):
                continue  # a follow-on of the problem already reported
            try:
                component = plugins.build_component(profile, registration.kind, registration.name,
                                                    vocabulary=vocabulary, embedder=embedder)
            except BUILD_ERRORS as exc:
                problems.append((f"building its components failed: {exc}", _component_hint(registration)))
                continue
            built.append(component)
            if field == "embedder":
                embedder = component
    return built, problems


def _component_hint(registration) -> str:
    origin = plugins.plugin_origin(registration.plugin)
    if origin.kind == "built-in":
        return PROFILE_HINT
    return (f"The {registration.kind} {registration.name!r} is registered by the plugin {registration.plugin!r}, "
            f"from {origin.where}: see its documentation for the options it takes (docs/profiles.md for the "
            f"profile's own).")


def _check_profile(name: str, config: Any, registry) -> list[Error]:
    """Every independent problem of one profile: its values, the components and tools it names
    and, when those are all sound, each component that fails to build."""
    if not isinstance(config, (dict, type(None))):
        return [_profile_error(name, f"its options must be a dict, not {config!r}")]
    config = config or {}
    try:
        profile, problems = build_profile(name, config), []
    except InvalidProfile as exc:
        profile, problems = None, list(exc.problems)
    # What it names is looked up even when a value is wrong: a misspelt retriever and a top_k of
    # 0 are two mistakes, fixed in one go.
    unknown_components, unknown_tools = _name_problems(draft_profile(name, config), registry)
    errors = [_profile_error(name, problem) for problem in problems + unknown_components + unknown_tools]
    if profile is not None and not unknown_components:
        # Build the components once: options they do not accept fail here, not at the first turn.
        build = _build_each(profile, registry)[1]
        errors += [_profile_error(name, problem, hint) for problem, hint in build]
        if not build:
            try:
                components_for(profile)
            except BUILD_ERRORS as exc:
                errors.append(_profile_error(name, f"building its components failed: {exc}"))
    return errors


@register(Tags.compatibility)
def check_profiles(app_configs=None, **kwargs):
    profiles = ragchat_settings.PROFILES
    if not isinstance(profiles, dict) or not profiles:
        return [Error("RAGCHAT['PROFILES'] must be a non-empty dict of profile name -> options.",
                      hint='For example {"default": {}}.', id="ragchat.E002")]
    errors = []
    default = ragchat_settings.DEFAULT_PROFILE
    if isinstance(default, str) and default not in profiles:  # one that is no string is E007's
        errors.append(Error(
            f"RAGCHAT['DEFAULT_PROFILE'] is {default!r}, which is not in RAGCHAT['PROFILES'].",
            hint=f"Use one of {sorted(profiles)} or define it.", id="ragchat.E003",
        ))
    registry = plugins.get_registry()
    for name, config in profiles.items():
        errors += _check_profile(name, config, registry)
    return errors


def _built_profiles():
    """``(name, the component instances that build)`` of each profile whose values are valid
    and whose components are all registered: a component that fails to build (ragchat.E002)
    leaves the others' warnings to be said."""

    profiles = ragchat_settings.PROFILES if isinstance(ragchat_settings.PROFILES, dict) else {}
    registry = plugins.get_registry()
    for name, config in profiles.items():
        try:
            built, _ = _build_each(build_profile(name, config or {}), registry)
        except Exception:  # noqa: BLE001 - reported by check_profiles
            continue
        yield name, built


def _drafted_profiles():
    """``(name, draft profile, the names of the components it runs by field)`` of each profile
    whose components are known, built or not: its values may be wrong (ragchat.E002, reported
    beside what is said from these), but it names only registered components, in well-formed
    lists. A profile that names an unknown one is left out: what it runs is not known yet."""
    profiles = ragchat_settings.PROFILES if isinstance(ragchat_settings.PROFILES, dict) else {}
    registry = plugins.get_registry()
    for name, config in profiles.items():
        if not isinstance(config, (dict, type(None))):
            continue
        profile = draft_profile(name, config or {})
        try:
            runs = plugins.profile_components(profile, registry)
        except (ImproperlyConfigured, TypeError):  # an unknown name or a wrong shape: ragchat.E002
            continue
        yield name, profile, runs


#: Options that are no component's own: the OpenAI server and model every helper inherits.
SHARED_OPTIONS = ("openai",)


@register(Tags.compatibility)
def check_option_names(app_configs=None, **kwargs):
    """W043: ``options`` keys that name no component of the profile: a misspelt name
    (``"banned_wrds"``) was ignored without a word, and the component ran with its defaults.
    Said also of a profile with a wrong value (its E002 is another mistake)."""
    warnings = []
    for name, profile, runs in _drafted_profiles():
        options = profile.options if isinstance(profile.options, dict) else {}
        used = sorted({component for names in runs.values() for component in names})
        for key in sorted(k for k in options if isinstance(k, str) and k not in used and k not in SHARED_OPTIONS):
            close = difflib.get_close_matches(key, used, n=3)
            guess = f"Did you mean {_either(close)}? " if close else ""
            warnings.append(Warning(
                f"Profile {name!r}: options[{key!r}] names no component of this profile, so nothing reads it.",
                hint=f"{guess}Its components: {', '.join(used)}. A misspelt name, or a component to add to the "
                     f"profile (docs/profiles.md).", id="ragchat.W043"))
    return warnings


@register(Tags.compatibility)
def check_tool_models(app_configs=None, **kwargs):
    """W041: a profile offers tools (or retrieval as a tool) to a model that calls none. Said of
    a profile whose components are known, built or not (its LLM class says whether it calls tools)."""
    warnings = []
    registry = plugins.get_registry()
    for name, profile, runs in _drafted_profiles():
        tools = profile.tools if isinstance(profile.tools, (list, tuple)) else []
        offers = bool(tools) or profile.retrieval == "tool"
        llm = registry.get("llm", runs["llm"][0]).cls
        if offers and not getattr(llm, "calls_tools", True):
            offered = ", ".join([*map(str, tools), *(["retrieval as a tool"] if profile.retrieval == "tool" else [])])
            warnings.append(Warning(
                f"Profile {name!r} offers tools ({offered}), but its LLM backend {profile.llm!r} calls none: they "
                f"are never offered, and retrieval runs before every answer.",
                hint="Use a model that calls tools (\"llm\": \"openai\"), or remove them from the profile.",
                id="ragchat.W041",
            ))
    return warnings


@register(Tags.compatibility)
def check_openai_keys(app_configs=None, **kwargs):
    """A Warning, not an Error: the key may be set only where the site runs (not in CI or a
    build step), and every turn would fail with a clear "model unavailable" anyway."""

    warnings = []
    for name, found in _built_profiles():
        connections = {c.connection for c in found if isinstance(getattr(c, "connection", None), OpenAIConnection)}
        for connection in sorted(connections, key=repr):
            if connection.api_key() is None:
                warnings.append(Warning(
                    f"Profile {name!r} calls api.openai.com, but the environment variable "
                    f"{connection.api_key_env} holding the API key is not set: every turn will fail.",
                    hint="Set it where the site runs, or give the profile a base_url (a local server needs no key).",
                    id="ragchat.W020",
                ))
    return warnings


@register(Tags.compatibility)
def check_semantic_embedder(app_configs=None, **kwargs):
    """W042: a profile that names no embedder, on an install without the semantic extra, gets
    the ``hashing`` fallback (words, not meaning), which the site may not have meant."""
    if default_embedder() != "hashing":
        return []
    profiles = ragchat_settings.PROFILES if isinstance(ragchat_settings.PROFILES, dict) else {}
    unnamed = sorted(name for name, config in profiles.items() if "embedder" not in (config or {}))
    if not unnamed:
        return []
    return [Warning(
        f"Profile(s) {unnamed} name no embedder and the semantic extra is not installed, so they embed with "
        f"'hashing' (shared words, not meaning).",
        hint='pip install "django-ragchat[semantic]" (then manage.py ragchat_reembed), or set "embedder": "hashing" '
             "in the profile to keep the fallback and silence this warning.",
        id="ragchat.W042")]


@register(Tags.compatibility)
def check_channel_layer(app_configs=None, **kwargs):
    """W030: an ASGI site (``ASGI_APPLICATION`` set) with no default channel layer."""
    if not getattr(settings, "ASGI_APPLICATION", None):
        return []  # WSGI only: no websocket, no layer needed
    layers = getattr(settings, "CHANNEL_LAYERS", None) or {}
    if "default" in layers:
        return []
    return [Warning(
        "This ASGI site has no channel layer (CHANNEL_LAYERS['default']): each chat websocket works on its own. "
        "Off without one: a second tab or another worker watching an answer live, and stopping an answer "
        "from a socket other than the one that asked.",
        hint="For one process: CHANNEL_LAYERS = {'default': {'BACKEND': 'channels.layers.InMemoryChannelLayer'}}; "
             "for several workers, the Redis layer of docs/deployment.md.",
        id="ragchat.W030",
    )]


@register(Tags.urls)
def check_login_url(app_configs=None, **kwargs):
    """W031: the chat page sends anonymous visitors to ``settings.LOGIN_URL``; it must resolve."""

    if ragchat_settings.ALLOW_ANONYMOUS:
        return []  # the page never redirects
    login_url = settings.LOGIN_URL
    try:
        try:
            url = str(resolve_url(login_url))  # a URL name, a path or an absolute URL
        except NoReverseMatch:
            url = None
        if url is not None:
            if "://" in url or url.startswith("//"):
                return []  # another site (single sign-on): not ours to resolve
            try:
                resolve(url.split("?", 1)[0])
                return []
            except Resolver404:
                pass
    except Exception:  # a URLconf that does not import: Django's own URL checks report it
        return []
    return [Warning(
        f"settings.LOGIN_URL is {login_url!r}, which this site's URLs do not resolve: the chat page sends "
        "visitors who are not signed in there, to a 404.",
        hint="Point LOGIN_URL at your sign-in page, or at the chat's own: LOGIN_URL = 'ragchat:login' (any user "
             "of the site; the admin's sign-in page refuses all but staff), or set RAGCHAT['ALLOW_ANONYMOUS'] = True.",
        id="ragchat.W031",
    )]


@register(Tags.compatibility)
def check_vector_indexes(app_configs=None, databases=None, **kwargs):
    """W011 on every ``check`` (not only ``check --database``): one query per PostgreSQL
    database; an unreachable or unmigrated database is left to whatever needs it first."""

    warnings = []
    for alias in databases if databases is not None else list(connections):
        connection = connections[alias]
        if connection.vendor != "postgresql":
            continue
        try:
            if Chunk._meta.db_table not in connection.introspection.table_names():
                continue
            warnings += _postgres_index_checks(alias)
        except Exception:  # unreachable, no pgvector (E010), or no database access (a test)
            continue
    return warnings


@register(Tags.database)
def check_search_indexes(app_configs=None, databases=None, **kwargs):
    errors = []
    for alias in databases or ():
        connection = connections[alias]
        if connection.vendor not in ("postgresql", "sqlite"):
            continue
        try:
            migrated = Chunk._meta.db_table in connection.introspection.table_names()
            if connection.vendor == "postgresql":
                errors += _postgres_search_checks(alias)
            elif migrated:
                errors += _sqlite_search_checks(alias)
        except DatabaseError:
            continue  # an unreachable database is reported by whatever needs it first
    return errors


def pgvector_problem(available: str | None) -> str:
    """Why pgvector version ``available`` (None: not installed on the server) will not do, or ""."""

    minimum = ".".join(map(str, MIN_PGVECTOR_VERSION))
    if available is None:
        return "PostgreSQL has no pgvector extension available; django-ragchat stores embeddings with it."
    if parse_version(available) < MIN_PGVECTOR_VERSION:
        return f"PostgreSQL's pgvector is version {available}; django-ragchat needs {minimum} or later."
    return ""


def _postgres_search_checks(alias: str) -> list:
    available, _ = postgres.pgvector_versions(alias)
    problem = pgvector_problem(available)
    if problem:
        return [Error(problem, hint="Install it on the database server with scripts/install-pgvector.sh (in the "
                                    "django-ragchat repository; it builds pgvector 0.8 for the local PostgreSQL) "
                                    "or your platform's pgvector package, then run migrate.", id="ragchat.E010")]
    return []


def _postgres_index_checks(alias: str) -> list:
    warnings = []
    for space, count in postgres.spaces(alias).items():
        status = postgres.hnsw_index_status(space, using=alias)
        if status.state in ("missing", "invalid", "mismatch"):
            warnings.append(Warning(
                f"Embedding space {space!r} has {count:,} chunks but its HNSW index is {status.state}: "
                f"its vector searches scan every chunk of the space.",
                hint="`manage.py ragchat_ingest` and `ragchat_sync` build it at the end of a load (this warning, "
                     "printed as they start, is then answered), live sync and uploads after their commit while the "
                     f"space has at most {postgres.AUTO_INDEX_MAX_CHUNKS:,} chunks. For a larger space (grown by "
                     "live sync before django-ragchat built the index itself, or written by your own code) run "
                     "`python manage.py ragchat_index` once, e.g. at deploy (building once is faster than growing "
                     "the index).",
                id="ragchat.W011",
            ))
    return warnings


def _sqlite_search_checks(alias: str) -> list:
    state = sqlite.fulltext_state(alias)
    if state == "missing":
        return [Warning("The full-text index of the chunks (FTS5 table and triggers) is missing or incomplete; "
                        "full-text and hybrid search fail or miss new chunks.",
                        hint="Run `python manage.py ragchat_index` to create it and fill it from the chunks.",
                        id="ragchat.W012")]
    if state == "unavailable" and configured_text_configs():
        return [Warning("A profile uses full-text or hybrid retrieval, but this SQLite was built without FTS5.",
                        hint="Use a Python whose sqlite3 has FTS5 (most do), or PostgreSQL.", id="ragchat.W012")]
    return []


@register(Tags.compatibility)
def check_component_warnings(app_configs=None, **kwargs):
    """Each built component may say what is doubtful about its configuration through an
    optional ``check_warnings()`` method returning messages (ragchat.W040)."""
    warnings = []
    for name, found in _built_profiles():
        for component in found:
            check = getattr(component, "check_warnings", None)
            for message in (check() if callable(check) else ()):
                warnings.append(Warning(f"Profile {name!r}, {component.kind} {component.name!r}: {message}",
                                        hint="See docs/plugins.md.", id="ragchat.W040"))
    return warnings


@register(Tags.compatibility)
def check_sources(app_configs=None, **kwargs):
    """The model sources: each registration left out (E050-E057), and a source with objects but
    nothing indexed (W050)."""
    found = [Error(message, hint=hint, id=check_id) for check_id, message, hint in source_registry.problems()]
    for name, source in source_registry.sources().items():
        try:
            unsynced = not Document.objects.filter(origin=name).exists() and source.get_queryset().exists()
        except DatabaseError:
            continue  # not migrated yet, or no database: nothing to say
        if unsynced:
            found.append(Warning(f"Model source {name!r} ({source.get_model()._meta.label}) has objects but none "
                                 f"is indexed: the assistant cannot answer from them yet",
                                 hint="Run manage.py ragchat_sync (live sync then keeps it current).",
                                 id="ragchat.W050"))
    return found


# Backends that keep their data in the process: each worker process has its own.
PER_PROCESS_LAYERS = ("channels.layers.InMemoryChannelLayer",)
PER_PROCESS_CACHES = ("django.core.cache.backends.locmem.LocMemCache", "django.core.cache.backends.dummy.DummyCache")


def _per_process() -> list[str]:
    """What the site keeps per worker process that the chat needs shared across them."""
    found = []
    layer = (getattr(settings, "CHANNEL_LAYERS", None) or {}).get("default", {}).get("BACKEND")
    if getattr(settings, "ASGI_APPLICATION", None) and layer in PER_PROCESS_LAYERS:
        found.append(f"channel layer ({layer.rsplit('.', 1)[-1]}: a second tab, a cancel and a logout reach "
                     f"only the sockets of the worker that runs the turn)")
    cache = settings.CACHES.get("default", {}).get("BACKEND")
    limited = ragchat_settings.TURNS_PER_MINUTE or ragchat_settings.MAX_CONCURRENT_STREAMS
    if cache in PER_PROCESS_CACHES and limited:
        found.append(f"default cache ({cache.rsplit('.', 1)[-1]}: TURNS_PER_MINUTE and MAX_CONCURRENT_STREAMS "
                     f"are counted per worker, so N workers allow N times as much)")
    return found


def _workers_configured() -> int:
    """The worker processes the environment asks for (``WEB_CONCURRENCY``, which gunicorn and
    uvicorn take as their default ``--workers``); 1 when it says nothing."""
    try:
        return max(1, int(os.environ.get("WEB_CONCURRENCY", "1")))
    except ValueError:
        return 1


def _shared_state_warning(workers: str, found: list[str]) -> Warning:
    return Warning(
        f"{workers}: each process would keep its own " + "; and its own ".join(found) + ".",
        hint="Give every worker the same Redis: the channels_redis layer (pip install \"django-ragchat[redis]\") and "
             "Django's Redis cache, as docs/deployment.md (\"Several worker processes\") shows. With one worker "
             "process, silence ragchat.W032.",
        id="ragchat.W032",
    )


@register(Tags.compatibility)
def check_several_workers(app_configs=None, **kwargs):
    """W032: several worker processes (WEB_CONCURRENCY) with a per-process layer or cache."""
    workers = _workers_configured()
    found = _per_process()
    if workers < 2 or not found:
        return []
    return [_shared_state_warning(f"WEB_CONCURRENCY asks for {workers} worker processes", found)]


@register(Tags.compatibility, deploy=True)
def check_several_workers_deploy(app_configs=None, **kwargs):
    """W032 with ``--deploy``: a production site usually runs several workers (docs/deployment.md's
    ``--workers 4``); whatever WEB_CONCURRENCY says, a per-process layer or cache is named."""
    found = _per_process()
    if _workers_configured() >= 2 or not found:
        return []  # said by check_several_workers, or nothing to say
    return [_shared_state_warning("Once run with more than one worker process (gunicorn or uvicorn --workers N)", found)]


@register(Tags.compatibility)
def check_several_workers_on_sqlite(app_configs=None, **kwargs):
    """W034: several worker processes (WEB_CONCURRENCY) sharing a SQLite file."""
    workers = _workers_configured()
    if workers < 2 or connections["default"].vendor != "sqlite":
        return []
    # Measured (bench/README.md, "Scale-out"): 2 workers answer 1.35 times what one does on
    # SQLite, 1.62 times on PostgreSQL, on the same 2 cores: each turn writes, and SQLite lets
    # one process write at a time.
    return [Warning(
        f"WEB_CONCURRENCY asks for {workers} worker processes, but the default database is SQLite: every turn "
        f"saves messages, and SQLite lets one process write at a time, so the workers wait for each other.",
        hint="Use PostgreSQL for more than one worker process (docs/postgresql.md, docs/deployment.md \"Several "
             "worker processes\"); with one worker process, silence ragchat.W034.",
        id="ragchat.W034",
    )]


@register(Tags.security, deploy=True)
def check_user_retention(app_configs=None, **kwargs):
    """W033: signed-in users' conversations are kept forever unless USER_RETENTION_DAYS is set."""
    if ragchat_settings.USER_RETENTION_DAYS is not None:
        return []
    return [Warning(
        "RAGCHAT['USER_RETENTION_DAYS'] is None: signed-in users' conversations, messages, traces and memory "
        "records are kept forever (anonymous ones for ANONYMOUS_RETENTION_DAYS).",
        hint="Set it to the number of days your privacy policy keeps chat data and run `manage.py ragchat_purge` "
             "daily (docs/settings.md); if keeping them is intended, silence ragchat.W033.",
        id="ragchat.W033",
    )]
