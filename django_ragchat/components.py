"""The base of every pipeline component and the registry that plugins fill.

Plugins register component *classes* through the ``register_*`` hooks. A profile picks
components by name; the registry builds one instance per (profile, component) with the options
the profile gives it, so a component's ``__init__`` is where it reads its configuration.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
from typing import TYPE_CHECKING, Any, ClassVar

from django.core.exceptions import ImproperlyConfigured

if TYPE_CHECKING:
    from django_ragchat.profiles import Profile


class PluginProblem(str):
    """The message of one plugin problem (``registry.errors``; a ``str`` like the others) that
    also knows the plugin it is about: ``plugin``, its name as loaded (the built-in module, the
    string in ``RAGCHAT["PLUGINS"]`` or the entry point's name), so that the system check's hint
    can say where that plugin came from."""

    plugin: str | None

    def __new__(cls, message: str, plugin: str | None = None) -> PluginProblem:
        problem = super().__new__(cls, message)
        problem.plugin = plugin
        return problem


class Component:
    """Base class of pipeline components.

    Subclasses set ``name`` (unique within their stage) and may set ``order`` (lower runs
    first; ties are broken by registration order) and ``enabled_by_default`` (whether a profile
    that does not list its stage's components explicitly gets this one).

    ``__init__`` receives the profile and the options the profile gives this component
    (``PROFILES[name]["options"][component_name]``); override it to accept named options.
    A component that sets ``uses_vocabulary`` also receives ``vocabulary``: the profile's
    ``answerer.vocabulary.Vocabulary`` (its language's words and synonym table), handed in by
    the turn runtime so that no component imports word lists of its own. One that sets
    ``uses_embedder`` receives ``embedder``: the profile's embedder instance (the one its
    retrieval uses), so that it can compare texts by meaning when that embedder is a semantic
    model running in process (``Embedder.local_semantic``), without importing one itself.
    """

    kind: ClassVar[str] = ""
    name: ClassVar[str] = ""
    order: ClassVar[int] = 100
    enabled_by_default: ClassVar[bool] = True
    uses_vocabulary: ClassVar[bool] = False
    uses_embedder: ClassVar[bool] = False

    def __init__(self, profile: Profile, **options: Any):
        self.profile = profile
        if options:
            accepted = self.accepted_options()
            close = [m for key in sorted(options) for m in difflib.get_close_matches(key, accepted, n=1)]
            hint = f"did you mean {' or '.join(map(repr, dict.fromkeys(close)))}? " if close else ""
            what = f"has no option {', '.join(map(repr, sorted(options)))} ({hint}its options: {', '.join(accepted)})" \
                if accepted else f"takes no options; got {sorted(options)}"
            raise ImproperlyConfigured(f"{type(self).__name__} ({self.kind} {self.name!r}) {what} in profile "
                                       f"{profile.name!r}.")

    @classmethod
    def accepted_options(cls) -> list[str]:
        """The named options the class's ``__init__`` (a subclass's) accepts, for error messages."""
        skip = {"self", "profile", "vocabulary", "embedder"}
        return [name for name, parameter in inspect.signature(cls.__init__).parameters.items()
                if name not in skip and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)]

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.kind}:{self.name}>"


@dataclasses.dataclass(frozen=True)
class Registration:
    """One registered component class and where it came from."""

    kind: str
    name: str
    cls: type[Component]
    order: int
    plugin: str
    index: int  # registration order, the tie-breaker

    @property
    def sort_key(self) -> tuple[int, int]:
        return (self.order, self.index)


class ComponentRegistry:
    """Component classes by stage (``kind``) and name, in call order."""

    def __init__(self) -> None:
        self._by_kind: dict[str, dict[str, Registration]] = {}
        self.errors: list[str] = []

    def add(self, kind: str, cls: type[Component], plugin: str, *, name: str | None = None,
            order: int | None = None) -> None:
        name = name or cls.name
        if not name:
            self.errors.append(PluginProblem(f"Plugin {plugin!r} registered {cls!r} as a {kind} without a name.", plugin))
            return
        existing = self._by_kind.setdefault(kind, {}).get(name)
        if existing is not None:
            self.errors.append(PluginProblem(
                f"Plugin {plugin!r} registered a {kind} named {name!r}, which plugin "
                f"{existing.plugin!r} already registered.", plugin))
            return
        index = sum(len(v) for v in self._by_kind.values())
        self._by_kind[kind][name] = Registration(
            kind, name, cls, cls.order if order is None else order, plugin, index
        )

    def get(self, kind: str, name: str) -> Registration:
        try:
            return self._by_kind.get(kind, {})[name]
        except KeyError:
            known = ", ".join(sorted(self._by_kind.get(kind, {}))) or "none"
            raise ImproperlyConfigured(
                f"No {kind} named {name!r} is registered (registered: {known}). Is the plugin "
                f"that provides it listed in RAGCHAT['PLUGINS'], or installed with an entry point of "
                f"the django_ragchat group?"
            ) from None

    def ordered(self, kind: str, names: list[str] | None = None) -> list[Registration]:
        """Registrations of ``kind`` in call order: the named ones, or all enabled by default."""
        if names is None:
            regs = [r for r in self._by_kind.get(kind, {}).values() if r.cls.enabled_by_default]
        else:
            regs = [self.get(kind, n) for n in names]
        return sorted(regs, key=lambda r: r.sort_key)

    def all(self) -> list[Registration]:
        return sorted(
            (r for regs in self._by_kind.values() for r in regs.values()),
            key=lambda r: (r.kind, r.sort_key),
        )

    def kinds(self) -> list[str]:
        return sorted(self._by_kind)
