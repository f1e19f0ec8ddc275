"""Live sync: a save, a delete or a many-to-many change of a source's model (or of a model its
text depends on) re-indexes the objects it touches, after the transaction commits.

The receivers (``connect``, from the app's ``ready``) listen to every model's ``post_save``,
``post_delete``, ``m2m_changed``, ``pre_save`` and ``pre_delete`` and look the sender up in the registry (a
dictionary lookup: a model no source watches costs nothing more). What changed is collected per
database connection and flushed by ``transaction.on_commit``: once the transaction commits (at
once outside one), each source gets one task, ``tasks.sync_source_objects(name, pks)``, enqueued
on ``RAGCHAT["TASK_BACKEND"]``. On the immediate backend the task runs there and then, so the
object is searchable when ``save()`` returns; with a worker the request pays one enqueue and no
embedding. A rolled-back transaction enqueues nothing (what it touched may be synced with the
next commit: a sync reads the database, so that costs a lookup, never a wrong index).

Bulk operations send no signals (``QuerySet.update()``, ``bulk_create``, raw SQL): run
``ragchat_sync --since`` after them, or from cron. ``paused()`` turns live sync off in a block
(a big import followed by one ``ragchat_sync``).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Iterator
from typing import Any

from django.db import connections, router, transaction
from django.db.models.signals import m2m_changed, post_delete, post_save, pre_delete, pre_save

from django_ragchat import tasks
from django_ragchat.sources import registry

logger = logging.getLogger(__name__)

_paused: contextvars.ContextVar[bool] = contextvars.ContextVar("ragchat_sources_paused", default=False)


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No live sync for changes made in this block (run ``ragchat_sync`` afterwards)."""
    token = _paused.set(True)
    try:
        yield
    finally:
        _paused.reset(token)


def _pks_of(value: Any) -> list:
    """Primary keys from what a dependency's callable returned: objects, keys, or one of either."""
    if value is None:
        return []
    if hasattr(value, "values_list"):
        return list(value.values_list("pk", flat=True))
    if isinstance(value, (list, tuple, set, frozenset)) or hasattr(value, "__iter__") and not isinstance(value, str):
        return [getattr(item, "pk", item) for item in value]
    return [getattr(value, "pk", value)]


def affected(follow: registry.Follow, instance: Any) -> list:
    """The primary keys of the source's objects that a change of ``instance`` touches."""
    if follow.kind == "self":
        return [instance.pk]
    if follow.kind == "fk":
        value = getattr(instance, follow.attribute, None)
        return [] if value is None else [value]
    if follow.kind == "call":
        return _pks_of(follow.function(instance))
    if instance.pk is None:
        return []
    try:
        related = getattr(instance, follow.attribute)
    except Exception:  # noqa: BLE001 - a reverse one-to-one with no object (RelatedObjectDoesNotExist)
        return []
    return _pks_of(related.all() if hasattr(related, "all") else related)


def _pending(using: str) -> dict[str, set]:
    connection = connections[using]
    pending = getattr(connection, "_ragchat_sources_pending", None)
    if pending is None:
        pending = connection._ragchat_sources_pending = {}
    return pending


def schedule(source_name: str, pks: list, using: str) -> None:
    """Sync these objects of the source once the current transaction on ``using`` commits."""
    if not pks or _paused.get():
        return
    _pending(using).setdefault(source_name, set()).update(str(pk) for pk in pks)
    # Registered on every call, not once: a rolled-back transaction drops its callbacks but not
    # this buffer (the next commit's flush enqueues those keys too: a sync of an object that is
    # not there removes nothing). The first flush empties the buffer; later ones find it empty.
    transaction.on_commit(lambda: flush(using), using=using)


def flush(using: str) -> None:
    """Enqueue one task per source for everything collected on ``using`` (``on_commit``)."""
    pending = _pending(using)
    batches = {name: sorted(pks) for name, pks in pending.items() if pks}
    pending.clear()
    for name, pks in batches.items():
        try:
            tasks.enqueue(tasks.sync_source_objects, name, pks)
        except Exception:  # a task backend down must not fail the request that saved
            logger.exception("Could not enqueue the sync of %d object(s) of source %s; run ragchat_sync", len(pks),
                             name)


def _watchers(sender: Any) -> list[tuple[Any, registry.Follow]]:
    return registry.current().watching.get(sender, []) if sender is not None else []


def on_save(sender, instance, using=None, **kwargs) -> None:
    using = using or router.db_for_write(sender)
    for source, follow in _watchers(sender):
        if source.live:
            schedule(source.name, affected(follow, instance), using)
    for name, pks in getattr(instance, "_ragchat_left", {}).items():  # see before_save
        schedule(name, pks, using)
    instance.__dict__.pop("_ragchat_left", None)


def on_delete(sender, instance, using=None, **kwargs) -> None:
    on_save(sender, instance, using=using)


def before_delete(sender, instance, using=None, **kwargs) -> None:
    """A dependent reached through a relation (a tag's products): read whom it touches before
    the delete unlinks them (synced after it, ``on_delete``)."""
    watchers = [(s, f) for s, f in _watchers(sender) if f.kind in ("many", "one", "call") and s.live]
    if not watchers or _paused.get():
        return
    left: dict[str, list] = {}
    for source, follow in watchers:
        left.setdefault(source.name, []).extend(affected(follow, instance))
    instance.__dict__["_ragchat_left"] = left


def before_save(sender, instance, using=None, raw=False, **kwargs) -> None:
    """A dependent moving to another object (its foreign key changes): the object it leaves is
    synced too, after the save (``on_save``; now, it would still hold the dependent)."""
    watchers = [(s, f) for s, f in _watchers(sender) if f.kind == "fk" and s.live]
    if not watchers or instance._state.adding or instance.pk is None or raw or _paused.get():
        return
    using = using or router.db_for_write(sender)
    attributes = [f.attribute for _, f in watchers]
    old = sender._base_manager.using(using).filter(pk=instance.pk).values(*attributes).first()
    left: dict[str, list] = {}
    for source, follow in watchers:
        previous = old and old[follow.attribute]
        if previous is not None and previous != getattr(instance, follow.attribute, None):
            left.setdefault(source.name, []).append(previous)
    if left:
        instance.__dict__["_ragchat_left"] = left


def _through_pks(through, instance, model) -> list:
    """The primary keys of ``model`` linked to ``instance`` through ``through`` (before a clear)."""
    to_instance = next((f for f in through._meta.fields if f.is_relation and f.related_model is type(instance)), None)
    to_model = next((f for f in through._meta.fields if f.is_relation and f.related_model is model
                     and f is not to_instance), to_instance)
    if to_instance is None or to_model is None:
        return []
    return list(through._base_manager.filter(**{to_instance.attname: instance.pk})
                .values_list(to_model.attname, flat=True))


def on_m2m(sender, instance, action, model, pk_set, using=None, **kwargs) -> None:
    """Either side of a many-to-many relation may be a source's model (or a dependency). The
    objects a clear unlinks are read before it (``pre_clear``) and synced after (``post_clear``)."""
    if action not in ("post_add", "post_remove", "pre_clear", "post_clear"):
        return
    watchers = _watchers(model)
    if action == "pre_clear":
        if watchers:
            instance.__dict__.setdefault("_ragchat_cleared", {})[sender] = _through_pks(sender, instance, model)
        return
    using = using or router.db_for_write(type(instance))
    on_save(type(instance), instance, using=using)  # this side's objects
    if not watchers:
        return
    if action == "post_clear":
        pks = instance.__dict__.get("_ragchat_cleared", {}).pop(sender, [])
    else:
        pks = list(pk_set or ())
    if not pks:
        return
    if any(follow.kind != "self" for _, follow in watchers):  # a dependency: follow each object
        for obj in model._base_manager.using(using).filter(pk__in=pks):
            on_save(model, obj, using=using)
        return
    for source, _ in watchers:
        if source.live:
            schedule(source.name, pks, using)


def connect() -> None:
    """Listen to every model's changes (called once, from ``AppConfig.ready``)."""
    post_save.connect(on_save, dispatch_uid="ragchat_sources_save")
    post_delete.connect(on_delete, dispatch_uid="ragchat_sources_delete")
    pre_save.connect(before_save, dispatch_uid="ragchat_sources_before_save")
    pre_delete.connect(before_delete, dispatch_uid="ragchat_sources_before_delete")
    m2m_changed.connect(on_m2m, dispatch_uid="ragchat_sources_m2m")
