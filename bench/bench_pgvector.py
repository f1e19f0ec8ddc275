"""PostgreSQL + pgvector: retrieval and ingestion through the app, side by side with the same
operations done raw (psycopg + SQL, no app code) in the same run, so each ratio is the app's own
cost; and the same retrieval on the SQLite fallback.

    .venv/bin/python bench/bench_pgvector.py            # 100,000 chunks x 384, SQLite 20,000 (~3 min)
    .venv/bin/python bench/bench_pgvector.py --quick    # 3,000 chunks, a smoke run

Needs PostgreSQL with pgvector at ``DATABASE_URL`` (default
``postgres://postgres@127.0.0.1:5432/ragchat``); it creates and drops ``test_<name>_pgvector_bench``
there (and a SQLite file in a temporary directory), never touching the named database.

Data: ``_setup.synthetic_chunks`` texts (product documentation, ~520 characters a chunk, 10
chunks a document) with *clustered* 384-dimension vectors, not uniform noise: 500 clusters, one
per (topic, product family), each spread along its own 24-dimension subspace plus a little
isotropic noise, so that neighbours' similarities fall off smoothly as real sentence embeddings'
do (top-1 similarity about 0.5, top-10 about 0.3, unrelated 0). Queries come from the same
distribution, with a short text naming the chunk's product and topic.

Measured:

* ingestion, embedding excluded: chunks stored per second by ``search.store_chunks`` (binary
  COPY; text, metadata, the generated ``tsvector`` and its GIN index) against the same COPY
  done raw, ``bulk_create`` (what ingestion did before), and raw COPY of bare vectors into a
  table with nothing else (the issue's 130k rows/s reference);
* the HNSW index build (``ragchat_index``'s ``create_hnsw_index``, m=16, ef_construction=64);
* vector retrieval p50/p99 and recall@10 against exact search at ``ef_search`` 40 and 100:
  raw (ids only, numpy vector sent binary) and raw returning the same columns as the app, against
  ``search.vector_ids`` and ``search.vector_search`` (the retriever's call, chunk text included);
* hybrid p50 against its two raw queries (vector and full-text ids, run one after the other),
  and full text alone against its raw query;
* every app search here reads as ``UNRESTRICTED`` (no access condition), as its raw reference
  does; what access costs is measured by ``bench_sources.py``;
* on SQLite with 20,000 of the chunks: ``store_chunks`` (``bulk_create`` + FTS5 triggers), and
  vector, full-text and hybrid retrieval, with numpy's product + top-k as the raw reference.
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

from bench._setup import machine, median, percentile, synthetic_chunks, table

SPACE = "bench-384"
DIMENSIONS = 384
PER_DOCUMENT = 10
CLUSTERS_PER_TOPIC = 50
LOCAL_DIMENSIONS = 24
_TOPIC_WORDS = {  # the query words for each synthetic topic (see _setup._TOPICS)
    "Pricing": "price monthly plan", "Battery": "battery charge hours", "Display": "screen brightness",
    "Camera": "camera night photo", "Warranty": "warranty repair claim", "Setup": "setup pairing network",
    "Storage": "storage cloud backup", "Connectivity": "wifi bluetooth signal",
    "Security": "fingerprint unlock privacy", "Accessories": "case cable stand",
}


# --- Data ------------------------------------------------------------------------------------


class Corpus:
    """Texts, clustered unit vectors and queries, deterministic for a seed."""

    def __init__(self, chunks: int, queries: int, seed: int = 3):
        rng = np.random.default_rng(seed)
        rows = list(synthetic_chunks(chunks, seed=seed, per_document=PER_DOCUMENT))
        topics = sorted(_TOPIC_WORDS)
        self.documents = sorted({doc for doc, *_ in rows})
        self.texts = [text for *_, text in rows]
        self.headings = [heading for _, _, heading, _ in rows]
        self.doc_of = np.array([doc for doc, *_ in rows])
        topic_of = np.array([topics.index(heading.split(" — ")[1]) for heading in self.headings])
        # 500 clusters, one per (topic, product family); each spreads along its own 24-dimension
        # subspace plus a little isotropic noise: clustered and of low intrinsic dimension, as
        # sentence embeddings are (neighbours' similarities fall off smoothly, no plateaus).
        cluster_of = topic_of * CLUSTERS_PER_TOPIC + self.doc_of % CLUSTERS_PER_TOPIC
        clusters = len(topics) * CLUSTERS_PER_TOPIC
        centres = rng.standard_normal((clusters, DIMENSIONS)).astype(np.float32) / np.sqrt(DIMENSIONS)
        bases = rng.standard_normal((clusters, DIMENSIONS, LOCAL_DIMENSIONS)).astype(np.float32) / np.sqrt(DIMENSIONS)

        def sample(cluster):
            local = 0.8 * rng.standard_normal((len(cluster), LOCAL_DIMENSIONS)).astype(np.float32)
            noise = 0.4 / np.sqrt(DIMENSIONS) * rng.standard_normal((len(cluster), DIMENSIONS)).astype(np.float32)
            vectors = centres[cluster] + np.einsum("nds,ns->nd", bases[cluster], local) + noise
            return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

        self.products = {doc: product for doc, product, _, _ in rows}
        self.vectors = np.vstack([sample(cluster_of[i:i + 10_000]) for i in range(0, chunks, 10_000)])
        picks = rng.integers(0, chunks, queries)
        self.query_vectors = sample(cluster_of[picks])
        self.query_texts = [f"{self.products[self.doc_of[i]]} {_TOPIC_WORDS[topics[topic_of[i]]]}?" for i in picks]
        self.metadata = [{"product": self.products[d].split()[0].lower(), "lang": "en"} for d in self.doc_of]

    def exact(self, ids: np.ndarray, k: int) -> list[list[int]]:
        """Chunk ids of the exact top ``k`` of each query (cosine, float32), ``ids[i]`` being
        the id of ``vectors[i]``."""
        scores = self.query_vectors @ self.vectors.T
        top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        return [[int(ids[i]) for i in row] for row in top]


# --- Django and raw connections -------------------------------------------------------------


def configure(pg_url: str, sqlite_path: str | None) -> None:
    import dj_database_url
    import django
    from django.conf import settings

    databases = {"default": dj_database_url.parse(pg_url, conn_max_age=0)}
    databases["default"]["TEST"] = {"NAME": f"test_{databases['default']['NAME']}_pgvector_bench"}
    if sqlite_path:
        databases["sqlite"] = {"ENGINE": "django.db.backends.sqlite3", "NAME": sqlite_path,
                               "TEST": {"NAME": sqlite_path}}
    settings.configure(
        SECRET_KEY="bench", DEBUG=False, USE_TZ=True, LOGGING_CONFIG=None,
        INSTALLED_APPS=["django.contrib.auth", "django.contrib.contenttypes", "django_ragchat"],
        DATABASES=databases, DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        RAGCHAT={"LOAD_ENTRY_POINTS": False},
    )
    django.setup()


def raw_connection(using: str = "default"):
    """A psycopg connection to the same database, outside Django, with pgvector's adapters."""
    import psycopg
    from django.db import connections
    from pgvector.psycopg import register_vector

    params = connections[using].get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    conn = psycopg.connect(**params, autocommit=True)
    register_vector(conn)
    return conn


def timed(fn, items) -> list[float]:
    """Milliseconds of ``fn(item)`` for each item."""
    out = []
    for item in items:
        t0 = time.perf_counter()
        fn(item)
        out.append((time.perf_counter() - t0) * 1000)
    return out


# --- Ingestion ---------------------------------------------------------------------------------


def _chunk_objects(corpus: Corpus, documents: dict[int, int], rows: range, space: str):
    from django_ragchat.models import Chunk

    return [Chunk(document_id=documents[int(corpus.doc_of[i])], ordinal=i % PER_DOCUMENT, text=corpus.texts[i],
                  heading=corpus.headings[i], space=space, embedding=corpus.vectors[i],
                  token_count=len(corpus.texts[i]) // 4, metadata=corpus.metadata[i])
            for i in rows]


def store_documents(corpus: Corpus, using: str) -> dict[int, int]:
    from django_ragchat.models import Document

    made = Document.objects.using(using).bulk_create([
        Document(source=f"bench/product-{doc}.md", title=corpus.products[doc], checksum=str(doc))
        for doc in corpus.documents
    ])
    return {doc: d.pk for doc, d in zip(corpus.documents, made)}


def app_store(corpus: Corpus, documents, rows: range, space: str, *, using: str = "default",
              batch: int = 1000) -> float:
    """Seconds for ``store_chunks`` of ``rows`` (building the Chunk objects included), one call
    and one transaction per ``batch`` rows, as ingestion commits per batch."""
    from django.db import transaction

    from django_ragchat.search import store_chunks

    t0 = time.perf_counter()
    for start in range(rows.start, rows.stop, batch):
        with transaction.atomic(using=using):
            store_chunks(_chunk_objects(corpus, documents, range(start, min(start + batch, rows.stop)), space),
                         using=using)
    return time.perf_counter() - t0


def bulk_create_store(corpus: Corpus, documents, rows: range, space: str, batch: int = 1000) -> float:
    from django.db import transaction

    from django_ragchat.models import Chunk

    t0 = time.perf_counter()
    for start in range(rows.start, rows.stop, batch):
        with transaction.atomic():
            Chunk.objects.bulk_create(_chunk_objects(corpus, documents, range(start, min(start + batch, rows.stop)),
                                                     space), batch_size=500)
    return time.perf_counter() - t0


def raw_copy(conn, corpus: Corpus, documents, rows: range, space: str, batch: int = 1000,
             table: str = "django_ragchat_chunk") -> float:
    """The app's COPY, written directly with psycopg and pgvector's binary dumper."""
    from psycopg.types.json import Jsonb

    t0 = time.perf_counter()
    with conn.cursor() as cur:
        for start in range(rows.start, rows.stop, batch):
            with conn.transaction(), cur.copy(
                    f"COPY {table} (document_id, ordinal, text, heading, space, embedding, token_count, "
                    "metadata, access) FROM STDIN (FORMAT BINARY)") as copy:
                copy.set_types(["int8", "int4", "text", "text", "text", "vector", "int4", "jsonb", "jsonb"])
                for i in range(start, min(start + batch, rows.stop)):
                    copy.write_row((documents[int(corpus.doc_of[i])], i % PER_DOCUMENT, corpus.texts[i],
                                    corpus.headings[i], space, corpus.vectors[i], len(corpus.texts[i]) // 4,
                                    Jsonb(corpus.metadata[i]), Jsonb(["public"])))
    return time.perf_counter() - t0


def raw_bare_copy(conn, corpus: Corpus, rows: range) -> float:
    with conn.cursor() as cur:
        cur.execute("CREATE TEMP TABLE bare_vectors (id bigserial PRIMARY KEY, embedding vector(384))")
        t0 = time.perf_counter()
        with cur.copy("COPY bare_vectors (embedding) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(["vector"])
            for i in rows:
                copy.write_row((corpus.vectors[i],))
        elapsed = time.perf_counter() - t0
        cur.execute("DROP TABLE bare_vectors")
    return elapsed


def raw_copy_without_fulltext(conn, corpus: Corpus, documents, rows: range) -> float:
    """The raw COPY into a copy of the chunk table without the generated tsvector and its GIN
    index (everything else alike): what the full-text column costs."""
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE plain_chunk (LIKE django_ragchat_chunk INCLUDING DEFAULTS INCLUDING IDENTITY "
                    "INCLUDING INDEXES INCLUDING CONSTRAINTS) WITH (toast_tuple_target = 8160)")
        cur.execute("ALTER TABLE plain_chunk DROP COLUMN search_vector")
    try:
        return raw_copy(conn, corpus, documents, rows, "scratch-plain", table="plain_chunk")
    finally:
        conn.execute("DROP TABLE plain_chunk")


def measure_ingestion(corpus: Corpus, documents, conn, sample: int) -> list[list]:
    """Each path stores ``sample`` chunks into a scratch space, deleted afterwards (the table
    already holds the main corpus, as a live site's does)."""
    from django_ragchat.models import Chunk

    rows = range(0, sample)
    results = [
        ("search.store_chunks (app: binary COPY, 1,000 a call)", app_store(corpus, documents, rows, "scratch-app")),
        ("  raw psycopg COPY, same rows and table", raw_copy(conn, corpus, documents, rows, "scratch-raw")),
        ("Chunk.objects.bulk_create (500 a statement)", bulk_create_store(corpus, documents, rows, "scratch-bulk")),
        ("  raw COPY, same rows, table without the tsvector + GIN", raw_copy_without_fulltext(
            conn, corpus, documents, rows)),
        ("  raw COPY of bare vectors (no text, no index)", raw_bare_copy(conn, corpus, rows)),
    ]
    Chunk.objects.filter(space__startswith="scratch-").delete()
    with conn.cursor() as cur:
        cur.execute("VACUUM ANALYZE django_ragchat_chunk")
    raw = results[1][1]
    return [[name, sample, sample / seconds, f"{seconds / raw:.2f}" if i < 3 else ""]
            for i, (name, seconds) in enumerate(results)]


# --- Retrieval ---------------------------------------------------------------------------------


def _rotated(cases: list, q: int) -> list:
    """The cases in a different order for each query: interleaved, so that load from other
    processes spreads over all of them, and rotated, so that no case always meets the query's
    index pages cold (the first to search a region of the graph reads it from disk or the OS
    cache; the others then find it in shared buffers)."""
    shift = q % len(cases)
    return cases[shift:] + cases[:shift]


def _recall(found: list[list[int]], truth: list[list[int]], k: int) -> float:
    return float(np.mean([len(set(f[:k]) & set(t[:k])) / k for f, t in zip(found, truth)]))


def measure_vector(corpus: Corpus, conn, truth, k: int, efs=(40, 100)) -> list[list]:
    from django_ragchat import search
    from django_ragchat.access import UNRESTRICTED  # the raw queries filter on nothing either

    queries = list(range(len(corpus.query_vectors)))
    warm = queries[: min(20, len(queries))]
    raw_ids_sql = (f"SELECT id FROM django_ragchat_chunk WHERE space = '{SPACE}' "
                   f"ORDER BY embedding::vector(384) <=> %s::vector(384) LIMIT {k}")
    raw_full_sql = (f"SELECT c.id, c.text, c.heading, c.ordinal, c.metadata, c.document_id, d.source, d.title, "
                    f"1 - h.distance FROM (SELECT id, embedding::vector(384) <=> %s::vector(384) AS distance "
                    f"FROM django_ragchat_chunk WHERE space = '{SPACE}' ORDER BY distance LIMIT {k}) h "
                    f"JOIN django_ragchat_chunk c ON c.id = h.id JOIN django_ragchat_document d ON d.id = c.document_id "
                    f"ORDER BY h.distance, c.id")
    rows = []
    for ef in efs:
        found: dict[str, list] = {}
        cur = conn.cursor()
        cur.execute(f"SET hnsw.ef_search = {ef}")

        def raw_ids(q):
            cur.execute(raw_ids_sql, (corpus.query_vectors[q],), binary=True)
            found.setdefault("raw", []).append([r[0] for r in cur.fetchall()])

        def raw_full(q):
            cur.execute(raw_full_sql, (corpus.query_vectors[q],))
            found.setdefault("rawfull", []).append([r[0] for r in cur.fetchall()])

        def app_ids(q):
            found.setdefault("ids", []).append(
                [cid for cid, _ in search.vector_ids(SPACE, corpus.query_vectors[q], k, ef_search=ef, principals=UNRESTRICTED)])

        def app_full(q):
            found.setdefault("full", []).append(
                [h.chunk_id for h in search.vector_search(SPACE, corpus.query_vectors[q], k, ef_search=ef, principals=UNRESTRICTED)])

        cases = [("raw: ids", raw_ids, "raw"), ("raw: same columns as the app", raw_full, "rawfull"),
                 ("app: search.vector_ids", app_ids, "ids"), ("app: search.vector_search (retriever)", app_full, "full")]
        times = {}
        for _, fn, key in cases:
            timed(fn, warm)
            found.pop(key, None)
        for q in queries:
            for _, fn, key in _rotated(cases, q):
                times.setdefault(key, []).extend(timed(fn, [q]))
        cur.close()
        raw_p50 = median(times["raw"])
        for name, _, key in cases:
            rows.append([f"ef_search {ef}", name, len(times[key]), median(times[key]), percentile(times[key], 99),
                         f"{median(times[key]) / raw_p50:.2f}", _recall(found[key], truth, k)])
    return rows


def measure_text(corpus: Corpus, conn, k: int, candidates: int = 20, ef: int = 40) -> list[list]:
    from django_ragchat import search
    from django_ragchat.access import UNRESTRICTED  # the raw queries filter on nothing either
    from django_ragchat.search import postgres, query_terms

    queries = list(range(len(corpus.query_vectors)))
    vector_sql = (f"SELECT id FROM django_ragchat_chunk WHERE space = '{SPACE}' "
                  f"ORDER BY embedding::vector(384) <=> %s::vector(384) LIMIT {candidates}")
    text_sql = (f"SELECT c.id, ts_rank(c.search_vector, q.query) AS rank FROM django_ragchat_chunk c, "
                f"websearch_to_tsquery('english', %s) q(query) WHERE c.space = '{SPACE}' AND c.search_vector @@ q.query "
                f"ORDER BY rank DESC, c.id LIMIT %s")
    cur = conn.cursor()
    cur.execute(f"SET hnsw.ef_search = {ef}")
    terms = [" or ".join(query_terms(corpus.query_texts[q])) for q in queries]

    def raw_vector(q):
        cur.execute(vector_sql, (corpus.query_vectors[q],), binary=True)
        cur.fetchall()

    def raw_text(q):
        cur.execute(text_sql, (terms[q], candidates))
        cur.fetchall()

    def raw_both(q):
        raw_vector(q)
        raw_text(q)

    def app_hybrid(q):
        search.hybrid_search(SPACE, corpus.query_vectors[q], corpus.query_texts[q], k, ef_search=ef,
                             candidates=candidates, principals=UNRESTRICTED)

    def app_text(q):
        search.fulltext_search(SPACE, corpus.query_texts[q], candidates, principals=UNRESTRICTED)

    cases = {"raw_both": raw_both, "hybrid": app_hybrid, "raw_text": raw_text, "text": app_text}
    times: dict[str, list] = {}
    for fn in cases.values():
        timed(fn, queries[:10])
    for q in queries:
        for key, fn in _rotated(list(cases.items()), q):
            times.setdefault(key, []).extend(timed(fn, [q]))
    cur.close()
    matches = np.mean([len(search.fulltext_search(SPACE, corpus.query_texts[q], 10_000, principals=UNRESTRICTED)) for q in queries[:20]])
    assert postgres.COLUMN_CONFIG == "english"
    return [
        ["hybrid", f"raw: vector ids + text ids ({candidates} each), two queries", len(queries),
         median(times["raw_both"]), percentile(times["raw_both"], 99), "1.00"],
        ["hybrid", "app: search.hybrid_search (RRF in one query, with text)", len(queries), median(times["hybrid"]),
         percentile(times["hybrid"], 99), f"{median(times['hybrid']) / median(times['raw_both']):.2f}"],
        ["full text", f"raw: text ids (~{matches:,.0f} matching chunks ranked)", len(queries), median(times["raw_text"]),
         percentile(times["raw_text"], 99), "1.00"],
        ["full text", "app: search.fulltext_search", len(queries), median(times["text"]), percentile(times["text"], 99),
         f"{median(times['text']) / median(times['raw_text']):.2f}"],
    ]


def measure_sqlite(corpus: Corpus, count: int, k: int) -> tuple[list[list], float]:
    from django_ragchat import search
    from django_ragchat.access import UNRESTRICTED  # the raw queries filter on nothing either
    from django_ragchat.models import Chunk
    from django_ragchat.search.vectorindex import vector_index

    documents = store_documents(corpus, "sqlite")
    seconds = app_store(corpus, documents, range(count), SPACE, using="sqlite")
    ids = np.array(Chunk.objects.using("sqlite").filter(space=SPACE).order_by("id").values_list("id", flat=True))
    matrix = corpus.vectors[:count]
    scores = corpus.query_vectors @ matrix.T
    truth = [[int(ids[i]) for i in row] for row in np.argsort(-scores, axis=1, kind="stable")[:, :k]]
    queries = list(range(len(corpus.query_vectors)))
    found: list[list[int]] = []

    def numpy_only(q):
        s = matrix @ corpus.query_vectors[q]
        top = np.argpartition(-s, k - 1)[:k]
        top[np.argsort(-s[top], kind="stable")]

    def vector(q):
        found.append([h.chunk_id for h in search.vector_search(SPACE, corpus.query_vectors[q], k, using="sqlite", principals=UNRESTRICTED)])

    def text(q):
        search.fulltext_search(SPACE, corpus.query_texts[q], k, using="sqlite", principals=UNRESTRICTED)

    def hybrid(q):
        search.hybrid_search(SPACE, corpus.query_vectors[q], corpus.query_texts[q], k, using="sqlite", principals=UNRESTRICTED)

    vector_index.search(SPACE, corpus.query_vectors[0], k, using="sqlite")  # the cold load
    rows = []
    for name, fn in (("raw: numpy product + top-k", numpy_only), ("app: search.vector_search", vector),
                     ("app: search.fulltext_search (FTS5)", text), ("app: search.hybrid_search", hybrid)):
        timed(fn, queries[:10])
        found.clear()
        ms = timed(fn, queries)
        rows.append([f"{count:,} chunks", name, len(ms), median(ms), percentile(ms, 99),
                     f"{_recall(found, truth, k):.3f}" if fn is vector else ""])
    return rows, count / seconds


# --- The run -----------------------------------------------------------------------------------


def run(*, chunks: int = 100_000, queries: int = 300, hybrid_queries: int = 150, ingest_sample: int = 20_000,
        sqlite_chunks: int = 20_000, k: int = 10, sqlite: bool = True) -> dict:
    """Everything in the module docstring, on the configured databases ("default" PostgreSQL,
    "sqlite" when ``sqlite``). Returns the report's tables as rows."""
    from django_ragchat.search import postgres

    t0 = time.perf_counter()
    corpus = Corpus(chunks, queries)
    generated = time.perf_counter() - t0
    conn = raw_connection()
    try:
        documents = store_documents(corpus, "default")
        main_store = app_store(corpus, documents, range(chunks), SPACE)
        with conn.cursor() as cur:
            cur.execute("VACUUM ANALYZE django_ragchat_chunk")
        ingestion = [["search.store_chunks, the whole corpus", chunks, chunks / main_store, ""]]
        ingestion += measure_ingestion(corpus, documents, conn, min(ingest_sample, chunks))

        t0 = time.perf_counter()
        status, _ = postgres.create_hnsw_index(SPACE)
        build = time.perf_counter() - t0
        assert status.ok, status
        with conn.cursor() as cur:
            cur.execute("ANALYZE django_ragchat_chunk")
            cur.execute(f"SELECT id FROM django_ragchat_chunk WHERE space = '{SPACE}' ORDER BY id")
            ids = np.array([r[0] for r in cur.fetchall()])
        truth = corpus.exact(ids, k)
        vector_rows = measure_vector(corpus, conn, truth, k)
        text_rows = measure_text(_first_queries(corpus, min(hybrid_queries, queries)), conn, k)
    finally:
        conn.close()
    sqlite_rows, sqlite_rate = ([], 0.0)
    if sqlite:
        sqlite_rows, sqlite_rate = measure_sqlite(corpus, min(sqlite_chunks, chunks), k)
    return {"chunks": chunks, "generated_s": generated, "ingestion": ingestion, "build_s": build,
            "index": status.name, "vector": vector_rows, "text": text_rows, "sqlite": sqlite_rows,
            "sqlite_rate": sqlite_rate, "k": k}


def _first_queries(corpus: Corpus, n: int) -> Corpus:
    view = object.__new__(Corpus)
    view.__dict__.update(corpus.__dict__)
    view.query_vectors = corpus.query_vectors[:n]
    view.query_texts = corpus.query_texts[:n]
    return view


def report(results: dict, database: str) -> str:
    k = results["k"]
    lines = [
        f"pgvector benchmark ({database}); {machine()}; {results['chunks']:,} chunks x {DIMENSIONS} "
        f"(clustered), top-{k}; load average {os.getloadavg()[0]:.2f}", "",
        "Ingestion, embedding excluded (vectors computed beforehand)",
        table(["path", "chunks", "chunks/s", "time vs raw COPY"], results["ingestion"]), "",
        f"HNSW index build (m=16, ef_construction=64, {results['index']}): {results['build_s']:.1f} s", "",
        "Vector retrieval (recall@10 against exact search)",
        table(["setting", "path", "queries", "p50 ms", "p99 ms", "p50 vs raw ids", "recall@10"], results["vector"]),
        "",
        "Hybrid and full-text retrieval (ef_search 40, top-10 of 20 candidates each)",
        table(["search", "path", "queries", "p50 ms", "p99 ms", "p50 vs raw"], results["text"]),
    ]
    if results["sqlite"]:
        lines += ["", f"SQLite fallback (file; store_chunks {results['sqlite_rate']:,.0f} chunks/s with the FTS5 "
                      f"triggers)",
                  table(["corpus", "path", "queries", "p50 ms", "p99 ms", "recall@10"], results["sqlite"])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--sqlite-chunks", type=int, default=20_000)
    parser.add_argument("--quick", action="store_true", help="3,000 chunks, 30 queries: a smoke run")
    args = parser.parse_args(argv)
    sizes = dict(chunks=args.chunks, queries=args.queries, hybrid_queries=min(150, args.queries),
                 ingest_sample=20_000, sqlite_chunks=args.sqlite_chunks)
    if args.quick:
        sizes = dict(chunks=3000, queries=30, hybrid_queries=30, ingest_sample=1000, sqlite_chunks=1000)
    url = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/ragchat")
    if not url.startswith(("postgres://", "postgresql://")):
        parser.error(f"DATABASE_URL must point at PostgreSQL with pgvector, not {url!r}")
    with tempfile.TemporaryDirectory(prefix="ragchat-bench-") as tmpdir:
        configure(url, os.path.join(tmpdir, "bench.sqlite3"))
        from django.db import connections

        from bench._setup import describe_database

        created = []
        try:
            for alias in ("default", "sqlite"):
                connections[alias].creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
                created.append(alias)
            print(report(run(**sizes), describe_database()))
        finally:
            for alias in created:
                connections[alias].creation.destroy_test_db(connections[alias].settings_dict["NAME"], verbosity=0)


if __name__ == "__main__":
    main()
