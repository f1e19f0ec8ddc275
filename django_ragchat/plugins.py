"""Loading plugins and building the component registry from them.

Plugins are loaded in this order, which is also the registration order that breaks ties
between components of equal ``order``:

1. the built-in modules in ``DEFAULT_PLUGINS`` (they use the public hooks like anyone else);
2. the modules in ``RAGCHAT["PLUGINS"]``: a module name (``"myplugin"``, ``"pkg.plugin"``) or
   the dotted path of an object in a module (``"pkg.plugin.instance"``);
3. distributions in the ``django_ragchat`` entry point group (unless
   ``RAGCHAT["LOAD_ENTRY_POINTS"]`` is false).
"""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import importlib.metadata
import inspect
import logging
import pkgutil
import threading
from importlib import import_module
from typing import Any

import pluggy
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from django_ragchat import hookspecs
from django_ragchat.components import Component, ComponentRegistry, PluginProblem
from django_ragchat.conf import ragchat_settings
from django_ragchat.profiles import CHOICE_STAGES, LIST_STAGES, Profile, get_profile, profile_names, profile_title
from django_ragchat.tools import ToolRegistry

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "django_ragchat"

DEFAULT_PLUGINS: tuple[str, ...] = (
    "django_ragchat.stages.memory",
    "django_ragchat.stages.guardrails",
    "django_ragchat.stages.transformers",
    "django_ragchat.stages.expanders",
    "django_ragchat.stages.retrievers",
    "django_ragchat.stages.joiners",
    "django_ragchat.stages.postprocessors",
    "django_ragchat.stages.prompts",
    "django_ragchat.stages.llms",
    "django_ragchat.stages.embedders",
    "django_ragchat.stages.responses",
    "django_ragchat.stages.llm_transformers",
    "django_ragchat.stages.summary_memory",
)

#: The registration hook of model sources (classes of ``django_ragchat.sources``, not components).
SOURCES_HOOK = "register_sources"

# register_* hook name -> the component kind it registers.
REGISTRATION_HOOKS: dict[str, str] = {
    "register_memory_strategies": "memory",
    "register_guardrails": "guardrail",
    "register_query_transformers": "query_transformer",
    "register_query_expanders": "query_expander",
    "register_retrievers": "retriever",
    "register_joiners": "joiner",
    "register_document_postprocessors": "document_postprocessor",
    "register_prompt_augmenters": "prompt_augmenter",
    "register_llm_backends": "llm",
    "register_embedders": "embedder",
    "register_response_augmenters": "response_augmenter",
    "register_advisors": "advisor",
}

#: The hook that registers tools (functions, not components: docs/tools.md).
TOOL_HOOK = "register_tools"

#: Profile fields in the order the turn runs their stages (advisors wrap the rest; guardrails also
#: check the output).
PIPELINE_ORDER = (
    "advisors", "guardrails", "memory", "query_transformers", "query_expanders", "retrievers", "embedder", "joiner",
    "document_postprocessors", "prompt_augmenter", "llm", "response_augmenters",
)
#: Profile field -> the kind of component it names.
STAGE_KINDS = {**CHOICE_STAGES, **LIST_STAGES}

_lock = threading.RLock()
_state: dict[str, Any] = {}


class PluginLoadError(Exception):
    """A plugin listed in settings or an entry point could not be loaded."""


def _load(target: str) -> Any:
    """The module named ``target`` or, failing that, the object at dotted path ``target``.

    A module that exists but fails to import is reported with its own error (a missing
    dependency, a syntax error), not as "cannot be found"; a name that is neither a module nor
    an attribute of its parent module says both (``_neither``).
    """
    try:
        return import_module(target)
    except ModuleNotFoundError as exc:
        if exc.name != target or "." not in target:
            raise PluginLoadError(f"Cannot import plugin {target!r} from RAGCHAT['PLUGINS']: {exc}") from exc
    except Exception as exc:  # the module exists; importing it failed
        raise PluginLoadError(f"Importing plugin {target!r} from RAGCHAT['PLUGINS'] failed: {exc!r}") from exc
    module_name, _, attribute = target.rpartition(".")
    parent = import_module(module_name)  # imported already: the import of ``target`` stopped below it
    if not hasattr(parent, attribute):
        raise PluginLoadError(_neither(target, parent, attribute))
    return getattr(parent, attribute)  # "package.module.attribute"


def _neither(target: str, parent: Any, attribute: str) -> str:
    """What was not found for ``target``: a module of that name, nor ``attribute`` in ``parent``
    (the error said only the second, as if the misspelt module had been meant as an object),
    with the submodules and attributes of ``parent`` close to it."""
    # Not only the attributes: a package's submodules are not attributes until imported.
    names = {module.name for module in pkgutil.iter_modules(getattr(parent, "__path__", []))}
    names |= {name for name in dir(parent) if not name.startswith("_")}
    close = difflib.get_close_matches(attribute, sorted(names), n=3, cutoff=0.8)
    guess = f" Did you mean {' or '.join(repr(f'{parent.__name__}.{name}') for name in close)}?" if close else ""
    return (f"Cannot import plugin {target!r} from RAGCHAT['PLUGINS']: there is no module {target!r}, and the "
            f"module {parent.__name__!r} has no attribute {attribute!r}.{guess}")


def settings_plugins() -> list[str]:
    """The strings of ``RAGCHAT["PLUGINS"]``; none when it is not a list of strings (a string
    would load letter by letter, a number not at all): ``ragchat.E007`` says so."""
    return [] if ragchat_settings.problems(["PLUGINS"]) else list(ragchat_settings.PLUGINS)


@dataclasses.dataclass(frozen=True)
class PluginOrigin:
    """Where a plugin came from: ``kind`` is "built-in", "settings" or "entry point" ("code" for
    one registered on the plugin manager by hand); ``where`` says it in words, ``remedy`` what to
    do about a plugin that fails (the system checks' hints)."""

    kind: str
    where: str
    remedy: str


def plugin_origin(name: str) -> PluginOrigin:
    """Where the plugin loaded as ``name`` came from: ``DEFAULT_PLUGINS``, ``RAGCHAT["PLUGINS"]``
    (``name`` is the string written there) or an entry point (``name`` is the entry point's)."""
    if name in DEFAULT_PLUGINS:
        return PluginOrigin("built-in", f"the built-in module {name!r}", "Report it: a built-in module of "
                            "django-ragchat should never fail (reinstall django-ragchat first).")
    if name in settings_plugins():
        return PluginOrigin("settings", f"{name!r} in RAGCHAT['PLUGINS']",
                            f"Fix the plugin, or remove {name!r} from RAGCHAT['PLUGINS'].")
    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP, name=name):
        dist = entry_point.dist
        where = f"the entry point `{entry_point.name} = {entry_point.value}` (group {ENTRY_POINT_GROUP!r})"
        if dist is not None:
            where += f" of the distribution {dist.name!r} {dist.version}"
        package = f"{dist.name!r}" if dist is not None else "the distribution that declares it"
        return PluginOrigin("entry point", where, (
            f"Fix or upgrade {package}, or uninstall it{f' (pip uninstall {dist.name})' if dist else ''}: it is "
            f"loaded through {where}. RAGCHAT['LOAD_ENTRY_POINTS'] = False stops loading every entry point."))
    return PluginOrigin("code", f"the plugin {name!r} (registered by code)",
                        f"Fix the plugin {name!r} or the code that registers it.")


def build_plugin_manager() -> tuple[pluggy.PluginManager, list[str]]:
    """A new plugin manager with every plugin loaded; also returns load errors."""
    pm = pluggy.PluginManager("django_ragchat")
    pm.add_hookspecs(hookspecs)
    errors: list[str] = []
    for name in DEFAULT_PLUGINS:
        pm.register(import_module(name), name=name)
    for target in settings_plugins():
        try:
            pm.register(_load(target), name=target)
        except (PluginLoadError, ValueError) as exc:
            errors.append(PluginProblem(str(exc), target))
    if ragchat_settings.LOAD_ENTRY_POINTS:
        _load_entry_points(pm, errors)
    return pm, errors


def _load_entry_points(pm: pluggy.PluginManager, errors: list[str]) -> None:
    """The ``django_ragchat`` entry points, one at a time: pluggy's loader stops at the first that
    fails, and one broken distribution must not switch off the others (their guardrails too)."""
    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP, name=entry_point.name)
        except Exception as exc:  # a broken third-party distribution must not take the site down
            dist = entry_point.dist
            owner = f" of the distribution {dist.name!r} {dist.version}" if dist is not None else ""
            errors.append(PluginProblem(f"Loading the entry point {entry_point.name!r} ({entry_point.value}){owner} "
                                        f"failed: {exc!r}. Its plugins are not loaded; the other plugins are.",
                                        entry_point.name))


def build_registry(pm: pluggy.PluginManager) -> ComponentRegistry:
    """Call every registration hook implementation, one plugin at a time, in load order."""
    registry = ComponentRegistry()
    for hook_name, kind in REGISTRATION_HOOKS.items():
        for impl in getattr(pm.hook, hook_name).get_hookimpls():
            plugin = impl.plugin_name
            if impl.wrapper or impl.hookwrapper:
                continue  # it could wrap nothing; reported by the check ragchat.E008

            def register(cls: type[Component], *, name: str | None = None,
                         order: int | None = None, _kind: str = kind, _plugin: str = plugin,
                         _hook: str = hook_name) -> None:
                if not (isinstance(cls, type) and issubclass(cls, Component) and cls.kind == _kind):
                    registry.errors.append(PluginProblem(
                        f"Plugin {_plugin!r} passed {cls!r} to register() in {_hook}, "
                        f"but it is not a subclass of the {_kind} base class.", _plugin))
                    return
                registry.add(_kind, cls, _plugin, name=name, order=order)

            try:
                impl.function(register=register)
            except Exception as exc:
                registry.errors.append(PluginProblem(f"Plugin {plugin!r} failed in {hook_name}: {exc!r}", plugin))
    return registry


def collect_sources(pm: pluggy.PluginManager, errors: list[str]) -> list[tuple[Any, str]]:
    """(class, plugin name) of every model source registered through ``register_sources``, in
    load order; an implementation that raises adds to ``errors``. What the classes must be is
    checked by ``django_ragchat.sources`` (a registration module cannot import it)."""
    found: list[tuple[Any, str]] = []
    for impl in getattr(pm.hook, SOURCES_HOOK).get_hookimpls():
        if impl.wrapper or impl.hookwrapper:
            continue  # reported by the check ragchat.E008

        def register(cls: Any, _plugin: str = impl.plugin_name) -> None:
            found.append((cls, _plugin))

        try:
            impl.function(register=register)
        except Exception as exc:
            errors.append(PluginProblem(f"Plugin {impl.plugin_name!r} failed in {SOURCES_HOOK}: {exc!r}",
                                        impl.plugin_name))
    return found


def build_tool_registry(pm: pluggy.PluginManager) -> ToolRegistry:
    """Call every ``register_tools`` implementation, one plugin at a time, in load order."""
    tools = ToolRegistry()
    for impl in pm.hook.register_tools.get_hookimpls():
        if impl.wrapper or impl.hookwrapper:
            continue  # reported by the check ragchat.E008

        def register(candidate: Any, *, name: str | None = None, _plugin: str = impl.plugin_name) -> None:
            tools.add(candidate, _plugin, name=name)

        try:
            impl.function(register=register)
        except Exception as exc:
            tools.errors.append(PluginProblem(f"Plugin {impl.plugin_name!r} failed in {TOOL_HOOK}: {exc!r}",
                                              impl.plugin_name))
    return tools


def _ensure_loaded() -> dict[str, Any]:
    with _lock:
        if not _state:
            pm, errors = build_plugin_manager()
            registry = build_registry(pm)
            registry.errors[:0] = errors
            sources = collect_sources(pm, registry.errors)
            tools = build_tool_registry(pm)
            registry.errors += tools.errors
            for message in registry.errors:  # servers run no system checks: say it where it is seen
                logger.error("%s (manage.py check lists every plugin problem as ragchat.E004)", message)
            _state.update(pm=pm, registry=registry, tools=tools, instances={}, sources=sources)
        return _state


def get_plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager, built on first use."""
    return _ensure_loaded()["pm"]


def get_registry() -> ComponentRegistry:
    """The process-wide component registry, built on first use."""
    return _ensure_loaded()["registry"]


def get_tools() -> ToolRegistry:
    """The process-wide tool registry (``register_tools``), built with the plugin manager."""
    return _ensure_loaded()["tools"]


def reset() -> None:
    """Forget the plugin manager and every built component (settings changed)."""
    with _lock:
        _state.clear()
        get_profile.cache_clear()


@receiver(setting_changed)
def _reset_on_settings_change(*, setting: str, **kwargs: Any) -> None:
    # Components are built from profiles and plugins; rebuild them on next use.
    if setting == "RAGCHAT":
        reset()


def registered_sources() -> list[tuple[Any, str]]:
    """(class, plugin name) of each model source registered, in load order (``collect_sources``)."""
    return list(_ensure_loaded()["sources"])


def instance_cache() -> dict:
    """Components built for profiles live here, so ``reset()`` drops them too."""
    return _ensure_loaded()["instances"]


def build_component(profile: Profile, kind: str, name: str, *, vocabulary: Any = None,
                    embedder: Any = None) -> Component:
    """The instance of the ``kind`` component ``name`` that ``profile`` runs, built once per
    process and profile with the options the profile gives it (and ``vocabulary`` when its class
    sets ``uses_vocabulary``, ``embedder``, the profile's embedder, when it sets ``uses_embedder``)."""
    cache = instance_cache()
    key = (profile.name, kind, name)
    if key not in cache:
        cls = get_registry().get(kind, name).cls
        handed = {"vocabulary": vocabulary} if cls.uses_vocabulary else {}
        if cls.uses_vocabulary and vocabulary is None:
            raise ImproperlyConfigured(f"The {kind} {name!r} reads a vocabulary; build it with the profile's "
                                       f"components (django_ragchat.turn.context.components_for).")
        if cls.uses_embedder:
            handed["embedder"] = embedder if embedder is not None else embedder_for(profile)
        cache[key] = cls(profile, **profile.options_for(name), **handed)
    return cache[key]


def embedder_for(profile: Profile) -> Component:
    """``profile``'s embedder (the same instance its turns use): for ingestion, search and checks."""
    return build_component(profile, "embedder", profile.embedder)


async def await_me_maybe(value: Any) -> Any:
    """Resolve what a hook or component returned: a value, an awaitable, or a callable of one."""
    if callable(value) and not isinstance(value, type):
        value = value()
    if inspect.isawaitable(value):
        value = await value
    return value


async def _logged(awaitable: Any, plugin: str, hook_name: str) -> Any:
    try:
        return await awaitable
    except asyncio.CancelledError:
        raise
    except Exception:
        logger.exception("Plugin %r failed in %s", plugin, hook_name)
        return None


def _guard(hook: Any, hook_name: str) -> None:
    """Make each plain implementation of lifecycle hook ``hook`` log its failures instead of
    raising them, so one observer cannot break the turn or stop the others. Wrappers are left
    as they are: pluggy passes them the other implementations' results."""
    for impl in hook.get_hookimpls():
        if impl.wrapper or impl.hookwrapper or getattr(impl.function, "_ragchat_guarded", False):
            continue
        function, plugin = impl.function, impl.plugin_name

        def guarded(*args: Any, _function=function, _plugin=plugin, **kwargs: Any) -> Any:
            try:
                result = _function(*args, **kwargs)
            except Exception:
                logger.exception("Plugin %r failed in %s", _plugin, hook_name)
                return None
            return _logged(result, _plugin, hook_name) if inspect.isawaitable(result) else result

        guarded._ragchat_guarded = True
        impl.function = guarded  # pluggy calls impl.function(*args) with impl.argnames


async def notify(hook_name: str, **kwargs: Any) -> None:
    """Call a lifecycle hook through pluggy's hook caller, so ``wrapper=True`` (and old-style
    ``hookwrapper=True``) implementations run around the others; then await what the
    ``async`` implementations returned. Observers' failures are logged and never break the
    turn."""
    hook = getattr(get_plugin_manager().hook, hook_name)
    if not hook.get_hookimpls():  # nobody observes it (a stage's end, usually): pluggy would return []
        return
    _guard(hook, hook_name)
    try:
        results = hook(**kwargs)
    except Exception:  # a wrapper failed (the plain implementations are guarded)
        logger.exception("A wrapper of %s failed", hook_name)
        return
    for result in results:
        if inspect.isawaitable(result):
            await result


def plugin_listing() -> list[dict[str, Any]]:
    """Every plugin with its hook implementations, and every component in call order."""
    pm = get_plugin_manager()
    plugins = []
    for name, plugin in pm.list_name_plugin():
        hooks = sorted(h.name for h in pm.get_hookcallers(plugin) or [])
        dist = next((d for p, d in pm.list_plugin_distinfo() if p is plugin), None)
        plugins.append({
            "name": name,
            "hooks": hooks,
            "version": getattr(dist, "version", None) if dist else getattr(plugin, "__version__", None),
            "builtin": name in DEFAULT_PLUGINS,
        })
    return plugins


def hook_implementations() -> dict[str, list[str]]:
    """Each implemented hook and the plugins implementing it, in the order they are called:
    registration hooks in load order (``build_registry``), lifecycle hooks as pluggy calls
    them (``notify``). Registration hooks come first, in ``REGISTRATION_HOOKS`` order."""
    pm = get_plugin_manager()
    registration = [*REGISTRATION_HOOKS, SOURCES_HOOK, TOOL_HOOK]
    names = registration + sorted(
        name for name in vars(pm.hook) if not name.startswith("_") and name not in registration
    )
    found = {}
    for name in names:
        impls = getattr(pm.hook, name).get_hookimpls()
        if impls:
            ordered = impls if name in registration else reversed(impls)
            found[name] = [impl.plugin_name for impl in ordered]
    return found


def profile_components(profile: Profile, registry: ComponentRegistry | None = None) -> dict[str, list[str]]:
    """The registered names of the components ``profile`` runs, by profile field in
    ``PIPELINE_ORDER``, each stage's in call order (nothing is built). ``ImproperlyConfigured``
    names a component no plugin registered."""
    registry = registry or get_registry()
    runs = {}
    for field in PIPELINE_ORDER:
        value = getattr(profile, field)
        names = [value] if field in CHOICE_STAGES else value
        runs[field] = [r.name for r in registry.ordered(STAGE_KINDS[field], names)]
    return runs


def profile_listing() -> dict[str, dict[str, Any]]:
    """Each profile by name: its ``title``, the components it runs by stage
    (``profile_components``) and its ``tools``; or its title and ``error``, why it cannot be
    built. For ``ragchat_plugins`` and the API."""
    profiles: dict[str, dict[str, Any]] = {}
    for name in profile_names():
        try:
            profile = get_profile(name)
            profiles[name] = {"title": profile.title, **profile_components(profile), "tools": list(profile.tools)}
        except ImproperlyConfigured as exc:
            profiles[name] = {"title": profile_title(name), "error": str(exc)}
    return profiles


def tool_listing() -> list[dict[str, Any]]:
    """Every registered tool by name: the plugin that registered it, its label and description,
    and whether it asks the user first. For ``ragchat_plugins`` and the API."""
    return [{"name": r.tool.name, "plugin": r.plugin, "label": r.tool.label, "description": r.tool.description,
             "requires_confirmation": r.tool.requires_confirmation} for r in get_tools().all()]
