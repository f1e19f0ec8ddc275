"""The cost of the semantic default (issue 25), beside the hashing embedder, in one run.

    .venv/bin/python bench/bench_semantic.py            # ~1 minute
    .venv/bin/python bench/bench_semantic.py --quick

1. **Query embedding**: p50 and p99 of one question embedded alone (``embedder.embed([q])``), the
   868 tuning questions of the sample docs, each embedder in this process.
2. **Ingestion**: chunks per second of ``ingest_text`` (chunking, embedding, storing) over
   synthetic product documents (``bench/_setup.synthetic_chunks``), each embedder into its own space.
3. **Memory**: the resident set size of a fresh Python process before and after loading the model
   and embedding one text (``/proc/self/status`` VmRSS), beside the same for the hashing embedder.
4. **The answerer**: its time per turn at 4 passages (wall and CPU), the default profile
   (wordllama, reading meaning) beside the baseline (hashing, words only), on prompts recorded
   from tuning questions (``bench_extractive.measure_cost``): cold with every passage read from
   its text, warm, and cold over the passages' readings stored at ingestion.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._setup import ROOT, bench_database, machine, percentile, synthetic_chunks, table

EMBEDDERS = ("hashing", "wordllama")

_MEMORY_PROBE = """
import json, sys
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
import numpy, django_ragchat.backends.static as static, django_ragchat.stages.embedders as embedders
before = rss()
if sys.argv[1] == "wordllama":
    static.wordllama_model().embed(["How heavy is the Aurora X2?"])
else:
    embedders._word_features("heavy", 384)
print(json.dumps({"before": before, "after": rss()}))
"""


def memory(embedder: str) -> dict:
    """RSS in MB of a fresh process before and after loading ``embedder``'s model."""
    out = subprocess.run([sys.executable, "-c", _MEMORY_PROBE, embedder], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def query_latency(embedder, questions: list[str]) -> tuple[float, float]:
    """(p50, p99) milliseconds of embedding one question alone."""
    embedder.embed(questions[:5])  # warm the caches a long-running process has
    timings = []
    for question in questions:
        started = time.perf_counter()
        embedder.embed([question])
        timings.append((time.perf_counter() - started) * 1000)
    return percentile(timings, 50), percentile(timings, 99)


def ingestion_rate(profile: str, documents: list[tuple[str, str]]) -> tuple[int, float]:
    """(chunks stored, chunks per second) of ``ingest_text`` of ``documents`` with ``profile``."""
    from django_ragchat.ingestion.pipeline import ingest_text
    from django_ragchat.models import Chunk, Document

    Document.objects.all().delete()
    started = time.perf_counter()
    for source, text in documents:
        ingest_text(source, text, content_type="markdown", profile=profile)
    seconds = time.perf_counter() - started
    chunks = Chunk.objects.count()
    Document.objects.all().delete()
    return chunks, chunks / seconds


def synthetic_documents(chunks: int) -> list[tuple[str, str]]:
    by_doc: dict[int, list[str]] = {}
    for doc, _product, _heading, text in synthetic_chunks(chunks):
        by_doc.setdefault(doc, []).append(text)
    return [(f"bench/semantic/{doc}.md", "\n\n".join(parts)) for doc, parts in by_doc.items()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--chunks", type=int, default=2000, help="synthetic chunks to ingest per embedder")
    args = parser.parse_args(argv)
    from django.test.utils import override_settings

    from bench import bench_extractive

    chunks = 60 if args.quick else args.chunks
    with bench_database() as database, override_settings(RAGCHAT={
            **bench_extractive.RAGCHAT, "PROFILES": {**bench_extractive.RAGCHAT["PROFILES"],
                                                     "hashing": {"embedder": "hashing"},
                                                     "wordllama": {"embedder": "wordllama"}}}):
        from django_ragchat.plugins import embedder_for
        from django_ragchat.profiles import get_profile

        collection = bench_extractive.Collection.load("sample_docs")
        items = bench_extractive.load_set(collection)[: 40 if args.quick else None]
        questions = [i["question"] for i in items]
        documents = synthetic_documents(chunks)
        rows = []
        for name in EMBEDDERS:
            p50, p99 = query_latency(embedder_for(get_profile(name)), questions)
            stored, rate = ingestion_rate(name, documents)
            rss = memory(name)
            rows.append([name, f"{p50:.3f}", f"{p99:.3f}", f"{stored}", f"{rate:,.0f}",
                         f"{rss['before']:.0f}", f"{rss['after']:.0f}", f"{rss['after'] - rss['before']:+.1f}"])
        print(f"Semantic default, cost beside hashing; {database}; {machine()}")
        print(f"{len(questions)} questions embedded one at a time; {len(documents)} synthetic documents ingested")
        print(table(["embedder", "query p50 ms", "query p99 ms", "chunks", "ingest chunks/s",
                     "RSS before MB", "RSS after MB", "added MB"], rows))
        print()
        bench_extractive.ingest(collection)
        try:
            bench_extractive.run_labelled(items[: 20 if args.quick else 200])
        finally:
            from django_ragchat.models import Document

            Document.objects.all().delete()
        print(bench_extractive.measure_cost(5 if args.quick else 20))


if __name__ == "__main__":
    main()
