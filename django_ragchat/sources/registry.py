"""The model sources registered through the ``register_sources`` hook, checked and indexed.

``sources()`` is built once per process (and again when the plugins are reloaded), from
``plugins.registered_sources()``: one instance per valid class, by name. A class that is not a
``ModelSource``, a missing or repeated name, a model that does not exist, a source without a
text, a dependency that leads nowhere... is left out and reported with a stable id by the
system checks (``problems()``; docs/sources.md lists the ids).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import FieldDoesNotExist
from django.db import models
from django.template import TemplateDoesNotExist
from django.template.loader import get_template

from django_ragchat.plugins import instance_cache, registered_sources
from django_ragchat.profiles import get_profile
from django_ragchat.sources.base import NAME_PATTERN, ModelSource, SourceError


@dataclass(frozen=True)
class Follow:
    """How a change of a dependent model reaches the objects of a source.

    ``kind``: ``"self"`` (the source's own model), ``"fk"`` (a foreign key to the source's model:
    its ``attname``, read without a query; the old value is looked up before a save moves it),
    ``"many"`` (a many-to-many or reverse relation: its accessor, one query), ``"one"`` (a
    reverse one-to-one), ``"call"`` (the site's callable)."""

    kind: str
    attribute: str = ""
    function: Any = None


@dataclass
class Registry:
    sources: dict[str, ModelSource] = field(default_factory=dict)
    # (check id, message, hint) of every registration left out.
    problems: list[tuple[str, str, str]] = field(default_factory=list)
    # model class -> [(source, follow)]: whose save or delete changes which source.
    watching: dict[type, list[tuple[ModelSource, Follow]]] = field(default_factory=dict)


def _follow(dependent: type[models.Model], how: Any, target: type[models.Model]) -> Follow:
    if callable(how):
        return Follow("call", function=how)
    if not isinstance(how, str):
        raise SourceError(f"{how!r} is neither the name of a relation nor a callable")
    try:
        relation = dependent._meta.get_field(how)
    except FieldDoesNotExist:
        relation = next((r for r in dependent._meta.related_objects if r.get_accessor_name() == how), None)
    if relation is None or not relation.is_relation:
        raise SourceError(f"{dependent._meta.label} has no relation {how!r}")
    if relation.related_model is not target:
        raise SourceError(f"{dependent._meta.label}.{how} leads to {relation.related_model!r}, "
                          f"not to {target._meta.label}")
    if getattr(relation, "concrete", False):  # a field of the dependent model itself
        if relation.many_to_many:
            return Follow("many", relation.name)
        return Follow("fk", relation.attname)
    # A reverse relation: its accessor is a manager, or the one object of a reverse one-to-one.
    return Follow("one" if relation.one_to_one else "many", relation.get_accessor_name())


def _probe(label: Any) -> type[models.Model]:
    probe = ModelSource()
    probe.model = label
    return probe.get_model()


def _check_source(source: ModelSource, names: set[str]) -> list[tuple[str, str, str]]:
    """What is wrong with one source (empty when nothing)."""
    label = f"Model source {type(source).__qualname__}"
    if not isinstance(source.name, str) or not NAME_PATTERN.match(source.name):
        return [("ragchat.E051", f"{label} has the name {source.name!r}",
                 "Set name to lowercase letters, digits, _ and - (starting with a letter), unique among sources.")]
    if source.name in names:
        return [("ragchat.E051", f"Two model sources are named {source.name!r}", "Give each source its own name.")]
    label = f"Model source {source.name!r}"
    try:
        model = source.get_model()
    except (SourceError, LookupError, ValueError) as exc:
        return [("ragchat.E052", f"{label}: {exc}", "Set model to an installed model class or 'app_label.Model'.")]
    problems = []
    if type(source).text is ModelSource.text and not source.template_name:
        problems.append(("ragchat.E053", f"{label} has no text", "Override text(self, obj) or set template_name."))
    elif type(source).text is ModelSource.text:
        try:
            get_template(source.template_name)
        except TemplateDoesNotExist:
            problems.append(("ragchat.E054", f"{label}: template {source.template_name!r} does not exist",
                             "Create it in an app's templates/ folder, or override text(self, obj)."))
    if source.updated_field is not None:
        try:
            updated = model._meta.get_field(source.updated_field)
        except FieldDoesNotExist:
            updated = None
        if not isinstance(updated, (models.DateTimeField, models.DateField)):
            problems.append(("ragchat.E056", f"{label}: updated_field {source.updated_field!r} is not a date or "
                                             f"date-time field of {model._meta.label}",
                             "Name a DateTimeField set on every change (auto_now), or remove updated_field."))
    for profile in source.profiles or ():
        try:
            get_profile(profile)
        except Exception as exc:  # noqa: BLE001 - UnknownProfile or a broken profile: reported here
            problems.append(("ragchat.E057", f"{label}: profile {profile!r}: {exc}",
                             "List profiles of RAGCHAT['PROFILES'], or None for all."))
    return problems


def _dependencies(source: ModelSource, model: type[models.Model]) -> tuple[list, list]:
    """([(dependent model, follow)], problems) of ``source.depends_on``."""
    found, problems = [], []
    if not isinstance(source.depends_on, dict):
        return [], [("ragchat.E055", f"Model source {source.name!r}: depends_on must be a dict",
                     "{Model or 'app_label.Model': 'relation name' or callable}")]
    for dependent, how in source.depends_on.items():
        try:
            dependent_model = _probe(dependent)
            found.append((dependent_model, _follow(dependent_model, how, model)))
        except (SourceError, LookupError, ValueError) as exc:
            problems.append(("ragchat.E055", f"Model source {source.name!r}: depends_on {dependent!r}: {exc}",
                             "Name a relation of that model leading to the source's model, or give a callable "
                             "(instance) -> objects or primary keys."))
    return found, problems


def build() -> Registry:
    """Instantiate and check every registered class (see module docstring)."""
    registry = Registry()
    for cls, plugin in registered_sources():
        if not (isinstance(cls, type) and issubclass(cls, ModelSource)):
            registry.problems.append(("ragchat.E050", f"Plugin {plugin!r} registered {cls!r} in register_sources, "
                                                      f"which is not a ModelSource subclass",
                                      "Subclass django_ragchat.sources.ModelSource."))
            continue
        source = cls()
        problems = _check_source(source, set(registry.sources))
        dependencies = []
        if not problems:
            dependencies, problems = _dependencies(source, source.get_model())
        if problems:
            registry.problems.extend(problems)
            continue
        registry.sources[source.name] = source
        registry.watching.setdefault(source.get_model(), []).append((source, Follow("self")))
        for dependent, follow in dependencies:
            registry.watching.setdefault(dependent, []).append((source, follow))
    return registry


def current() -> Registry:
    """The registry of this process's plugins (rebuilt after ``plugins.reset()``)."""
    cache = instance_cache()
    if "sources" not in cache:
        cache["sources"] = build()
    return cache["sources"]


def sources() -> dict[str, ModelSource]:
    """The valid model sources, by name, in registration order."""
    return current().sources


def get_source(name: str) -> ModelSource:
    """The source named ``name``; ``KeyError`` with the known names when there is none."""
    found = sources()
    if name not in found:
        raise KeyError(f"No model source {name!r}; registered: {', '.join(found) or 'none'}.")
    return found[name]


def problems() -> list[tuple[str, str, str]]:
    return list(current().problems)
