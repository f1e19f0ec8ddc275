"""The pipeline's own cost per turn, before and after a change to it, in one process.

    .venv/bin/python bench/bench_pipeline_refactor.py                 # against 4b5fd00
    .venv/bin/python bench/bench_pipeline_refactor.py --baseline REF  # any commit (needs git)
    .venv/bin/python bench/bench_pipeline_refactor.py --quick

The baseline is ``django_ragchat/pipeline.py`` as of ``REF`` (``git show``), loaded as a module
of its own next to the current one; both drive the same stages, components, database and
corpus (the default profile on 10,000 synthetic chunks, as ``bench_pipeline.py``). Turns
alternate between the two pipelines, one each in turn, so load from other processes on this
shared machine hits both alike; the figure to read is the ratio of medians (current /
baseline), not the milliseconds.

The default baseline is the last commit before advisors, the retry event, pluggy-called
lifecycle hooks and the stage-by-stage ``stream_turn`` (branch ``advisors``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
import types
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._setup import bench_database, machine, median, percentile, product_names, store_chunks, table
from bench.bench_pipeline import make_conversation, questions

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BASELINE = "4b5fd00"


def load_baseline(ref: str) -> types.ModuleType:
    source = subprocess.run(["git", "show", f"{ref}:django_ragchat/pipeline.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    module = types.ModuleType("ragchat_baseline_pipeline")
    module.__file__ = f"<{ref}:django_ragchat/pipeline.py>"
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


async def _stream(pipeline, conversation, text: str) -> dict:
    from django_ragchat.events import Completed, Failed

    final = None
    async with contextlib.aclosing(pipeline.stream_turn(conversation, text, stream=True)) as events:
        async for event in events:
            if isinstance(event, Completed):
                final = event.message
            elif isinstance(event, Failed):
                raise RuntimeError(f"streamed turn failed: {event.code} {event.message}")
    return final


def one_turn(pipeline, conversation, text: str, mode: str) -> dict:
    from asgiref.sync import async_to_sync

    if mode == "whole":
        result = pipeline.run_turn_sync(conversation, text, stream=False)
        if result.error:
            raise RuntimeError(f"turn failed: {result.error.code}")
        return result.message
    return async_to_sync(_stream)(pipeline, conversation, text)


def run(baseline_ref: str, *, chunks: int, histories: list[int], turns: int, warmup: int) -> dict:
    from django_ragchat import pipeline as current

    baseline = load_baseline(baseline_ref)
    store_chunks(chunks)
    products = product_names(max(1, chunks // 10))
    asked = questions(products)
    pipelines = {"baseline": baseline, "current": current}
    cells = [{"history": h, "mode": m, "ms": {name: [] for name in pipelines},
              "answers": {name: [] for name in pipelines},
              "conversations": {name: [make_conversation(h, products, offset=i) for i in range(warmup + turns)]
                                for name in pipelines}}
             for h in histories for m in ("whole", "streamed")]
    for i in range(warmup + turns):
        text = next(asked)
        order = list(pipelines.items()) if i % 2 else list(reversed(pipelines.items()))
        for cell in cells:
            for name, pipeline in order:
                t0 = time.perf_counter()
                message = one_turn(pipeline, cell["conversations"][name][i], text, cell["mode"])
                elapsed = (time.perf_counter() - t0) * 1000
                if i >= warmup:
                    cell["ms"][name].append(elapsed)
                    cell["answers"][name].append(message["content"])
    for cell in cells:
        cell.pop("conversations")
    return {"cells": cells, "baseline": baseline_ref}


def report(results: dict, database: str) -> str:
    rows = []
    for cell in results["cells"]:
        base, now = cell["ms"]["baseline"], cell["ms"]["current"]
        same = sum(a == b for a, b in zip(cell["answers"]["baseline"], cell["answers"]["current"], strict=True))
        rows.append([cell["history"], cell["mode"], len(now), median(base), median(now),
                     percentile(base, 90), percentile(now, 90), f"{median(now) / median(base):.3f}",
                     f"{same}/{len(now)}"])
    return "\n".join([
        f"Pipeline per turn, current vs baseline {results['baseline']} (same process, turns alternated)",
        f"{database}; {machine()}; load average {os.getloadavg()[0]:.2f}",
        "",
        table(["history", "mode", "turns", "baseline median ms", "current median ms", "baseline p90",
               "current p90", "current/baseline", "same answer"], rows),
    ])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default=DEFAULT_BASELINE)
    parser.add_argument("--chunks", type=int, default=10_000)
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    histories = [2, 50]
    if args.quick:
        args.chunks, args.turns, args.warmup, histories = 300, 3, 1, [2]
    with bench_database() as database:
        print(report(run(args.baseline, chunks=args.chunks, histories=histories, turns=args.turns,
                         warmup=args.warmup), database))


if __name__ == "__main__":
    main()
