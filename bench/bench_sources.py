"""Model sources: how fast a model is synced into the index, against ``ragchat_ingest`` of the same
text as files, and what live sync costs the request that saves.

    .venv/bin/python bench/bench_sources.py              # SQLite file; 5,000 objects
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/ragchat .venv/bin/python bench/bench_sources.py
    .venv/bin/python bench/bench_sources.py --quick      # 200 objects, a smoke run

Data: ``Article`` rows of the tests' app (``tests/sources_app``), each a product page of three
sections from ``_setup.synthetic_chunks`` (about 1,600 characters, three chunks), synced by a
source like the docs' (``get_queryset``, ``text``, ``metadata``, ``access``). Embedding is
excluded: both paths use an embedder that hands out precomputed unit vectors (its time is still
measured and printed), so what is compared is everything else.

Measured, in one run on one database:

* **bulk sync, embedding excluded**: ``sources.sync`` of every object into empty tables (objects/s
  and chunks/s) beside ``ingestion.ingest_paths`` of the same Markdown written as files, in
  alternating rounds; then a second sync of the unchanged objects (nothing embedded) and a
  ``--since`` sync after a bulk ``update()`` of 1 % of them;
* **what a save() adds in a request with a worker backend**: a POST through Django's test client
  to a view that loads an article, changes its body and saves it (autocommit), with live sync
  on ``django_tasks_db``'s backend against the same request with live sync paused, interleaved:
  the SQL queries of each request and its median time; and the same request on the immediate
  backend (which syncs, embedding included, before save() returns).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._setup import describe_database, machine, median, percentile, synthetic_chunks, table
from django_ragchat import hookimpl

SECTIONS = 3
DIMENSIONS = 384


# --- The bench's plugin: a source and an embedder that costs nothing ---------------------------


def _source_class():
    from django_ragchat.sources import PUBLIC, ModelSource
    from tests.sources_app.models import Article

    class ArticleSource(ModelSource):
        name = "articles"
        model = Article
        updated_field = "updated_at"

        def get_queryset(self):
            return Article.objects.filter(published=True)

        def text(self, obj):
            return obj.body

        def metadata(self, obj):
            return {"published": obj.published}

        def access(self, obj):
            return [obj.owner] if obj.owner_id else PUBLIC

    return ArticleSource


def _embedder_class():
    from django_ragchat.stages.embedders import Embedder

    class PrecomputedEmbedder(Embedder):
        """Unit vectors from a fixed pool: embedding takes microseconds."""

        name = "precomputed"
        enabled_by_default = False
        pool = None

        @property
        def space(self) -> str:
            return f"precomputed-{DIMENSIONS}"

        def embed(self, texts):
            if PrecomputedEmbedder.pool is None:
                vectors = np.random.default_rng(5).standard_normal((4096, DIMENSIONS)).astype(np.float32)
                PrecomputedEmbedder.pool = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
            index = np.arange(len(texts)) % len(PrecomputedEmbedder.pool)
            return PrecomputedEmbedder.pool[index]

    return PrecomputedEmbedder


class Plugin:
    """Listed in ``RAGCHAT["PLUGINS"]`` as ``bench.bench_sources.plugin``."""

    @hookimpl
    def register_sources(self, register):
        register(_source_class())

    @hookimpl
    def register_embedders(self, register):
        register(_embedder_class())


plugin = Plugin()


def save_article(request, pk: int):
    """The view of the save measurements: a changed body, saved (``?paused=1``: no live sync)."""
    from django.http import HttpResponse

    from django_ragchat.sources import paused
    from tests.sources_app.models import Article

    article = Article.objects.get(pk=pk)
    article.body = f"{article.body.split('(edit')[0]}(edit {time.perf_counter()})"
    if request.GET.get("paused"):
        with paused():
            article.save()
    else:
        article.save()
    return HttpResponse(status=204)


def _urlpatterns():
    from django.urls import path

    return [path("articles/<int:pk>/save/", save_article)]


def __getattr__(name: str):
    if name == "urlpatterns":  # ROOT_URLCONF is this module: its URLs, made when Django asks
        return _urlpatterns()
    raise AttributeError(name)


def configure(tmpdir: str) -> None:
    import dj_database_url
    import django
    from django.conf import settings

    from bench._setup import _database_settings

    try:
        import django.tasks  # noqa: F401

        backends = "django.tasks.backends"
    except ImportError:
        backends = "django_tasks.backends"
    settings.configure(
        SECRET_KEY="bench", DEBUG=False, USE_TZ=True, LOGGING_CONFIG=None,
        INSTALLED_APPS=["django.contrib.auth", "django.contrib.contenttypes", "django_ragchat", "django_tasks_db",
                        "tests.sources_app"],
        DATABASES={"default": _database_settings(tmpdir)}, DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        ROOT_URLCONF="bench.bench_sources", ALLOWED_HOSTS=["testserver"], MIDDLEWARE=[],
        TASKS={"default": {"BACKEND": f"{backends}.immediate.ImmediateBackend"},
               "database": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default"]}},
        RAGCHAT={"LOAD_ENTRY_POINTS": False, "PLUGINS": ["bench.bench_sources.plugin"],
                 "PROFILES": {"default": {"embedder": "precomputed"}}},
    )
    del dj_database_url
    django.setup()


# --- Data --------------------------------------------------------------------------------------


def make_articles(count: int) -> None:
    """``count`` articles of ``SECTIONS`` sections each (bulk_create: no signals, nothing synced)."""
    from tests.sources_app.models import Article

    rows = list(synthetic_chunks(count * SECTIONS, seed=7, per_document=SECTIONS))
    bodies: dict[int, list[str]] = {}
    titles: dict[int, str] = {}
    for doc, product, heading, text in rows:
        titles[doc] = product
        bodies.setdefault(doc, []).append(f"## {heading.split(' — ')[1]}\n\n{text}")
    Article.objects.bulk_create([Article(title=f"{titles[d]} ({d})", body="\n\n".join(bodies[d]))
                                 for d in sorted(bodies)], batch_size=500)


def clear_index() -> None:
    from django.db import connection

    from django_ragchat.models import Chunk, Document

    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"TRUNCATE {Chunk._meta.db_table}, {Document._meta.db_table} RESTART IDENTITY CASCADE")
    else:
        Chunk.objects.all().delete()
        Document.objects.all().delete()


def write_files(folder: Path) -> int:
    """The Markdown each object is stored as, one file per object; returns the count."""
    from django_ragchat.sources import get_source

    source = get_source("articles")
    count = 0
    for obj in source.get_queryset().iterator():
        (folder / f"{obj.pk}.md").write_text(source.entry(obj).text)  # the very Markdown the source stores
        count += 1
    return count


# --- Measurements ------------------------------------------------------------------------------


def measure_bulk(count: int, folder: Path, rounds: int = 2) -> list[list]:
    from django_ragchat.ingestion.pipeline import ingest_paths
    from django_ragchat.models import Chunk
    from django_ragchat.sources import get_source, parse_since, sync
    from tests.sources_app.models import Article

    source = get_source("articles")
    rows, sync_times, ingest_times = [], [], []
    chunks = 0
    for _ in range(rounds):
        clear_index()
        report = sync(source)
        assert report.counts["created"] == count, report.summary()
        sync_times.append((report.elapsed, report.embed_seconds))
        chunks = Chunk.objects.count()
        clear_index()
        ingested = ingest_paths(folder)
        assert ingested.count("created") == count, ingested.summary()
        ingest_times.append((ingested.elapsed, ingested.embed_seconds))
    sync_s = median([t for t, _ in sync_times])
    ingest_s = median([t for t, _ in ingest_times])
    rows.append([f"sources.sync, {count:,} objects into empty tables", count, chunks,
                 count / sync_s, chunks / sync_s, median([e for _, e in sync_times]), f"{sync_s / ingest_s:.2f}"])
    rows.append([f"ingest_paths, the same text as {count:,} files", count, chunks, count / ingest_s,
                 chunks / ingest_s, median([e for _, e in ingest_times]), "1.00"])
    clear_index()
    sync(source)
    again = sync(source)
    assert again.counts["unchanged"] == count and again.embed_calls == 0, again.summary()
    rows.append(["sources.sync again, nothing changed", count, 0, count / again.elapsed, 0.0, again.embed_seconds,
                 f"{again.elapsed / ingest_s:.2f}"])
    changed = list(Article.objects.order_by("pk").values_list("pk", flat=True)[:max(1, count // 100)])
    since = parse_since("1m")
    from django.utils import timezone

    for pk in changed:
        Article.objects.filter(pk=pk).update(body=f"## Notes\n\nRevised text {pk}.", updated_at=timezone.now())
    recent = sync(source, since=since)
    assert recent.counts["updated"] == len(changed), recent.summary()
    rows.append([f"--since after a bulk update() of {len(changed)} (1 %)", len(changed), recent.chunks_written,
                 len(changed) / recent.elapsed, recent.chunks_written / recent.elapsed, recent.embed_seconds,
                 f"{recent.elapsed / ingest_s:.2f}"])
    return rows


def _timed_saves(articles, live: bool) -> tuple[list[float], int]:
    """Milliseconds of each save request, and the SQL queries of the last one."""
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client()
    times, queries = [], 0
    for article in articles:
        with CaptureQueriesContext(connection) as captured:
            t0 = time.perf_counter()
            response = client.post(f"/articles/{article.pk}/save/{'' if live else '?paused=1'}")
            times.append((time.perf_counter() - t0) * 1000)
        assert response.status_code == 204, response
        queries = len(captured.captured_queries)
    return times, queries


def measure_save(saves: int) -> list[list]:
    from django.test import override_settings

    from django_ragchat.plugins import reset
    from tests.sources_app.models import Article

    articles = list(Article.objects.order_by("pk")[:saves])
    rows = []
    results: dict[str, tuple[list[float], int]] = {}
    with override_settings(RAGCHAT={**_ragchat(), "TASK_BACKEND": "database"}):
        reset()
        _timed_saves(articles[:5], True)  # warm up: the registry, the task backend
        plain, live = [], []
        for start in range(0, len(articles), 10):  # interleaved in blocks of 10
            plain += _timed_saves(articles[start:start + 10], False)[0]
            live_times, live_queries = _timed_saves(articles[start:start + 10], True)
            live += live_times
        plain_queries = _timed_saves(articles[:1], False)[1]
        results["plain"], results["database"] = (plain, plain_queries), (live, live_queries)
    reset()
    immediate = _timed_saves(articles[: min(50, len(articles))], True)
    results["immediate"] = immediate
    base = median(results["plain"][0])
    labels = {"plain": "request that saves, live sync paused (the site without sources)",
              "database": "request that saves, live sync on the database task backend (worker)",
              "immediate": "request that saves, live sync on the immediate backend (indexed before it answers)"}
    for key, (times, queries) in results.items():
        rows.append([labels[key], len(times), queries, median(times), percentile(times, 99),
                     f"{median(times) - base:+.2f}"])
    return rows


def _ragchat() -> dict:
    from django.conf import settings

    return dict(settings.RAGCHAT)


def run(*, objects: int = 5000, saves: int = 200) -> dict:
    with tempfile.TemporaryDirectory(prefix="ragchat-bench-files-") as folder:
        make_articles(objects)
        files = write_files(Path(folder))
        assert files == objects
        bulk = measure_bulk(objects, Path(folder))
    return {"objects": objects, "bulk": bulk, "save": measure_save(min(saves, objects))}


def report(results: dict, database: str) -> str:
    return "\n".join([
        f"Model sources ({database}); {machine()}; {results['objects']:,} objects of {SECTIONS} sections; "
        f"load average {os.getloadavg()[0]:.2f}", "",
        "Bulk sync, embedding excluded (precomputed vectors), beside ingesting the same text as files",
        table(["path", "objects", "chunks", "objects/s", "chunks/s", "embed s", "time vs ingest"], results["bulk"]),
        "",
        "What a save() adds to a request (a view that loads an article, changes its body, saves it; autocommit)",
        table(["request", "requests", "SQL queries", "median ms", "p99 ms", "median vs paused ms"], results["save"]),
    ])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=5000)
    parser.add_argument("--saves", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="200 objects, 40 saves: a smoke run")
    args = parser.parse_args(argv)
    sizes = dict(objects=200, saves=40) if args.quick else dict(objects=args.objects, saves=args.saves)
    with tempfile.TemporaryDirectory(prefix="ragchat-bench-") as tmpdir:
        configure(tmpdir)
        from django.db import connection

        connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
        try:
            print(report(run(**sizes), describe_database()))
        finally:
            connection.creation.destroy_test_db(connection.settings_dict["NAME"], verbosity=0)


if __name__ == "__main__":
    main()
