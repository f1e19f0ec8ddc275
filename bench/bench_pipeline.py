"""Pipeline overhead per turn on the embedded defaults, as a function of history length.

    .venv/bin/python bench/bench_pipeline.py            # 10k chunks, 50 turns per cell
    .venv/bin/python bench/bench_pipeline.py --quick    # a few seconds, tiny sizes
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/ragchat .venv/bin/python bench/bench_pipeline.py

The default profile: offline hashing embedder, vector search (in process on SQLite, pgvector
on PostgreSQL), the ``followup`` transformer, the extractive answerer. The corpus is synthetic
Markdown-like product documentation (``_setup.synthetic_chunks``), stored with ``bulk_create``
and embedded by the profile's embedder.

Every measured turn runs in its own conversation holding exactly N earlier messages (created
with ``bulk_create``, ``Conversation.last_seq`` set), so each cell measures one history
length. Turns alternate between self-contained questions and dependent follow-ups ("How much
does it cost?") so the follow-up transformer has work to do. For each history length and mode
(``run_turn_sync`` whole, and consuming ``stream_turn`` streamed) it reports the wall-clock
median and p99 over the measured turns (after warm-up turns, which also load the vector index;
cells are measured round-robin so that other load on the machine spreads over all of them),
the SQL queries of a turn (``CaptureQueriesContext``, on separate turns so the debug cursor does
not skew the timings) and the per-stage medians from ``TurnTrace.data["timings"]``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._setup import bench_database, machine, median, percentile, product_names, store_chunks, table

STAGES = ("input_guardrails", "memory", "query_transformers", "query_expanders", "retrieval", "join",
          "postprocess", "prompt", "llm", "response_augmenters", "total")
MODES = ("whole", "streamed")

_SELF_CONTAINED = (
    "How long does the {product} battery last on a charge?",
    "What does the {product} warranty cover?",
    "How do I reset the {product} network settings?",
)
_FOLLOW_UPS = (
    "How much does it cost?",
    "What about its camera?",
    "And the display brightness?",
)


def questions(products: list[str]):
    """An endless, deterministic mix of self-contained questions and dependent follow-ups."""
    for i in itertools.count():
        product = products[(i * 7) % len(products)]
        yield (_FOLLOW_UPS if i % 2 else _SELF_CONTAINED)[i % 3].format(product=product)


def make_conversation(earlier: int, products: list[str], offset: int):
    """A conversation with ``earlier`` complete messages (user and assistant alternating),
    inserted in one ``bulk_create``; the last user question names a product, so a follow-up
    has something to resolve against. Every message is about one product (``offset``'s): the
    conversations of each length then search alike, the follow-up transformer carrying the same
    subject and opening, and differ in their history alone."""
    from django_ragchat.models import Conversation, Message
    from django_ragchat.tokens import count_tokens

    conversation = Conversation.objects.create(profile="default", title="bench", last_seq=earlier)
    messages = []
    for seq in range(1, earlier + 1):
        product = products[offset % len(products)]
        if seq % 2:
            content = f"Tell me about the {product} and its battery and warranty."
            role = Message.Role.USER
        else:
            content = (f"The {product} battery lasts about {seq % 20 + 10} hours on a charge and "
                       f"the warranty covers repair for two years in most regions [1]. Standby "
                       f"drain is low and fast charging is supported [2].")
            role = Message.Role.ASSISTANT
        messages.append(Message(conversation=conversation, seq=seq, role=role, content=content,
                                token_count=count_tokens(content)))
    Message.objects.bulk_create(messages)
    return conversation


async def _consume_stream(conversation, text: str) -> tuple[dict, int]:
    """Run one streamed turn to its end: (the saved message payload, number of deltas)."""
    from django_ragchat.events import Completed, Delta, Failed
    from django_ragchat.turn.pipeline import stream_turn

    final, deltas = None, 0
    async with contextlib.aclosing(stream_turn(conversation, text, stream=True)) as events:
        async for event in events:
            if isinstance(event, Delta):
                deltas += 1
            elif isinstance(event, Completed):
                final = event.message
            elif isinstance(event, Failed):
                raise RuntimeError(f"streamed turn failed: {event.code} {event.message}")
    return final, deltas


def one_turn(conversation, text: str, mode: str) -> dict:
    """Run one turn in ``mode``; return the saved assistant message payload."""
    from asgiref.sync import async_to_sync

    from django_ragchat.turn.pipeline import run_turn_sync

    if mode == "whole":
        result = run_turn_sync(conversation, text, stream=False)
        if result.error:
            raise RuntimeError(f"turn failed: {result.error.code} {result.error.message}")
        return result.message
    message, _ = async_to_sync(_consume_stream)(conversation, text)
    return message


def run(*, chunks: int = 10_000, histories=(2, 50, 200), turns: int = 50, warmup: int = 5,
        query_turns: int = 3, seed: int = 7) -> dict:
    """Store ``chunks`` synthetic chunks, then measure turns for each history length and mode.

    Returns {"chunks", "ingest_s", "cells": [{"history", "mode", "ms": [...], "queries": [...],
    "stages": {stage: [ms...]}, "answered": share of answers with a citation}]}.
    """
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_ragchat.models import TurnTrace

    started = time.perf_counter()
    stored = store_chunks(chunks, seed=seed)
    ingest_s = time.perf_counter() - started
    products = product_names(max(1, chunks // 10))
    asked = questions(products)

    # Cells are measured round-robin, one turn each in turn, so that load from other processes
    # on the machine hits every cell alike instead of whichever ran while it lasted.
    cells = [{"history": history, "mode": mode, "ms": [], "queries": [], "message_ids": [], "cited": 0,
              "conversations": [make_conversation(history, products, offset=i)
                                for i in range(warmup + turns + query_turns)]}
             for history in histories for mode in MODES]
    for i in range(warmup + turns):
        text = next(asked)  # every cell gets the same question in a round
        for cell in cells:
            t0 = time.perf_counter()
            message = one_turn(cell["conversations"][i], text, cell["mode"])
            elapsed = (time.perf_counter() - t0) * 1000
            if i >= warmup:
                cell["ms"].append(elapsed)
                cell["message_ids"].append(message["id"])
                cell["cited"] += bool(message["citations"])
    texts = [next(asked) for _ in range(query_turns)]
    for cell in cells:
        for conversation, text in zip(cell.pop("conversations")[warmup + turns:], texts):
            with CaptureQueriesContext(connection) as captured:
                one_turn(conversation, text, cell["mode"])
            cell["queries"].append(len(captured))
        cell["stages"] = {stage: [] for stage in STAGES}
        traces = TurnTrace.objects.filter(message_id__in=cell.pop("message_ids")).values_list("data", flat=True)
        for data in traces:
            for stage in STAGES:
                if stage in data["timings"]:
                    cell["stages"][stage].append(data["timings"][stage])
        cell["answered"] = cell.pop("cited") / max(1, len(cell["ms"]))
    return {"chunks": stored, "ingest_s": ingest_s, "cells": cells}


def report(results: dict, database: str) -> str:
    cells = results["cells"]
    base = {c["mode"]: median(c["ms"]) for c in cells if c["history"] == cells[0]["history"]}
    lines = [
        f"Pipeline overhead per turn: {results['chunks']:,} chunks, default profile "
        f"(hashing embedder, vector search, followup transformer, extractive answerer)",
        f"{database}; {machine()}; corpus stored and embedded in {results['ingest_s']:.1f} s; "
        f"load average {os.getloadavg()[0]:.2f}",
        "",
        table(
            ["history", "mode", "turns", "median ms", "p99 ms", "vs shortest", "SQL queries", "cited"],
            [[c["history"], c["mode"], len(c["ms"]), median(c["ms"]), percentile(c["ms"], 99),
              f"{median(c['ms']) / base[c['mode']]:.2f}x",
              "/".join(str(q) for q in sorted(set(c["queries"]))),
              f"{c['answered']:.0%}"] for c in cells],
        ),
        "",
        "Per-stage medians (ms) from the turn traces:",
        table(
            ["history", "mode", *[s.replace("_", " ") for s in STAGES]],
            [[c["history"], c["mode"], *[median(c["stages"][s]) for s in STAGES]] for c in cells],
        ),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=10_000)
    parser.add_argument("--turns", type=int, default=50, help="measured turns per history length and mode")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--histories", type=lambda s: [int(x) for x in s.split(",")], default=[2, 50, 200],
                        help="comma-separated numbers of earlier messages (default 2,50,200)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run in seconds")
    args = parser.parse_args(argv)
    if args.quick:
        args.chunks, args.turns, args.warmup, args.histories = 300, 3, 1, [2, 20]
    with bench_database() as database:
        results = run(chunks=args.chunks, histories=args.histories, turns=args.turns, warmup=args.warmup)
        print(report(results, database))


if __name__ == "__main__":
    main()
