"""Pipeline overhead per turn with models behind the ``openai`` client, the model server
answering instantly: what a turn costs the application itself.

    .venv/bin/python bench/bench_openai_overhead.py            # 2,000 chunks, 60 turns per cell
    .venv/bin/python bench/bench_openai_overhead.py --quick    # a few seconds, tiny sizes
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/ragchat .venv/bin/python bench/bench_openai_overhead.py

The model server is the loopback ``FakeOpenAIServer`` (``django_ragchat.testing``) in this
process: it answers at once (no token delay), so a turn's wall time is the application's cost:
the pipeline, the database, and the ``openai`` client's own work (building requests, HTTP on
127.0.0.1, parsing JSON and server-sent events). Nothing is subtracted. For scale, the table of
bare client round trips shows what one request of each kind costs outside the pipeline (the
same client, loop and server), i.e. the floor that the model calls of a turn add.

Two profiles, both answering and embedding through the server (``llm``/``embedder``
``openai``, token-window memory, vector search over a synthetic corpus embedded by the server):

* ``plain``: no query transformer: one embedding request and one chat request per turn;
* ``rewrite+3``: the ``rewrite`` transformer and the ``multi_query`` expander (n=3): a rewrite
  call, an expansion call, one embedding request for the 4 queries, the answer: 3 chat
  requests and 1 embedding request per turn (with history; every measured turn has some).

Every measured turn runs in its own conversation holding exactly N earlier messages (2, 50,
200; ``bench_pipeline.make_conversation``). Turns are driven two ways: on one long-lived event
loop (``run_turn`` / consuming ``stream_turn``, as under ASGI: one pooled client per server),
and through the synchronous facade ``run_turn_sync`` (as under WSGI: an event loop, hence an
HTTP client and its connection, per turn). Cells are measured round-robin so that other load on
the machine spreads over all of them. Reported per cell: median and p99 wall time, the ratio to
the 2-message cell, the model HTTP requests each turn made (counted by the server), and
per-stage medians from the turn traces.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._setup import bench_database, machine, median, percentile, product_names, store_chunks, table
from bench.bench_pipeline import make_conversation, questions

STAGES = ("memory", "query_transformers", "query_expanders", "retrieval", "prompt", "llm", "total")
PROFILES = ("plain", "rewrite+3")
# (driver, mode): one event loop for every turn (ASGI); run_turn_sync (WSGI: the process's
# background loop, one client per process); and the previous run_turn_sync, a plain
# async_to_sync (a new loop, hence a new HTTP client and connection, per turn), as the baseline.
DRIVERS = (("loop", "whole"), ("loop", "streamed"), ("sync", "whole"), ("sync-loop-per-turn", "whole"))


def profiles(base_url: str) -> dict:
    server = {"base_url": base_url, "model": "gpt-4o-mini", "embedding_model": "text-embedding-3-small",
              "embedding_dimensions": 64, "max_retries": 0, "timeout": 10}
    common = {"llm": "openai", "embedder": "openai", "memory": "token_window", "options": {"openai": server}}
    return {
        "plain": {**common, "query_transformers": []},
        "rewrite+3": {**common, "query_transformers": ["rewrite"], "query_expanders": ["multi_query"],
                      "options": {"openai": server, "multi_query": {"n": 3}}},
    }


def script(server) -> None:
    """Replies for the helper calls; answers use the server's default ("Answer to: ...")."""
    server.when(contains="Search query:", reply=lambda request: "Aurora A1 battery price")
    server.when(contains="Search queries:", reply="Aurora A1 battery life\nAurora A1 charging time\n"
                                                  "Aurora A1 battery capacity")


async def _turn(conversation, text: str, mode: str) -> dict:
    from django_ragchat.events import Completed, Failed
    from django_ragchat.turn.pipeline import run_turn, stream_turn

    if mode == "whole":
        result = await run_turn(conversation, text)
        if result.error:
            raise RuntimeError(f"turn failed: {result.error.code} {result.error.message}")
        return result.message
    async with contextlib.aclosing(stream_turn(conversation, text, stream=True)) as events:
        async for event in events:
            if isinstance(event, Failed):
                raise RuntimeError(f"streamed turn failed: {event.code} {event.message}")
            if isinstance(event, Completed):
                return event.message
    raise RuntimeError("the stream ended without a final event")


def one_turn(runner: asyncio.Runner, conversation, text: str, driver: str, mode: str) -> dict:
    from django_ragchat.turn.pipeline import run_turn_sync

    if driver.startswith("sync"):
        if driver == "sync":
            result = run_turn_sync(conversation, text)
        else:
            from asgiref.sync import async_to_sync

            from django_ragchat.turn.pipeline import run_turn

            result = async_to_sync(run_turn)(conversation, text)
        if result.error:
            raise RuntimeError(f"turn failed: {result.error.code} {result.error.message}")
        return result.message
    return runner.run(_turn(conversation, text, mode))


def bare_round_trips(runner: asyncio.Runner, base_url: str, repeat: int) -> dict[str, list[float]]:
    """Milliseconds of single requests through the bare client: the floor of a model call."""
    from django_ragchat.backends.openai import ChatModel, OpenAIConnection

    chat = ChatModel(OpenAIConnection(base_url=base_url, max_retries=0), model="gpt-4o-mini")
    messages = [{"role": "system", "content": "You answer questions. " * 10},
                {"role": "user", "content": "Context passages: " + "battery charge hours " * 150
                                            + "\n\nQuestion: How long does the battery last?"}]

    async def measure():
        client = await chat.connection.async_client()
        found = {"embeddings (1 text)": [], "chat, whole": [], "chat, streamed": []}
        for _ in range(repeat):
            t0 = time.perf_counter()
            await client.embeddings.create(model="text-embedding-3-small", input=["battery life"], dimensions=64)
            t1 = time.perf_counter()
            await chat.complete(messages)
            t2 = time.perf_counter()
            async for _delta in chat.stream(messages):
                pass
            t3 = time.perf_counter()
            for key, ms in zip(found, ((t1 - t0), (t2 - t1), (t3 - t2))):
                found[key].append(ms * 1000)
        return found

    return runner.run(measure())


def run(*, chunks: int = 2000, histories=(2, 50, 200), turns: int = 60, warmup: int = 5, seed: int = 7) -> dict:
    """Start the server, store the corpus, measure every (profile, history, driver) cell.

    Returns {"chunks", "ingest_s", "bare": {kind: [ms]}, "cells": [{"profile", "history",
    "driver", "mode", "ms": [...], "requests": [(chat, embeddings) per turn], "stages": {...}}]}.
    """
    from asgiref.sync import sync_to_async
    from django.db import connections
    from django.test import override_settings

    from django_ragchat.models import Conversation, TurnTrace
    from django_ragchat.testing.openai_server import FakeOpenAIServer

    with FakeOpenAIServer() as server, asyncio.Runner() as runner:
        configs = profiles(server.base_url)
        settings = override_settings(RAGCHAT={"LOAD_ENTRY_POINTS": False,
                                              "PROFILES": {"default": configs["plain"], **configs}})
        settings.enable()
        try:
            started = time.perf_counter()
            stored = store_chunks(chunks, seed=seed)  # embedded by the server, through the sync client
            ingest_s = time.perf_counter() - started
            script(server)
            products = product_names(max(1, chunks // 10))
            asked = questions(products)
            cells = [{"profile": p, "history": h, "driver": d, "mode": m, "ms": [], "requests": [], "ids": []}
                     for p in PROFILES for h in histories for d, m in DRIVERS]
            # Each cell gets its own conversations, made up front (one per turn).
            for n, cell in enumerate(cells):
                made = [make_conversation(cell["history"], products, offset=n * 1000 + i)
                        for i in range(warmup + turns)]
                Conversation.objects.filter(pk__in=[c.pk for c in made]).update(profile=cell["profile"])
                for conversation in made:
                    conversation.profile = cell["profile"]
                cell["conversations"] = made
            for i in range(warmup + turns):
                text = next(asked)  # the same question for every cell of a round
                for cell in cells:
                    before = server.requests
                    t0 = time.perf_counter()
                    message = one_turn(runner, cell["conversations"][i], text, cell["driver"], cell["mode"])
                    elapsed = (time.perf_counter() - t0) * 1000
                    made = server.requests[len(before):]
                    if i >= warmup:
                        cell["ms"].append(elapsed)
                        cell["ids"].append(message["id"])
                        cell["requests"].append((sum(r.path.endswith("chat/completions") for r in made),
                                                 sum(r.path.endswith("embeddings") for r in made)))
            bare = bare_round_trips(runner, server.base_url, repeat=max(20, turns))
            for cell in cells:
                del cell["conversations"]
                cell["stages"] = {stage: [] for stage in STAGES}
                for data in TurnTrace.objects.filter(message_id__in=cell.pop("ids")).values_list("data", flat=True):
                    for stage in STAGES:
                        if stage in data["timings"]:
                            cell["stages"][stage].append(data["timings"][stage])
        finally:
            # The loop's turns ran their queries on asgiref's thread: close its connections there
            # (PostgreSQL refuses to drop a database that still has sessions).
            runner.run(sync_to_async(connections.close_all)())
            settings.disable()
    return {"chunks": stored, "ingest_s": ingest_s, "bare": bare, "cells": cells}


def _requests(cell: dict) -> str:
    kinds = sorted(set(cell["requests"]))
    return " / ".join(f"{chat} chat + {emb} emb" for chat, emb in kinds)


def report(results: dict, database: str) -> str:
    cells = results["cells"]
    base = {(c["profile"], c["driver"], c["mode"]): median(c["ms"]) for c in cells
            if c["history"] == min(x["history"] for x in cells)}
    lines = [
        (f"Pipeline overhead per turn through the openai client, model server answering instantly; "
         f"{results['chunks']:,} chunks embedded by the server in {results['ingest_s']:.1f} s"),
        f"{database}; {machine()}; load average {os.getloadavg()[0]:.2f}",
        ("loop = one event loop for all turns (ASGI); sync = run_turn_sync (WSGI: the process's background "
         "loop and its clients); sync-loop-per-turn = the previous run_turn_sync (a loop and a client per turn)"),
        "",
        table(
            ["profile", "history", "driver", "mode", "turns", "median ms", "p99 ms", "vs 2 msgs",
             "model requests per turn"],
            [[c["profile"], c["history"], c["driver"], c["mode"], len(c["ms"]), median(c["ms"]),
              percentile(c["ms"], 99), f"{median(c['ms']) / base[(c['profile'], c['driver'], c['mode'])]:.2f}x",
              _requests(c)] for c in cells],
        ),
        "",
        ("Per-stage medians (ms) from the turn traces (the helper model calls are inside query "
         "transformers/expanders, the embedding request inside retrieval):"),
        table(
            ["profile", "history", "driver", "mode", *[s.replace("_", " ") for s in STAGES]],
            [[c["profile"], c["history"], c["driver"], c["mode"], *[median(c["stages"][s]) for s in STAGES]]
             for c in cells],
        ),
        "",
        "Bare client round trips (same loop and server, outside the pipeline):",
        table(["request", "n", "median ms", "p99 ms"],
              [[kind, len(ms), median(ms), percentile(ms, 99)] for kind, ms in results["bare"].items()]),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=2000)
    parser.add_argument("--turns", type=int, default=60, help="measured turns per cell")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--histories", type=lambda s: [int(x) for x in s.split(",")], default=[2, 50, 200],
                        help="comma-separated numbers of earlier messages (default 2,50,200)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run in seconds")
    args = parser.parse_args(argv)
    if args.quick:
        args.chunks, args.turns, args.warmup, args.histories = 200, 3, 1, [2, 20]
    with bench_database() as database:
        results = run(chunks=args.chunks, histories=args.histories, turns=args.turns, warmup=args.warmup)
        print(report(results, database))


if __name__ == "__main__":
    main()
