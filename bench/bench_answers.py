"""The answer builder and the sources filter: what they cost, as ratios in one process.

    .venv/bin/python bench/bench_answers.py            # 2,000 chunks, 40 turns per profile
    .venv/bin/python bench/bench_answers.py --quick

1. ``build_answer`` on typical replies (default references, "acm", XML tags) against the
   previous ``citations`` work (the default reference parser and ``Citation`` objects), in
   microseconds per reply, alternated in rounds.
2. Whole turns of the default profile with and without ``sources_filter`` (hashing embedder,
   append on), turns alternated between two profiles on the same corpus: the ratio of medians
   is the filter's cost per turn (one embedding batch of the answer and the prompt's passages).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._setup import bench_database, machine, median, percentile, product_names, store_chunks, table
from bench.bench_pipeline import make_conversation, questions

REPLIES = {
    "default": "The Aurora X2 costs $699 [1]. The 256 GB model costs $799 [1, 3]. Battery: two days [2-3].",
    "acm": "The Aurora X2 costs $699 answer[1, 2]. The Nimbus Tab costs $449 [3].",
    "xml": "<thinking>Passages [1] and [4] mention prices; [2] is about the camera.</thinking>\n"
           "<answer>The Aurora X2 costs $699 [1]; the 256 GB model $799 [4].</answer>",
}
OPTIONS = {"default": {"reference_pattern": "default"}, "acm": {"reference_pattern": "acm"},
           "xml": {"reference_pattern": "default", "extract_xml_tags": ["answer"]}}


def builder_cost(rounds: int, per_round: int) -> list[list]:
    from django_ragchat.stages.answers import build_answer, parse_default_references
    from django_ragchat.types import Citation, RetrievedChunk

    docs = tuple(RetrievedChunk(chunk_id=i, text=f"passage {i}", score=1.0, document_id=i, source=f"d{i}.md")
                 for i in range(1, 7))

    def previous(reply):
        indices, _ = parse_default_references(reply)
        return [Citation(index=n, chunk_id=docs[n - 1].chunk_id) for n in indices if 1 <= n <= len(docs)]

    rows = []
    for name, reply in REPLIES.items():
        times = {"previous": [], "build_answer": []}
        for i in range(rounds):
            order = [("previous", lambda: previous(reply)),
                     ("build_answer", lambda: build_answer(reply, docs, **OPTIONS[name]))]
            for label, call in (order if i % 2 else order[::-1]):
                t0 = time.perf_counter()
                for _ in range(per_round):
                    call()
                times[label].append((time.perf_counter() - t0) / per_round * 1e6)
        rows.append([name, f"{median(times['previous']):.1f}", f"{median(times['build_answer']):.1f}",
                     f"{median(times['build_answer']) / median(times['previous']):.2f}"])
    return rows


def turn_cost(chunks: int, turns: int, warmup: int) -> tuple[list, str]:
    from asgiref.sync import async_to_sync
    from django.test import override_settings

    from django_ragchat import plugins
    from django_ragchat.turn.pipeline import run_turn_sync, stream_turn

    store_chunks(chunks)
    products = product_names(max(1, chunks // 10))
    asked = questions(products)
    profiles = {
        "default": {},
        "filtered": {"response_augmenters": ["citations", "sources_filter"],
                     "options": {"sources_filter": {"threshold": 0.3, "append": True}}},
    }
    kept = []
    rows = []
    with override_settings(RAGCHAT={"LOAD_ENTRY_POINTS": False, "PROFILES": profiles}):
        plugins.reset()
        for mode in ("whole", "streamed"):
            ms = {name: [] for name in profiles}
            for i in range(warmup + turns):
                text = next(asked)
                names = list(profiles) if i % 2 else list(profiles)[::-1]
                for name in names:
                    conversation = make_conversation(2, products, offset=i)
                    conversation.profile = name
                    conversation.save(update_fields=["profile"])
                    t0 = time.perf_counter()
                    if mode == "whole":
                        result = run_turn_sync(conversation, text)
                        message = result.message
                    else:
                        async def run(conversation=conversation, text=text):
                            return [e async for e in stream_turn(conversation, text, stream=True)][-1].message
                        message = async_to_sync(run)()
                    elapsed = (time.perf_counter() - t0) * 1000
                    if i >= warmup:
                        ms[name].append(elapsed)
                        if name == "filtered":
                            kept.append(len(message["sources"]))
            rows.append([mode, turns, f"{median(ms['default']):.1f}", f"{median(ms['filtered']):.1f}",
                         f"{percentile(ms['default'], 90):.1f}", f"{percentile(ms['filtered'], 90):.1f}",
                         f"{median(ms['filtered']) / median(ms['default']):.3f}"])
    note = f"sources kept per filtered turn: median {median(kept):.0f} (threshold 0.3, hashing embedder)"
    return rows, note


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=2_000)
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    rounds, per_round, warmup = 21, 500, 3
    if args.quick:
        args.chunks, args.turns, rounds, per_round, warmup = 200, 3, 3, 50, 1
    with bench_database() as database:
        print(f"Answer builder and sources filter; {database}; {machine()}; load average {os.getloadavg()[0]:.2f}\n")
        print(table(["reply", "previous citations µs", "build_answer µs", "ratio"], builder_cost(rounds, per_round)))
        print()
        rows, note = turn_cost(args.chunks, args.turns, warmup)
        print(table(["mode", "turns", "default median ms", "with sources_filter median ms", "default p90",
                     "filtered p90", "filtered/default"], rows))
        print(note)


if __name__ == "__main__":
    main()
