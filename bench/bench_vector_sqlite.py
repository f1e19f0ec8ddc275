"""Vector search on SQLite, in process: "20k chunks must answer a query in well under 100 ms".

    .venv/bin/python bench/bench_vector_sqlite.py                 # 20,000 chunks, 300 queries
    .venv/bin/python bench/bench_vector_sqlite.py --chunks 5000,20000,50000
    .venv/bin/python bench/bench_vector_sqlite.py --quick

Stores synthetic chunks (``_setup.synthetic_chunks``, embedded by the default profile's
hashing embedder, 384 dimensions) and measures, per corpus size:

* cold load: ``vector_index.clear()`` then the first ``vector_index.search`` (reads every
  embedding of the space from the database into one numpy matrix);
* ``vector_index.search``, warm: the (count, max id) stamp query plus the matrix product and
  partial sort, with the numpy part alone on its own row;
* the hashing embedder on one query;
* the full ``VectorRetriever.retrieve`` path the pipeline runs: embed the query, search, fetch
  the top ``k`` chunks' text (two SQL queries), through ``async_to_sync`` as a sync caller would.

Run it on SQLite (the default); with ``DATABASE_URL`` pointing at PostgreSQL the retriever row
measures pgvector instead of the in-process index.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._setup import bench_database, machine, median, percentile, product_names, store_chunks, table

_QUESTIONS = (
    "How much does the {product} cost per month?",
    "How long does the {product} battery last?",
    "Does the {product} camera have night mode?",
    "What does the warranty of the {product} cover?",
)


def _timed(fn, repeats: int) -> list[float]:
    timings = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        timings.append((time.perf_counter() - t0) * 1000)
    return timings


def measure(chunks: int, *, queries: int = 300, warmup: int = 10, k: int = 10, seed: int = 11) -> dict:
    """Measure one corpus size (stores ``chunks`` more chunks in a fresh seed's documents).

    Returns {"chunks": total chunks in the space, "cold_ms", "rows": {name: [ms...]}}.
    """
    from asgiref.sync import async_to_sync

    from django_ragchat.models import Chunk, Conversation
    from django_ragchat.profiles import get_profile
    from django_ragchat.search.vectorindex import vector_index
    from django_ragchat.turn.context import TurnContext, components_for
    from django_ragchat.types import Query

    store_chunks(chunks, seed=seed)
    profile = get_profile()
    components = components_for(profile)
    embedder = components.embedder
    retriever = next(r for r in components.retrievers if r.name == "vector")
    space = embedder.space
    total = Chunk.objects.filter(space=space).count()

    products = product_names(max(1, chunks // 10))
    texts = [_QUESTIONS[i % len(_QUESTIONS)].format(product=products[(i * 13) % len(products)])
             for i in range(queries + warmup)]
    vectors = embedder.embed(texts)

    vector_index.clear()
    t0 = time.perf_counter()
    vector_index.search(space, vectors[0], k)
    cold_ms = (time.perf_counter() - t0) * 1000

    entry = vector_index.matrix_for(space)
    cursor = iter(range(10**9))

    def search():
        vector_index.search(space, vectors[next(cursor) % len(vectors)], k)

    def numpy_only():
        query = vectors[next(cursor) % len(vectors)]
        scores = entry.matrix @ (query / np.linalg.norm(query))
        top = np.argpartition(-scores, k - 1)[:k]
        top[np.argsort(-scores[top], kind="stable")]

    def stamp():
        vector_index.matrix_for(space)

    def embed():
        embedder.embed([texts[next(cursor) % len(texts)]])

    conversation = Conversation(profile=profile.name)  # never saved: only turn.warn reads it

    def retrieve():
        text = texts[next(cursor) % len(texts)]
        turn = TurnContext(conversation=conversation, profile=profile, components=components, question=text)
        hits = async_to_sync(retriever.retrieve)(Query(text=text, original=text), turn, k)
        assert len(hits) == min(k, total)

    rows = {}
    for name, fn in (("vector_index.search (warm)", search), ("  numpy product + top-k only", numpy_only),
                     ("  stamp query only", stamp), ("hashing embedder, 1 query", embed),
                     ("VectorRetriever.retrieve (embed+search+fetch)", retrieve)):
        _timed(fn, warmup)
        rows[name] = _timed(fn, queries)
    return {"chunks": total, "dimension": entry.matrix.shape[1], "cold_ms": cold_ms, "rows": rows}


def run(sizes=(20_000,), *, queries: int = 300, warmup: int = 10, k: int = 10) -> list[dict]:
    """Measure each corpus size in turn (sizes are cumulative totals, stored incrementally)."""
    results, stored = [], 0
    for size in sorted(sizes):
        result = measure(size - stored, queries=queries, warmup=warmup, k=k, seed=11 + len(results))
        stored = result["chunks"]
        results.append(result)
    return results


def report(results: list[dict], database: str, k: int) -> str:
    lines = [f"In-process vector search ({database}); {machine()}; top-{k}; "
             f"load average {os.getloadavg()[0]:.2f}", ""]
    rows = []
    for result in results:
        label = f"{result['chunks']:,} x {result['dimension']}"
        rows.append([label, "cold load (clear + first search)", 1, result["cold_ms"], result["cold_ms"], ""])
        for name, ms in result["rows"].items():
            rows.append([label, name, len(ms), median(ms), percentile(ms, 99),
                         f"{100 / percentile(ms, 99):.0f}x" if "retrieve" in name else ""])
    lines.append(table(["chunks", "operation", "runs", "p50 ms", "p99 ms", "headroom to 100 ms"], rows))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=lambda s: [int(x) for x in s.split(",")], default=[20_000],
                        help="comma-separated corpus sizes (default 20000)")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("-k", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run in seconds")
    args = parser.parse_args(argv)
    if args.quick:
        args.chunks, args.queries = [500], 20
    with bench_database() as database:
        print(report(run(args.chunks, queries=args.queries, k=args.k), database, args.k))


if __name__ == "__main__":
    main()
