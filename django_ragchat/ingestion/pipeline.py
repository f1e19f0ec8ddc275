"""Ingestion into the database: files or text become ``Document`` and embedded ``Chunk`` rows.

``loaders`` and ``chunking`` (pure Python) parse and split; this module embeds and stores:

* ``ingest_paths(paths)`` expands files and folders, loads, chunks, embeds with the profile's
  embedder and stores. Texts are embedded in batches of ``batch_size`` *across* documents (ten
  small files make one embedding call, not ten) and rows are written with ``bulk_create``.
* ``ingest_text(source, text)`` does the same for text that does not come from a file.
* ``store_documents(entries)`` stores documents already loaded, each with its own metadata and
  access (the model sources of ``django_ragchat.sources`` use it).
* ``reembed(embedder)`` embeds the chunks already stored into another embedder's space
  (``ragchat_reembed`` uses it when a site changes embedding model).

Access: every document and its chunks store who may read them (``access``, principal tokens,
see ``django_ragchat.access``); public unless given.

Idempotency: a document is *unchanged*, and skipped without being parsed, when its checksum
and metadata equal the stored ones and it has chunks in the embedder's space. When only its
access changed, the access of the document and its chunks is updated in place, with nothing
embedded again (reported as ``updated``). Otherwise its
chunks are replaced atomically (a savepoint per document; the documents one embedding batch
finishes share a transaction and a commit), so a failure (unreadable file, embedder down,
database error) never loses what was stored before: the old chunks stay until the new ones are
committed.

Every chunk of a document describes its current text: when a document's content (or metadata)
changed, its chunks in *other* embedding spaces are deleted too, since they describe the old
text. Ingest again with the other profile, or run ``reembed``, to fill those spaces again.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from django.db import DatabaseError, transaction
from django.db.models import Count, Q
from django.utils import timezone

from django_ragchat.access import access_tokens, public_access
from django_ragchat.ingestion.chunking import chunk_document
from django_ragchat.ingestion.loaders import (
    DocumentLoadError,
    LoadedDocument,
    iter_document_paths,
    load_document,
    load_text,
)
from django_ragchat.models import Chunk, Document
from django_ragchat.plugins import embedder_for, get_registry
from django_ragchat.profiles import get_profile
from django_ragchat.search import configured_spaces, postgres, store_chunks
from django_ragchat.tokens import count_tokens

logger = logging.getLogger(__name__)

__all__ = ["CREATED", "FAILED", "STATUSES", "UNCHANGED", "UPDATED", "DocumentEntry", "IngestReport", "IngestResult",
           "chunk_analyser", "chunk_reader", "ingest_paths", "ingest_text", "reembed", "refresh_analyses", "set_access",
           "store_documents"]

CREATED = "created"
UPDATED = "updated"
UNCHANGED = "unchanged"
FAILED = "failed"
STATUSES = (CREATED, UPDATED, UNCHANGED, FAILED)

#: Rows per INSERT statement when storing chunks.
STORE_BATCH_SIZE = 500
#: Documents looked up per query (keeps ``IN (...)`` lists well under SQLite's variable limit).
LOOKUP_BATCH_SIZE = 500

_SOURCE_MAX = Document._meta.get_field("source").max_length
_TITLE_MAX = Document._meta.get_field("title").max_length
_HEADING_MAX = Chunk._meta.get_field("heading").max_length

#: ``progress(done, total, source)``: called each time one document's outcome is final.
ProgressCallback = Callable[[int, int, str], None]


@dataclass
class IngestResult:
    """What happened to one document.

    ``status`` is one of ``created``, ``updated``, ``unchanged`` or ``failed`` (then ``reason``
    says why; an update of the access alone, with nothing embedded, has the reason ``access``). ``chunks`` is the number of chunks the document has in the embedding space after
    the run (0 when it failed). ``path`` is the file as found ("" for text and re-embedding).
    """

    source: str
    status: str = ""
    chunks: int = 0
    reason: str = ""
    document_id: int | None = None
    path: str = ""
    # The exception behind a failure, for callers that re-raise it (ingest_text does).
    error: BaseException | None = field(default=None, repr=False, compare=False)
    # Other sources the same file may be stored under by an earlier run (``_spellings``).
    other_sources: tuple[str, ...] = field(default=(), repr=False, compare=False)

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "path": self.path, "status": self.status, "chunks": self.chunks,
                "reason": self.reason, "document_id": self.document_id}


@dataclass
class IngestReport:
    """The outcome of ``ingest_paths`` or ``reembed``: one ``IngestResult`` per document (in
    input order), and where the time went.

    ``load_seconds`` is reading, parsing and chunking; ``embed_seconds`` the embedder's calls
    (``embed_calls`` of them, ``embedded_texts`` texts in all); ``store_seconds`` the database
    writes. ``elapsed`` is the wall time of the whole run.
    """

    space: str
    results: list[IngestResult] = field(default_factory=list)
    elapsed: float = 0.0
    load_seconds: float = 0.0
    embed_seconds: float = 0.0
    store_seconds: float = 0.0
    embed_calls: int = 0
    embedded_texts: int = 0
    analyse_seconds: float = 0.0  # the answerer's reading of the chunks (``chunk_analyser``)

    def count(self, status: str) -> int:
        return sum(1 for r in self.results if r.status == status)

    @property
    def counts(self) -> dict[str, int]:
        """Documents per status, every status present."""
        return {status: self.count(status) for status in STATUSES}

    @property
    def failed(self) -> list[IngestResult]:
        return [r for r in self.results if r.status == FAILED]

    @property
    def chunks_written(self) -> int:
        """Chunks inserted by this run (those of created and updated documents)."""
        return sum(r.chunks for r in self.results if r.status in (CREATED, UPDATED))

    def summary(self) -> str:
        """One line: counts, chunks written, the space, and where the time went."""
        counts = ", ".join(f"{n} {status}" for status, n in self.counts.items())
        return (
            f"{len(self.results)} document(s): {counts}; {self.chunks_written} chunk(s) written "
            f"in space {self.space} in {self.elapsed:.2f}s (load {self.load_seconds:.2f}s, "
            f"embed {self.embed_seconds:.2f}s in {self.embed_calls} call(s), "
            f"store {self.store_seconds:.2f}s)"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "space": self.space, "counts": self.counts, "chunks_written": self.chunks_written,
            "elapsed": self.elapsed, "load_seconds": self.load_seconds,
            "embed_seconds": self.embed_seconds, "store_seconds": self.store_seconds,
            "embed_calls": self.embed_calls, "embedded_texts": self.embedded_texts,
            "results": [r.as_dict() for r in self.results],
        }


# --- Embedding in batches across documents ----------------------------------------------------


class _Job:
    """One document's texts waiting for vectors."""

    __slots__ = ("payload", "texts", "vectors", "missing", "error", "done", "analyses")

    def __init__(self, payload: Any, texts: list[str]):
        self.payload = payload
        self.texts = texts
        self.vectors: np.ndarray | None = None
        self.missing = len(texts)
        self.error: BaseException | None = None
        self.done = False
        self.analyses: list[bytes | None] | None = None  # Chunk.analysis of each chunk


class _EmbeddingBatcher:
    """Embeds the texts of many documents, ``batch_size`` texts per embedder call whatever the
    document boundaries, and hands each document back once all its vectors are in (or once one
    of its batches failed: the rest of its texts are then not embedded)."""

    def __init__(self, embedder, batch_size: int, report: IngestReport):
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, not {batch_size}")
        self.embedder = embedder
        self.batch_size = batch_size
        self.report = report
        self.queue: deque[tuple[_Job, int]] = deque()

    def add(self, payload: Any, texts: list[str]) -> list[_Job]:
        """Queue a document's texts; return the documents finished by the batches this filled."""
        job = _Job(payload, texts)
        if not texts:
            job.done = True
            return [job]
        self.queue.extend((job, i) for i in range(len(texts)))
        finished = []
        while len(self.queue) >= self.batch_size:
            finished += self._run_batch()
        return finished

    def finish(self) -> list[_Job]:
        """Embed whatever is queued; return the documents that finished."""
        finished = []
        while self.queue:
            finished += self._run_batch()
        return finished

    def _run_batch(self) -> list[_Job]:
        batch = [self.queue.popleft() for _ in range(min(self.batch_size, len(self.queue)))]
        batch = [(job, i) for job, i in batch if job.error is None]  # a failed document's rest is dropped
        if not batch:
            return []
        jobs = list(dict.fromkeys(job for job, _ in batch))
        started = time.perf_counter()
        try:
            vectors = np.asarray(self.embedder.embed([job.texts[i] for job, i in batch]), dtype=np.float32)
            if vectors.ndim != 2 or vectors.shape[0] != len(batch):
                raise ValueError(f"the embedder returned an array of shape {vectors.shape} "
                                 f"for {len(batch)} texts")
        except Exception as exc:  # a model server down or a broken plugin: these documents fail, others go on
            logger.warning("Embedding %d text(s) in space %s failed", len(batch), self.report.space,
                           exc_info=True)
            for job in jobs:
                job.error = exc
        else:
            for (job, i), vector in zip(batch, vectors):
                if job.vectors is None:
                    job.vectors = np.empty((len(job.texts), vectors.shape[1]), dtype=np.float32)
                job.vectors[i] = vector
                job.missing -= 1
        finally:
            self.report.embed_seconds += time.perf_counter() - started
            self.report.embed_calls += 1
            self.report.embedded_texts += len(batch)
        finished = []
        for job in jobs:
            if not job.done and (job.error is not None or job.missing == 0):
                job.done = True
                finished.append(job)
        return finished


def _embedding_failure(exc: BaseException) -> str:
    return f"embedding failed: {exc}"


def insert_chunks(chunks: list[Chunk]) -> None:
    """Insert new ``Chunk`` rows: the one place ingestion and re-embedding write chunks (called
    inside their per-document transaction). Binary COPY on PostgreSQL, ``bulk_create`` of
    ``STORE_BATCH_SIZE`` rows per statement elsewhere (``django_ragchat.search.store_chunks``)."""
    store_chunks(chunks, batch_size=STORE_BATCH_SIZE)


# --- Ingesting documents --------------------------------------------------------------------


@dataclass
class _Existing:
    """What is stored for a source, as far as deciding "unchanged" needs."""

    id: int
    title: str
    checksum: str
    metadata: dict
    access: list
    chunks_in_space: int
    chunks_total: int


def _existing_documents(sources: list[str], space: str) -> dict[str, _Existing]:
    found: dict[str, _Existing] = {}
    for start in range(0, len(sources), LOOKUP_BATCH_SIZE):
        rows = (
            Document.objects.filter(source__in=sources[start:start + LOOKUP_BATCH_SIZE])
            .annotate(in_space=Count("chunks", filter=Q(chunks__space=space)), total=Count("chunks"))
            .values_list("source", "id", "title", "checksum", "metadata", "access", "in_space", "total")
        )
        for source, *rest in rows:
            found[source] = _Existing(*rest)
    return found


def _is_unchanged(existing: _Existing | None, checksum: str | None, metadata: dict) -> bool:
    """The stored text and metadata are these, and embedded in the space (access aside)."""
    # A document with no chunks at all (an empty file) is complete in every space.
    return (existing is not None and checksum == existing.checksum and existing.metadata == metadata
            and (existing.chunks_in_space > 0 or existing.chunks_total == 0))


def set_access(document_id: int, access: list[str]) -> int:
    """Store ``access`` on a document and its chunks (nothing embedded again); returns the
    number of chunks. The document's ``updated_at`` changes with it, which the in-process
    vector index and the subject index watch."""
    with transaction.atomic():
        Document.objects.filter(pk=document_id).update(access=list(access), updated_at=timezone.now())
        return Chunk.objects.filter(document_id=document_id).update(access=list(access))


def _checked_access(access) -> list[str]:
    """``access`` (see ``django_ragchat.access.access_tokens``) as stored; public when ``None``."""
    return public_access() if access is None else list(access_tokens(access))


def _keep_or_set_access(result: IngestResult, stored: _Existing, access: list[str]) -> None:
    """``result`` of an unchanged document: ``unchanged``, or ``updated`` when only its access
    changed (stored in place)."""
    result.document_id, result.chunks = stored.id, stored.chunks_in_space
    if sorted(stored.access or ()) == sorted(access):
        result.status = UNCHANGED
    else:
        set_access(stored.id, access)
        result.status, result.reason = UPDATED, "access"


class _Run:
    """Bookkeeping shared by ingestion and re-embedding: the report, the batcher, progress."""

    def __init__(self, embedder, *, batch_size: int, progress: ProgressCallback | None, total: int,
                 report: IngestReport, analyse: Analyser | None = None):
        self.space = embedder.space
        self.report = report
        self.analyse = analyse
        self.batcher = _EmbeddingBatcher(embedder, batch_size, report)
        self.progress = progress
        self.total = total
        self.done = 0

    def finalize(self, result: IngestResult) -> None:
        """``result``'s outcome is final: count it and report progress."""
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, self.total, result.source)

    def fail(self, result: IngestResult, reason: str, error: BaseException | None = None) -> None:
        result.status, result.reason, result.error, result.chunks = FAILED, reason, error, 0
        self.finalize(result)

    def finish(self) -> None:
        """Embed what is still queued and store it."""
        self.store_finished(self.batcher.finish())

    def store_finished(self, jobs: list[_Job]) -> None:
        """Store each document whose vectors are complete; fail those whose embedding failed.

        The documents finished by one embedding batch share a transaction (one commit, which is
        most of the cost of a small document), each inside its own savepoint: a document whose
        writes fail is rolled back alone, and the others are committed.
        """
        for job in jobs:
            if job.error is not None:
                self.fail(job.payload[0], _embedding_failure(job.error), job.error)
        jobs = [job for job in jobs if job.error is None]
        if not jobs:
            return
        self.analyse_jobs(jobs)
        started = time.perf_counter()
        stored: list[IngestResult] = []
        try:
            with transaction.atomic():
                for job in jobs:
                    result = job.payload[0]
                    try:
                        with transaction.atomic():
                            self.store(job)
                    except DatabaseError as exc:
                        logger.warning("Storing %s in space %s failed", result.source, self.space, exc_info=True)
                        self.fail(result, f"database error: {exc}", exc)
                    else:
                        stored.append(result)
        except DatabaseError as exc:  # the commit itself failed: nothing of this batch was stored
            logger.warning("Committing %d document(s) in space %s failed", len(stored), self.space, exc_info=True)
            for result in stored:
                result.document_id = None if result.status == CREATED else result.document_id
                self.fail(result, f"database error: {exc}", exc)
        else:
            for result in stored:
                self.finalize(result)
        finally:
            self.report.store_seconds += time.perf_counter() - started

    def analyse_jobs(self, jobs: list[_Job]) -> None:
        """Each job's ``analyses``: the answerer's reading of its chunks (``chunk_analyser``),
        made before the transaction; a reading that fails is left out (the turn reads the text)."""
        if self.analyse is None:
            return
        started = time.perf_counter()
        for job in jobs:
            chunks = self.chunk_texts(job)
            try:
                job.analyses = list(self.analyse(chunks))
            except Exception:  # noqa: BLE001 - a reading is an optimisation: never a failed document
                logger.warning("Reading %d chunk(s) for the answerer failed", len(chunks), exc_info=True)
        self.report.analyse_seconds += time.perf_counter() - started

    def chunk_texts(self, job: _Job) -> list[tuple[str, str, str]]:
        """(text, heading, document title) of each chunk of ``job``, as they are stored."""
        raise NotImplementedError

    def store(self, job: _Job) -> None:
        raise NotImplementedError


class _Ingestion(_Run):
    """Loaded documents in, stored documents out."""

    def __init__(self, embedder, *, metadata: dict, access: list[str] | None = None, **kwargs: Any):
        super().__init__(embedder, **kwargs)
        self.metadata = metadata
        self.access = access if access is not None else public_access()

    def submit(self, result: IngestResult, loaded: LoadedDocument, title: str = "",
               document: dict | None = None) -> None:
        """Chunk ``loaded`` and queue its texts; documents whose vectors are complete get stored.
        ``document`` overrides the run's fields for this one (``metadata``, ``access``,
        ``origin``, ``object_pk``, ``checksum``)."""
        started = time.perf_counter()
        chunks = chunk_document(loaded)
        self.report.load_seconds += time.perf_counter() - started
        fields = {"title": (title or loaded.title)[:_TITLE_MAX], "checksum": loaded.checksum,
                  "content_type": loaded.content_type, "metadata": self.metadata, "access": self.access,
                  **(document or {})}
        self.store_finished(self.batcher.add((result, fields, chunks), [c.text for c in chunks]))

    def chunk_texts(self, job: _Job) -> list[tuple[str, str, str]]:
        _, fields, chunks = job.payload
        return [(chunk.text, chunk.heading[:_HEADING_MAX], fields["title"]) for chunk in chunks]

    def store(self, job: _Job) -> None:
        """Replace the document's chunks (``store_finished`` runs this in a savepoint of its own)."""
        result, fields, chunks = job.payload
        document = Document.objects.select_for_update().filter(source=result.source).first()
        if document is None:
            document = Document.objects.create(source=result.source, **fields)
            result.status = CREATED
        else:
            stale = Chunk.objects.filter(document=document)
            if document.checksum == fields["checksum"] and document.metadata == fields["metadata"]:
                stale = stale.filter(space=self.space)  # other spaces still describe this text
            # only("id"): the delete collector need not load texts and embeddings.
            stale.only("id").delete()
            if sorted(document.access or ()) != sorted(fields["access"]):
                # The chunks of other spaces kept above are read by the same people.
                Chunk.objects.filter(document=document).update(access=list(fields["access"]))
            for name, value in fields.items():
                setattr(document, name, value)
            document.save()
            result.status = UPDATED
        insert_chunks([
            Chunk(document=document, ordinal=chunk.ordinal, text=chunk.text,
                  heading=chunk.heading[:_HEADING_MAX], space=self.space, embedding=vector,
                  token_count=count_tokens(chunk.text), access=list(fields["access"]),
                  metadata={**fields["metadata"], "heading_path": list(chunk.heading_path)}, analysis=analysis)
            for chunk, vector, analysis in zip(chunks, job.vectors if job.vectors is not None else (),
                                               job.analyses or [None] * len(chunks))
        ])
        result.document_id = document.pk
        result.chunks = len(chunks)


def _embedder_for(profile: str | None):
    return embedder_for(get_profile(profile))


#: ``analyse([(text, heading, document title), ...])``: each chunk's ``Chunk.analysis``.
Analyser = Callable[[list[tuple[str, str, str]]], list[bytes | None]]


def chunk_reader(space: str, profiles: Iterable[str | None] = ()) -> Any:
    """The answerer whose reading ingestion stores with each chunk of ``space``
    (``Chunk.analysis``): the first of ``profiles`` (None: the default), then of the profiles
    searching ``space``, whose embedder is of ``space`` and whose answerer's class reads chunks
    (its ``chunk_reader(profile)`` gives the instance the turns use, with ``analyse_chunks`` and
    ``is_current``: the extractive one, ``django_ragchat.answerer.stored``); None when none does
    (nothing is stored: a turn reads the text)."""
    for name in dict.fromkeys([*profiles, *configured_spaces().get(space, [])]):
        found = get_profile(name)
        if embedder_for(found).space != space:
            continue
        reader = getattr(get_registry().get("llm", found.llm).cls, "chunk_reader", None)
        if reader is not None:
            return reader(found)
    return None


def chunk_analyser(space: str, profiles: Iterable[str | None] = ()) -> Analyser | None:
    """``chunk_reader(space, profiles).analyse_chunks``, or None."""
    reader = chunk_reader(space, profiles)
    return reader.analyse_chunks if reader is not None else None


def refresh_analyses(profile: str | None = None, *, batch_size: int = 200) -> tuple[int, int]:
    """Store the answerer's reading again for the chunks of ``profile``'s space whose stored one
    is missing or was made with other code, language data or model (``ragchat_reembed
    --analysis``, after such a change: until then a turn reads those chunks from their text).
    Returns (chunks read again, chunks in the space)."""
    space = _embedder_for(profile).space
    reader = chunk_reader(space, [profile])
    chunks = Chunk.objects.filter(space=space)
    if reader is None:
        return 0, chunks.count()
    refreshed, seen, last = 0, 0, 0
    while True:
        rows = list(chunks.filter(pk__gt=last).order_by("pk")
                    .values_list("pk", "text", "heading", "document__title", "analysis")[:batch_size])
        if not rows:
            return refreshed, seen
        seen, last = seen + len(rows), rows[-1][0]
        stale = [row for row in rows if not reader.is_current(row[4])]
        if stale:
            readings = reader.analyse_chunks([(text, heading, title) for _, text, heading, title, _ in stale])
            Chunk.objects.bulk_update([Chunk(pk=row[0], analysis=reading) for row, reading in zip(stale, readings)],
                                      ["analysis"])
            refreshed += len(stale)


def _check_metadata(metadata: dict | None) -> dict:
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise TypeError(f"metadata must be a dict, not {type(metadata).__name__}")
    return dict(metadata)


def _spellings(path: Path) -> list[str]:
    """The sources a file may be stored under without a root, the one to store first: relative to
    the working folder when inside it, else absolute. Then the absolute path and the path as
    given, which earlier versions stored: "docs/a.md", "./docs/a.md" and "/srv/site/docs/a.md"
    are one document."""
    absolute = Path(os.path.abspath(path))
    spellings = []
    for base, target in ((Path.cwd(), absolute), (Path.cwd().resolve(), absolute.resolve())):
        with contextlib.suppress(ValueError):
            spellings.append(target.relative_to(base).as_posix())
            break
    spellings += [absolute.as_posix(), path.as_posix()]
    return list(dict.fromkeys(spellings))


def _source_for(path: Path, root: Path | None) -> str:
    """The stored source of a file: relative to ``root`` when given, else ``_spellings``' first."""
    if root is None:
        return _spellings(path)[0]
    try:
        return path.resolve().relative_to(root).as_posix()
    except ValueError:
        raise DocumentLoadError(path, f"not inside the root folder {root}") from None


def _expand(paths: Iterable[str | Path], root: Path | None) -> list[IngestResult]:
    """One result per document file under ``paths`` (failed already when unusable)."""
    results: list[IngestResult] = []
    seen: set[str] = set()
    for given in paths:
        try:
            found = list(iter_document_paths([Path(given)]))
        except DocumentLoadError as exc:  # a folder that cannot be listed
            results.append(IngestResult(source=Path(given).as_posix(), path=str(given), status=FAILED,
                                        reason=exc.reason, error=exc))
            continue
        for path in found:
            result = IngestResult(source=path.as_posix(), path=str(path))
            try:
                result.source = _source_for(path, root)
                if root is None:
                    result.other_sources = tuple(_spellings(path)[1:])
                if len(result.source) > _SOURCE_MAX:
                    raise DocumentLoadError(path, f"the path is longer than {_SOURCE_MAX} characters")
            except DocumentLoadError as exc:
                result.status, result.reason, result.error = FAILED, exc.reason, exc
            # Two spellings of one file ("docs/a.md", "docs/../docs/a.md") ingest it once.
            key = os.path.realpath(path)
            if key not in seen:
                seen.add(key)
                results.append(result)
    return results


def _file_checksum(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None  # load_document will say what is wrong with it


def ingest_paths(paths: Iterable[str | Path], *, profile: str | None = None, root: str | Path | None = None,
                 metadata: dict | None = None, progress: ProgressCallback | None = None,
                 batch_size: int = 64, access: Any = None) -> IngestReport:
    """Ingest the Markdown, reStructuredText, HTML and text files in ``paths`` (files or folders).

    Each document is stored with ``source`` = its path relative to ``root`` when given (a file
    outside ``root`` fails), else relative to the working folder when inside it, else its
    absolute path (a file already stored under another of these spellings keeps its document); ``metadata`` is stored on the document and
    merged into each chunk's metadata (with the chunk's ``heading_path``). Chunks are embedded
    with ``profile``'s embedder, ``batch_size`` texts per call across documents.

    ``access`` says who may read them (``django_ragchat.access.access_tokens``: users, groups,
    permissions, tokens; ``None``: everyone).

    Unchanged documents are skipped; changed ones have their chunks replaced atomically; a file
    that cannot be read, embedded or stored is reported as failed and what was stored for it
    before is kept. ``progress(done, total, source)`` is called as each document's outcome
    becomes final. Raises ``ValueError`` for a bad ``root``, ``batch_size`` or ``access``
    (``InvalidAccess``), ``TypeError`` for non-dict metadata, and ``UnknownProfile`` for a
    profile that does not exist.
    """
    started = time.perf_counter()
    if isinstance(paths, (str, Path)):
        paths = [paths]
    metadata = _check_metadata(metadata)
    access = _checked_access(access)
    root_path = None
    if root is not None:
        root_path = Path(root).resolve()
        if not root_path.is_dir():
            raise ValueError(f"The root {root} is not a folder.")
    embedder = _embedder_for(profile)
    report = IngestReport(space=embedder.space)
    report.results = _expand(paths, root_path)
    run = _Ingestion(embedder, metadata=metadata, access=access, batch_size=batch_size, progress=progress,
                     total=len(report.results), report=report, analyse=chunk_analyser(embedder.space, [profile]))
    pending = [r for r in report.results if r.status != FAILED]
    for result in report.results:
        if result.status == FAILED:
            run.finalize(result)
    report.load_seconds += time.perf_counter() - started

    for start in range(0, len(pending), LOOKUP_BATCH_SIZE):
        _ingest_files(run, pending[start:start + LOOKUP_BATCH_SIZE])
    run.finish()
    report.elapsed = time.perf_counter() - started
    return report


def _ingest_files(run: _Ingestion, group: list[IngestResult]) -> None:
    """Load and submit one lookup group of files (unchanged ones are only counted)."""
    existing = _existing_documents([s for r in group for s in (r.source, *r.other_sources)], run.space)
    for result in group:
        t0 = time.perf_counter()
        path = Path(result.path)
        # A file stored by an earlier run under another spelling stays that document.
        result.source = next((s for s in (result.source, *result.other_sources) if s in existing), result.source)
        stored = existing.get(result.source)
        # Unchanged files are recognised from their bytes alone, without parsing them.
        if stored is not None and _is_unchanged(stored, _file_checksum(path), run.metadata):
            _keep_or_set_access(result, stored, run.access)
            run.report.load_seconds += time.perf_counter() - t0
            run.finalize(result)
            continue
        try:
            loaded = load_document(path)
        except DocumentLoadError as exc:
            run.report.load_seconds += time.perf_counter() - t0
            run.fail(result, exc.reason, exc)
            continue
        run.report.load_seconds += time.perf_counter() - t0
        run.submit(result, loaded)


def ingest_text(source: str, text: str, *, title: str = "", content_type: str = "markdown",
                metadata: dict | None = None, profile: str | None = None, access: Any = None) -> IngestResult:
    """Ingest ``text`` (Markdown, reStructuredText, HTML or plain text) as the document ``source``.

    The same rules as ``ingest_paths``: unchanged text (same checksum of the UTF-8 text, same
    metadata and title) is skipped; changed text replaces the document's chunks atomically. ``title``
    overrides the title found in the text; ``access`` is who may read it (as for
    ``ingest_paths``). Raises ``DocumentLoadError`` for text that cannot be
    ingested (unknown content type, NUL characters, empty or too long source), and re-raises
    the embedder's or the database's exception when those fail; nothing stored is lost then.
    On PostgreSQL, a space without its HNSW index gets one after the commit while it is small
    (``search.postgres.index_when_committed``): uploads may be all a space ever receives.
    """
    metadata = _check_metadata(metadata)
    access = _checked_access(access)
    if not source or len(source) > _SOURCE_MAX:
        raise DocumentLoadError(source or "<text>", f"the source must have 1 to {_SOURCE_MAX} characters")
    if not isinstance(text, str):
        raise DocumentLoadError(source, f"the text must be a string, not {type(text).__name__}")
    loaded = load_text(text, content_type, source=source)
    embedder = _embedder_for(profile)
    result = IngestResult(source=source)
    stored = _existing_documents([source], embedder.space).get(source)
    if _is_unchanged(stored, loaded.checksum, metadata) and stored.title == (title or loaded.title)[:_TITLE_MAX]:
        _keep_or_set_access(result, stored, access)
        return result
    run = _Ingestion(embedder, metadata=metadata, access=access, batch_size=64, progress=None, total=1,
                     report=IngestReport(space=embedder.space, results=[result]),
                     analyse=chunk_analyser(embedder.space, [profile]))
    run.submit(result, loaded, title)
    run.finish()
    if result.status == FAILED:
        raise result.error
    # One document, often the first of its space (an upload): no command builds its index.
    postgres.index_when_committed([embedder.space])
    return result


@dataclass
class DocumentEntry:
    """One document for ``store_documents``: its unique ``source``, its text (``loaded``, or
    ``text`` in ``content_type``, parsed only when the document changed), and what is stored
    with it. ``checksum`` defaults to the parsed text's; ``access`` is a list of tokens."""

    source: str
    loaded: LoadedDocument | None = None
    title: str = ""
    metadata: dict = field(default_factory=dict)
    access: list[str] = field(default_factory=public_access)
    origin: str = ""
    object_pk: str = ""
    checksum: str = ""
    text: str = ""
    content_type: str = "markdown"

    def load(self) -> LoadedDocument:
        """The parsed text (``DocumentLoadError`` when it cannot be)."""
        if self.loaded is None:
            self.loaded = load_text(self.text, self.content_type, source=self.source)
        return self.loaded


def store_documents(entries: Iterable[DocumentEntry], embedder, *, batch_size: int = 64,
                    progress: ProgressCallback | None = None, total: int = 0) -> IngestReport:
    """Store already loaded documents in ``embedder``'s space with the rules of ``ingest_paths``:
    unchanged ones (checksum, title, metadata; with chunks in the space) are skipped, an access
    change alone is stored in place, the others are embedded (``batch_size`` texts per call
    across documents) and replace their chunks atomically. ``entries`` is read in groups of
    ``LOOKUP_BATCH_SIZE`` (one lookup query each), so it may be a generator over a large table."""
    started = time.perf_counter()
    report = IngestReport(space=embedder.space)
    run = _Ingestion(embedder, metadata={}, batch_size=batch_size, progress=progress, total=total, report=report,
                     analyse=chunk_analyser(embedder.space))
    group: list[DocumentEntry] = []

    def flush() -> None:
        existing = _existing_documents([e.source for e in group], run.space)
        for entry in group:
            result = IngestResult(source=entry.source)
            report.results.append(result)
            checksum = entry.checksum or entry.load().checksum
            stored = existing.get(entry.source)
            if (_is_unchanged(stored, checksum, entry.metadata)
                    and stored.title == (entry.title or entry.load().title)[:_TITLE_MAX]):
                _keep_or_set_access(result, stored, entry.access)
                run.finalize(result)
                continue
            try:
                loaded = entry.load()
            except DocumentLoadError as exc:
                run.fail(result, exc.reason, exc)
                continue
            title = (entry.title or loaded.title)[:_TITLE_MAX]
            run.submit(result, loaded, title, {
                "metadata": entry.metadata, "access": list(entry.access), "origin": entry.origin,
                "object_pk": entry.object_pk, "checksum": checksum})
        group.clear()

    for entry in entries:
        group.append(entry)
        if len(group) >= LOOKUP_BATCH_SIZE:
            flush()
    if group:
        flush()
    run.finish()
    report.elapsed = time.perf_counter() - started
    return report


# --- Re-embedding into another space ----------------------------------------------------------


class _Reembedding(_Run):
    """Stored chunks in, copies in another space out."""

    def chunk_texts(self, job: _Job) -> list[tuple[str, str, str]]:
        return [(row["text"], row["heading"], row["document__title"]) for row in job.payload[1]]

    def store(self, job: _Job) -> None:
        result, rows = job.payload
        if Chunk.objects.filter(document_id=result.document_id, space=self.space).exists():
            result.status = UNCHANGED  # a concurrent run got there first
        else:
            insert_chunks([
                Chunk(document_id=result.document_id, ordinal=row["ordinal"], text=row["text"],
                      heading=row["heading"], space=self.space, embedding=vector,
                      token_count=row["token_count"], metadata=row["metadata"], access=row["access"],
                      analysis=analysis)
                for row, vector, analysis in zip(rows, job.vectors, job.analyses or [None] * len(rows))
            ])
            result.status = CREATED
        result.chunks = len(rows)


def _document_ids(documents) -> list[int]:
    if documents is None:
        return list(Document.objects.order_by("pk").values_list("pk", flat=True))
    if hasattr(documents, "values_list"):  # a queryset
        return list(documents.order_by("pk").values_list("pk", flat=True))
    return sorted({d.pk for d in documents})


def reembed(space_embedder, *, documents=None, batch_size: int = 64,
            progress: ProgressCallback | None = None) -> IngestReport:
    """Embed the chunks already stored into ``space_embedder``'s space (an ``Embedder``).

    For each document (``documents``: a queryset or iterable of ``Document``; all when
    ``None``) that has no chunks in the target space yet, its chunks are copied from another
    space (every space of a document holds the same texts, see the module docstring) with new
    embeddings, ``batch_size`` texts per embedder call across documents, atomically per
    document. The old space's rows stay until deleted. Results: ``created`` for a document
    embedded into the space, ``unchanged`` for one already there (or without chunks), ``failed``
    with the reason when embedding or storing it failed. Re-running after an interruption
    resumes where it stopped.
    """
    started = time.perf_counter()
    report = IngestReport(space=space_embedder.space)
    ids = _document_ids(documents)
    run = _Reembedding(space_embedder, batch_size=batch_size, progress=progress, total=len(ids), report=report,
                       analyse=chunk_analyser(space_embedder.space))
    for start in range(0, len(ids), LOOKUP_BATCH_SIZE):
        group = ids[start:start + LOOKUP_BATCH_SIZE]
        t0 = time.perf_counter()
        stored = (
            Document.objects.filter(pk__in=group).order_by("pk")
            .annotate(in_space=Count("chunks", filter=Q(chunks__space=run.space)))
            .values_list("pk", "source", "in_space")
        )
        rows_of: dict[int, list[dict]] = {}
        source_space: dict[int, str] = {}
        for row in (Chunk.objects.filter(document_id__in=group).exclude(space=run.space)
                    .order_by("document_id", "space", "ordinal")
                    .values("document_id", "space", "ordinal", "text", "heading", "token_count", "metadata",
                            "access", "document__title")):
            # One source space per document (the first by name): each holds the same texts.
            if source_space.setdefault(row["document_id"], row["space"]) == row["space"]:
                rows_of.setdefault(row["document_id"], []).append(row)
        report.load_seconds += time.perf_counter() - t0
        for pk, source, in_space in stored:
            result = IngestResult(source=source, document_id=pk)
            report.results.append(result)
            if in_space or pk not in rows_of:
                result.status, result.chunks = UNCHANGED, in_space
                run.finalize(result)
                continue
            rows = rows_of.pop(pk)
            run.store_finished(run.batcher.add((result, rows), [row["text"] for row in rows]))
    run.finish()
    report.elapsed = time.perf_counter() - started
    return report
