"""Vector search filtered by access on PostgreSQL + pgvector: does a reader who may read only 1 %,
10 % or 50 % of the chunks still get k results, the right ones, fast?

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/ragchat .venv/bin/python bench/bench_access_pgvector.py
    .venv/bin/python bench/bench_access_pgvector.py --quick     # 3,000 chunks, a smoke run

Data: ``bench_pgvector``'s clustered corpus (100,000 chunks x 384, 10 chunks a document). Each
document is readable by one of 100 groups, drawn at random (so access is not correlated with
topic); its chunks carry ``["group:<n>"]``, as a model source stores them. The readers: members
of 1, 10 and 50 groups (1 %, 10 %, 50 % of the chunks readable), and ``UNRESTRICTED`` (no access
condition: the search without the feature, the baseline). The HNSW index is built once (m=16,
ef_construction=64) and analysed.

For every reader, ``search.vector_ids`` (what a retriever's search runs: ``access ?| ARRAY[...]``
inside the query, ``hnsw.iterative_scan = relaxed_order``, ``ef_search`` 40) is timed on the same
queries, interleaved and rotated (``bench_pgvector._rotated``), and its top-10 compared with the
exact top-10 among the chunks that reader may read (numpy over the same vectors): recall@10, the
share of queries that got all 10 results, p50/p99 latency, p50 against the unfiltered search's,
and the plan PostgreSQL chose (the HNSW index, or the GIN index on ``access`` and a sort).
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

from bench._setup import machine, median, percentile, table
from bench.bench_pgvector import (
    DIMENSIONS,
    PER_DOCUMENT,
    SPACE,
    Corpus,
    _rotated,
    configure,
    raw_connection,
    store_documents,
)

GROUPS = 100
SELECTIVITIES = (0.01, 0.10, 0.50, 1.0)


def store_with_access(corpus: Corpus, documents: dict[int, int], group_of: dict[int, int]) -> float:
    """Store the corpus, each chunk readable by its document's group (binary COPY, 1,000 a call)."""
    from django.db import transaction

    from django_ragchat.models import Chunk
    from django_ragchat.search import store_chunks

    t0 = time.perf_counter()
    for start in range(0, len(corpus.texts), 1000):
        rows = range(start, min(start + 1000, len(corpus.texts)))
        with transaction.atomic():
            store_chunks([
                Chunk(document_id=documents[int(corpus.doc_of[i])], ordinal=i % PER_DOCUMENT, text=corpus.texts[i],
                      heading=corpus.headings[i], space=SPACE, embedding=corpus.vectors[i],
                      token_count=len(corpus.texts[i]) // 4, metadata=corpus.metadata[i],
                      access=[f"group:{group_of[int(corpus.doc_of[i])]}"])
                for i in rows])
    return time.perf_counter() - t0


def readers(groups: int = GROUPS) -> list[tuple[str, object, set[int] | None]]:
    """(label, principals, readable groups or None for all) of each reader."""
    from django_ragchat.access import PUBLIC, UNRESTRICTED, Principals

    found = [("unfiltered (UNRESTRICTED)", UNRESTRICTED, None)]
    for share in SELECTIVITIES:
        members = set(range(max(1, round(groups * share))))
        tokens = frozenset({PUBLIC, "authenticated", "user:1", *(f"group:{g}" for g in members)})
        found.append((f"{share:.0%} readable", Principals(tokens), members))
    return found


def exact_top(corpus: Corpus, ids: np.ndarray, chunk_groups: np.ndarray, members: set[int] | None,
              k: int) -> list[list[int]]:
    """The exact top ``k`` ids of each query among the chunks of ``members``' groups."""
    scores = corpus.query_vectors @ corpus.vectors.T
    if members is not None:
        scores[:, ~np.isin(chunk_groups, list(members))] = -np.inf
    top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return [[int(ids[i]) for i in row if np.isfinite(scores[q, i])] for q, row in enumerate(top)]


def plan_of(principals, vector, k: int) -> str:
    """Which index PostgreSQL's plan for this reader's search uses."""
    from django.db import connection

    from django_ragchat.search import postgres

    settings, sql, params = postgres.vector_query(SPACE, vector, k, principals=principals)
    with connection.cursor() as cursor:
        for statement in settings:
            cursor.execute(statement.replace("SET LOCAL", "SET"))
        cursor.execute("EXPLAIN " + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("RESET hnsw.ef_search; RESET hnsw.iterative_scan")
    if "ragchat_hnsw_" in plan:
        return "HNSW, iterative scan" if "iterative_scan" in " ".join(settings) else "HNSW"
    if "ragchat_chunk_access" in plan:
        return "GIN on access + sort"
    return "sequential scan + sort"


def measure(corpus: Corpus, ids: np.ndarray, chunk_groups: np.ndarray, k: int) -> list[list]:
    from django_ragchat import search

    cases = readers()
    truth = {label: exact_top(corpus, ids, chunk_groups, members, k) for label, _, members in cases}
    found: dict[str, list[list[int]]] = {label: [None] * len(corpus.query_vectors) for label, _, _ in cases}
    times: dict[str, list[float]] = {label: [] for label, _, _ in cases}
    queries = list(range(len(corpus.query_vectors)))
    for q in queries[:10]:  # warm the index's pages
        for _, principals, _ in cases:
            search.vector_ids(SPACE, corpus.query_vectors[q], k, principals=principals)
    for q in queries:
        for label, principals, _ in _rotated(cases, q):
            t0 = time.perf_counter()
            hits = search.vector_ids(SPACE, corpus.query_vectors[q], k, principals=principals)
            times[label].append((time.perf_counter() - t0) * 1000)
            found[label][q] = [cid for cid, _ in hits]
    base = median(times[cases[0][0]])
    rows = []
    for label, principals, _ in cases:
        recall = np.mean([len(set(f) & set(t)) / max(1, len(t)) for f, t in zip(found[label], truth[label])])
        full = np.mean([len(f) == min(k, len(t)) for f, t in zip(found[label], truth[label])])
        rows.append([label, len(queries), median(times[label]), percentile(times[label], 99),
                     f"{median(times[label]) / base:.2f}", f"{recall:.3f}", f"{full:.0%}",
                     plan_of(principals, corpus.query_vectors[0], k)])
    return rows


def run(*, chunks: int = 100_000, queries: int = 300, k: int = 10, seed: int = 11) -> dict:
    from django_ragchat.search import postgres

    corpus = Corpus(chunks, queries)
    rng = np.random.default_rng(seed)
    group_of = {int(doc): int(g) for doc, g in zip(corpus.documents, rng.integers(0, GROUPS, len(corpus.documents)))}
    documents = store_documents(corpus, "default")
    stored = store_with_access(corpus, documents, group_of)
    conn = raw_connection()
    try:
        t0 = time.perf_counter()
        status, _ = postgres.create_hnsw_index(SPACE)
        build = time.perf_counter() - t0
        with conn.cursor() as cur:
            cur.execute("VACUUM ANALYZE django_ragchat_chunk")
            cur.execute(f"SELECT id FROM django_ragchat_chunk WHERE space = '{SPACE}' ORDER BY id")
            ids = np.array([r[0] for r in cur.fetchall()])
    finally:
        conn.close()
    chunk_groups = np.array([group_of[int(d)] for d in corpus.doc_of])
    return {"chunks": chunks, "k": k, "store_s": stored, "build_s": build, "index": status.name,
            "rows": measure(corpus, ids, chunk_groups, k)}


def report(results: dict, database: str) -> str:
    return "\n".join([
        f"Access-filtered vector search ({database}); {machine()}; {results['chunks']:,} chunks x {DIMENSIONS} "
        f"(clustered), {GROUPS} groups, top-{results['k']}, ef_search 40; load average {os.getloadavg()[0]:.2f}",
        f"stored with access in {results['store_s']:.1f} s; HNSW build {results['build_s']:.1f} s", "",
        table(["reader", "queries", "p50 ms", "p99 ms", "p50 vs unfiltered", "recall@10", "got all k", "plan"],
              results["rows"]),
    ])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--quick", action="store_true", help="3,000 chunks, 30 queries: a smoke run")
    args = parser.parse_args(argv)
    sizes = dict(chunks=3000, queries=30) if args.quick else dict(chunks=args.chunks, queries=args.queries)
    url = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/ragchat")
    if not url.startswith(("postgres://", "postgresql://")):
        parser.error(f"DATABASE_URL must point at PostgreSQL with pgvector, not {url!r}")
    with tempfile.TemporaryDirectory(prefix="ragchat-bench-"):
        configure(url, None)
        from django.db import connection

        from bench._setup import describe_database

        connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
        try:
            print(report(run(**sizes), describe_database()))
        finally:
            connection.creation.destroy_test_db(connection.settings_dict["NAME"], verbosity=0)


if __name__ == "__main__":
    main()
