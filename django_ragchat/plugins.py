"""Loading plugins and building the component registry from them.

Plugins are loaded in this order, which is also the registration order that breaks ties
between components of equal ``order``:

1. the built-in modules in ``DEFAULT_PLUGINS`` (they use the public hooks like anyone else);
2. the dotted paths in ``RAGCHAT["PLUGINS"]``;
3. distributions in the ``django_ragchat`` entry point group (unless
   ``RAGCHAT["LOAD_ENTRY_POINTS"]`` is false).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from importlib import import_module
from typing import Any

import pluggy
from django.utils.module_loading import import_string

from django_ragchat import hookspecs
from django_ragchat.components import Component, ComponentRegistry

logger = logging.getLogger(__name__)

from django_ragchat import hookimpl  # noqa: E402, F401  (also importable from here, as in pluggy projects)

ENTRY_POINT_GROUP = "django_ragchat"

DEFAULT_PLUGINS: tuple[str, ...] = (
    "django_ragchat.memory",
    "django_ragchat.guardrails",
    "django_ragchat.transformers",
    "django_ragchat.expanders",
    "django_ragchat.retrievers",
    "django_ragchat.joiners",
    "django_ragchat.postprocessors",
    "django_ragchat.prompts",
    "django_ragchat.llms",
    "django_ragchat.embedders",
    "django_ragchat.responses",
    "django_ragchat.openai_backend",
    "django_ragchat.llm_transformers",
    "django_ragchat.summary_memory",
)

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
}

_lock = threading.RLock()
_state: dict[str, Any] = {}


class PluginLoadError(Exception):
    """A plugin listed in settings or an entry point could not be loaded."""


def _load(target: str) -> Any:
    try:
        return import_module(target)
    except ImportError:
        try:
            return import_string(target)
        except ImportError as exc:
            raise PluginLoadError(f"Cannot import plugin {target!r} from RAGCHAT['PLUGINS']: {exc}") from exc


def build_plugin_manager() -> tuple[pluggy.PluginManager, list[str]]:
    """A new plugin manager with every plugin loaded; also returns load errors."""
    from django_ragchat.conf import ragchat_settings

    pm = pluggy.PluginManager("django_ragchat")
    pm.add_hookspecs(hookspecs)
    errors: list[str] = []
    for name in DEFAULT_PLUGINS:
        pm.register(import_module(name), name=name)
    for target in ragchat_settings.PLUGINS:
        try:
            pm.register(_load(target), name=target)
        except (PluginLoadError, ValueError) as exc:
            errors.append(str(exc))
    if ragchat_settings.LOAD_ENTRY_POINTS:
        try:
            pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
        except Exception as exc:  # a broken third-party distribution must not take the site down
            errors.append(f"Loading the {ENTRY_POINT_GROUP!r} entry points failed: {exc!r}")
    return pm, errors


def build_registry(pm: pluggy.PluginManager) -> ComponentRegistry:
    """Call every registration hook implementation, one plugin at a time, in load order."""
    registry = ComponentRegistry()
    for hook_name, kind in REGISTRATION_HOOKS.items():
        for impl in getattr(pm.hook, hook_name).get_hookimpls():
            plugin = impl.plugin_name

            def register(cls: type[Component], *, name: str | None = None,
                         order: int | None = None, _kind: str = kind, _plugin: str = plugin,
                         _hook: str = hook_name) -> None:
                if not (isinstance(cls, type) and issubclass(cls, Component) and cls.kind == _kind):
                    registry.errors.append(
                        f"Plugin {_plugin!r} passed {cls!r} to register() in {_hook}, "
                        f"but it is not a subclass of the {_kind} base class."
                    )
                    return
                registry.add(_kind, cls, _plugin, name=name, order=order)

            try:
                impl.function(register=register)
            except Exception as exc:
                registry.errors.append(f"Plugin {plugin!r} failed in {hook_name}: {exc!r}")
    return registry


def _ensure_loaded() -> dict[str, Any]:
    with _lock:
        if not _state:
            pm, errors = build_plugin_manager()
            registry = build_registry(pm)
            registry.errors[:0] = errors
            _state.update(pm=pm, registry=registry, instances={})
        return _state


def get_plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager, built on first use."""
    return _ensure_loaded()["pm"]


def get_registry() -> ComponentRegistry:
    """The process-wide component registry, built on first use."""
    return _ensure_loaded()["registry"]


def reset() -> None:
    """Forget the plugin manager and every built component (settings changed)."""
    with _lock:
        _state.clear()
        from django_ragchat import profiles

        profiles.get_profile.cache_clear()


def instance_cache() -> dict:
    """Components built for profiles live here, so ``reset()`` drops them too."""
    return _ensure_loaded()["instances"]


async def await_me_maybe(value: Any) -> Any:
    """Resolve what a hook or component returned: a value, an awaitable, or a callable of one."""
    if callable(value) and not isinstance(value, type):
        value = value()
    if inspect.isawaitable(value):
        value = await value
    return value


async def notify(hook_name: str, **kwargs: Any) -> None:
    """Call a lifecycle hook; observers' failures are logged and never break the turn."""
    hook = getattr(get_plugin_manager().hook, hook_name)
    for impl in reversed(hook.get_hookimpls()):
        try:
            result = impl.function(**kwargs)
            if inspect.isawaitable(result):
                await result
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("Plugin %r failed in %s", impl.plugin_name, hook_name)


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
    registration hooks in load order (``build_registry``), lifecycle hooks as ``notify`` calls
    them. Registration hooks come first, in ``REGISTRATION_HOOKS`` order."""
    pm = get_plugin_manager()
    names = list(REGISTRATION_HOOKS) + sorted(
        name for name in vars(pm.hook) if not name.startswith("_") and name not in REGISTRATION_HOOKS
    )
    found = {}
    for name in names:
        impls = getattr(pm.hook, name).get_hookimpls()
        if impls:
            ordered = impls if name in REGISTRATION_HOOKS else reversed(impls)
            found[name] = [impl.plugin_name for impl in ordered]
    return found
