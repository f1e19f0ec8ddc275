"""Syncing a model source into the index: every object, the recent changes, or given objects.

``sync(source)`` reads ``source.get_queryset()`` in batches of ``source.batch_size``, builds each
object's document (``ModelSource.entry``) and stores it with ``ingestion.store_documents`` in
every embedding space the source's profiles use. It is idempotent: an object whose text, title,
metadata and access are unchanged is not embedded again; a change of access alone is stored in
place, with nothing embedded; objects that left the queryset (deleted, unpublished, or readable
by nobody) are removed with their chunks. ``since`` syncs only the objects whose
``updated_field`` is at least that recent, and still removes what left the queryset (a bulk
``update()`` sends no signal: this is how it is caught). ``pks`` syncs given objects: what live
sync's task does; on PostgreSQL it also asks for the HNSW index of a space it wrote that has
none (``search.postgres.index_when_committed``: built after the commit while the space is
small), since no command may ever run for a site that only saves objects. A whole sync leaves
that to its caller, which builds once at the end (``ragchat_sync``, the admin's resync).

An object whose text cannot be built (the site's method raised), embedded or stored fails alone,
and what was stored for it before is kept.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from django_ragchat.ingestion.pipeline import CREATED, FAILED, UNCHANGED, UPDATED, store_documents
from django_ragchat.models import Chunk, Document, SourceState
from django_ragchat.plugins import embedder_for
from django_ragchat.profiles import get_profile, profile_names
from django_ragchat.search import postgres
from django_ragchat.sources.base import ModelSource

logger = logging.getLogger(__name__)

#: Documents removed per transaction.
REMOVE_BATCH_SIZE = 500
#: ``progress(done, total, label)``: called after each batch of objects.
ProgressCallback = Callable[[int, int, str], None]

FULL, SINCE, OBJECTS = "full", "since", "objects"
OUTCOMES = ("created", "updated", "access", "unchanged", "removed", "failed")


@dataclass
class SyncReport:
    """What one sync did. ``objects``: objects looked at; ``access``: objects whose access alone
    changed (stored in place, nothing embedded); ``removed``: documents removed (deleted,
    unpublished, readable by nobody); ``failures``: (primary key, reason)."""

    source: str
    mode: str = FULL
    objects: int = 0
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    failures: list[tuple[str, str]] = field(default_factory=list)
    chunks_written: int = 0
    elapsed: float = 0.0
    build_seconds: float = 0.0
    embed_seconds: float = 0.0
    store_seconds: float = 0.0
    embed_calls: int = 0
    #: The embedding spaces this sync wrote chunks to.
    spaces_written: set[str] = field(default_factory=set)

    def summary(self) -> str:
        """One line: the counts, the chunks written and where the time went."""
        counts = ", ".join(f"{n} {'access only' if name == 'access' else name}" for name, n in self.counts.items())
        return (f"{self.source} ({self.mode}): {self.objects} object(s): {counts}; {self.chunks_written} chunk(s) "
                f"written in {self.elapsed:.2f}s (text {self.build_seconds:.2f}s, embed {self.embed_seconds:.2f}s in "
                f"{self.embed_calls} call(s), store {self.store_seconds:.2f}s)")

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "mode": self.mode, "objects": self.objects, "counts": dict(self.counts),
                "failures": [list(f) for f in self.failures[:100]], "chunks_written": self.chunks_written,
                "elapsed": round(self.elapsed, 3), "embed_seconds": round(self.embed_seconds, 3),
                "embed_calls": self.embed_calls}


_DURATION = re.compile(r"^\s*(\d+)\s*([smhdw])\s*$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_since(value: str, now: datetime | None = None) -> datetime:
    """``--since``: a duration back from now ("90s", "30m", "2h", "1d", "1w") or an ISO 8601
    date or date-time (naive ones in the current time zone). ``ValueError`` otherwise."""
    now = now or timezone.now()
    match = _DURATION.match(value or "")
    if match:
        return now - timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})
    moment = parse_datetime(value or "")
    if moment is None:
        day = parse_date(value or "")
        moment = datetime(day.year, day.month, day.day) if day else None
    if moment is None:
        raise ValueError(f"{value!r} is neither a duration (90s, 30m, 2h, 1d, 1w) nor an ISO date or date-time.")
    return timezone.make_aware(moment) if timezone.is_naive(moment) else moment


def embedders_for(source: ModelSource) -> list:
    """One embedder per embedding space of the source's profiles (all profiles when ``None``)."""
    found: dict[str, Any] = {}
    for name in source.profiles or profile_names():
        try:
            embedder = embedder_for(get_profile(name))
        except Exception:  # noqa: BLE001 - a broken profile is reported by its system check
            logger.warning("Model source %s: profile %s has no usable embedder", source.name, name, exc_info=True)
            continue
        found.setdefault(embedder.space, embedder)
    return list(found.values())


def remove(source: ModelSource, object_pks: Iterable[str]) -> int:
    """Remove the documents (and chunks) of these objects of ``source``; returns how many.
    Answers that cited them keep their source labels (``MessageSource.chunk`` becomes null)."""
    object_pks = list(object_pks)
    removed = 0
    for start in range(0, len(object_pks), REMOVE_BATCH_SIZE):
        batch = object_pks[start:start + REMOVE_BATCH_SIZE]
        with transaction.atomic():
            ids = list(Document.objects.filter(origin=source.name, object_pk__in=batch).values_list("pk", flat=True))
            if ids:
                # only("id"): the delete collector need not load texts and embeddings.
                Chunk.objects.filter(document_id__in=ids).only("id").delete()
                removed += Document.objects.filter(pk__in=ids).delete()[1].get(Document._meta.label, 0)
    return removed


def _plan(source: ModelSource, pks: list | None, since: datetime | None) -> tuple[list, list[str]]:
    """(primary keys to sync, in order; object keys to remove)."""
    queryset = source.get_queryset()
    if pks is not None:
        wanted, keys = [], {}
        for value in dict.fromkeys(str(pk) for pk in pks):
            try:
                pk = source.get_model()._meta.pk.to_python(value)
            except ValidationError:
                continue  # no object can have it; nor can a document
            wanted.append(pk)
            keys[pk] = value
        present = set()
        for start in range(0, len(wanted), REMOVE_BATCH_SIZE):
            present.update(queryset.filter(pk__in=wanted[start:start + REMOVE_BATCH_SIZE])
                           .values_list("pk", flat=True))
        return [pk for pk in wanted if pk in present], [keys[pk] for pk in wanted if pk not in present]
    every = list(queryset.order_by("pk").values_list("pk", flat=True))
    indexed = set(Document.objects.filter(origin=source.name).values_list("object_pk", flat=True))
    gone = sorted(indexed - {str(pk) for pk in every})
    if since is not None and source.updated_field:
        every = list(queryset.filter(**{f"{source.updated_field}__gte": since}).order_by("pk")
                     .values_list("pk", flat=True))
    return every, gone


def _build(source: ModelSource, objects: list, report: SyncReport) -> tuple[list, list[str]]:
    """(document entries, keys of objects readable by nobody) of one batch; failures counted."""
    entries, nobody = [], []
    started = time.perf_counter()
    for obj in objects:
        try:
            entry = source.entry(obj)
        except Exception as exc:  # the site's text(), title(), access()... raised: this object fails alone
            logger.warning("Model source %s: object %s could not be built", source.name, obj.pk, exc_info=True)
            report.failures.append((str(obj.pk), f"{type(exc).__name__}: {exc}"[:500]))
            report.counts["failed"] += 1
            continue
        if entry is None:
            nobody.append(str(obj.pk))
        else:
            entries.append(entry)
    report.build_seconds += time.perf_counter() - started
    return entries, nobody


def _store(entries: list, embedders: list, report: SyncReport) -> None:
    """Store one batch in every space; the first space's outcome is the object's."""
    for position, embedder in enumerate(embedders):
        stored = store_documents(entries, embedder)
        report.embed_seconds += stored.embed_seconds
        report.store_seconds += stored.store_seconds
        report.embed_calls += stored.embed_calls
        report.chunks_written += stored.chunks_written
        if stored.chunks_written:
            report.spaces_written.add(embedder.space)
        for result in stored.results:
            if result.status == FAILED:
                report.failures.append((result.source.split(":", 1)[-1], result.reason))
            if position:
                continue
            if result.status == UPDATED and result.reason == "access":
                report.counts["access"] += 1
            else:
                report.counts[{CREATED: "created", UPDATED: "updated", UNCHANGED: "unchanged",
                               FAILED: "failed"}[result.status]] += 1


def sync(source: ModelSource, *, pks: Iterable | None = None, since: datetime | None = None,
         progress: ProgressCallback | None = None) -> SyncReport:
    """Sync ``source`` (see the module docstring) and record the run on its ``SourceState``."""
    started = time.perf_counter()
    mode = OBJECTS if pks is not None else (SINCE if since is not None and source.updated_field else FULL)
    report = SyncReport(source.name, mode)
    begun = timezone.now()
    to_sync, gone = _plan(source, list(pks) if pks is not None else None, since)
    report.counts["removed"] += remove(source, gone)
    embedders = embedders_for(source)
    queryset = source.get_queryset()
    for start in range(0, len(to_sync), source.batch_size):
        batch = to_sync[start:start + source.batch_size]
        by_pk = {obj.pk: obj for obj in queryset.filter(pk__in=batch)}
        objects = [by_pk[pk] for pk in batch if pk in by_pk]  # one deleted meanwhile is skipped
        report.objects += len(objects)
        entries, nobody = _build(source, objects, report)
        report.counts["removed"] += remove(source, nobody)
        if entries and embedders:
            _store(entries, embedders, report)
        if progress is not None:
            progress(min(start + len(batch), len(to_sync)), len(to_sync), source.name)
    report.elapsed = time.perf_counter() - started
    _record(report, begun)
    if mode == OBJECTS:
        # Live sync may be the first to write a space (no ragchat_sync ran): its vector index.
        postgres.index_when_committed(sorted(report.spaces_written))
    return report


def _record(report: SyncReport, begun: datetime) -> None:
    """Keep what the run did on the source's ``SourceState`` (the admin shows it)."""
    now = timezone.now()
    error = "; ".join(f"{pk}: {reason}" for pk, reason in report.failures[:5])
    fields: dict[str, Any] = {"last_error": error[:2000]}
    if report.mode == OBJECTS:
        fields["last_live_sync_at"] = now
    else:
        fields.update(last_sync_started_at=begun, last_sync_finished_at=now, last_sync=report.as_dict())
    SourceState.objects.update_or_create(name=report.source, defaults=fields)
