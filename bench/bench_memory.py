"""Memory per idle websocket and per open stream: one uvicorn worker's RSS, beside a bare consumer.

    .venv/bin/python bench/bench_memory.py                 # 1,000 idle sockets, 100 open streams
    .venv/bin/python bench/bench_memory.py --quick         # 50 idle sockets, 10 streams
    .venv/bin/python bench/bench_memory.py --sockets 2000 --streams 200

Processes, on loopback (the helpers of ``bench_streaming.py``): this one (the clients); the
loopback OpenAI-compatible model server (``FakeOpenAIServer``) streaming each answer as
``--tokens`` one-word tokens, ``--token-delay`` seconds apart (a slow model, so that every
stream is still open when the worker is measured); and, one after the other, four single
uvicorn workers, started together, each measured in one phase only so that no phase reuses
memory another phase freed:

* ``app``: ``example_project.asgi`` (the chat consumer, in-memory channel layer, a SQLite file
  holding the demo's sample documents), the clients logged in, a user of their own each;
* ``bare``: ``bench/bare_relay.py``, a bare Channels ``AsyncJsonWebsocketConsumer`` sending
  ``ready`` on connect and, for a message, the same tokens at the same pace; no database, no
  model, no channel-layer group: the floor.

Every worker is warmed up first, all at once (5 sockets, one turn each), then its RSS (``VmRSS`` of
``/proc/<pid>/status``, the worker process itself: uvicorn runs the app in the process it
starts with one worker) is read, with its number of threads:

* idle: before and after opening ``--sockets`` websockets (each answered ``ready``, then left
  idle for a second); KB per socket = the growth / sockets;
* streams: with ``--streams`` idle sockets open, then after every one of them has sent a
  message and received its first ``delta`` (the worker holding that many answers mid-stream;
  the table says how many had already finished, which should be 0); KB per stream = the growth
  / streams. Every answer is then read to its end and its tokens counted (lost, duplicated,
  out of order) and, on the app, compared with the saved answer.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._setup import machine, table
from bench.bench_streaming import (
    Caller,
    answer,
    check_saved,
    database,
    free_port,
    fresh_conversations,
    make_callers,
    process,
    reply_text,
)

WARM_UP = 5
OPENING = 100  # websocket handshakes in flight at once


def status(pid: int) -> tuple[int, int]:
    """The resident set of process ``pid`` in KB (``VmRSS``) and its number of threads."""
    fields = {}
    with open(f"/proc/{pid}/status") as lines:
        for line in lines:
            key, _, value = line.partition(":")
            fields[key] = value.split()
    return int(fields["VmRSS"][0]), int(fields["Threads"][0])


def raise_file_limit(needed: int) -> tuple[int, int]:
    """Raise this process's open-file limit (inherited by the servers it starts) to ``needed``
    if the hard limit allows; returns the soft limit before and after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        wanted = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    after = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if after != resource.RLIM_INFINITY and after < needed:
        raise SystemExit(f"open-file limit {after} (hard {hard}) is below the {needed} this run needs")
    return soft, after


@dataclass
class Socket:
    ws: object
    caller: Caller
    conversation_id: str | None = None
    first: asyncio.Event = field(default_factory=asyncio.Event)
    done: bool = False


async def open_sockets(address: str, callers: list[Caller]) -> list[Socket]:
    """One websocket per caller, ``OPENING`` handshakes at a time, each answered ``ready``."""
    import websockets

    gate = asyncio.Semaphore(OPENING)

    async def one(caller: Caller) -> Socket:
        cookie = "; ".join(f"{k}={v}" for k, v in caller.cookies.items())
        async with gate:
            ws = await websockets.connect(f"ws://{address}/ws/ragchat/", origin=f"http://{address}",
                                          additional_headers={"Cookie": cookie}, max_size=None,
                                          open_timeout=120, ping_interval=None)
            frame = json.loads(await ws.recv())
            if frame["type"] != "ready":
                raise RuntimeError(f"expected ready, got {frame}")
        return Socket(ws, caller)

    return list(await asyncio.gather(*(one(c) for c in callers)))


async def close_sockets(sockets: list[Socket]) -> None:
    await asyncio.gather(*(s.ws.close() for s in sockets), return_exceptions=True)


async def stream(sock: Socket, expected: str):
    """Send a message on ``sock`` and read its answer to the end, setting ``sock.first`` at the
    first ``delta``."""
    sent = time.perf_counter()
    await sock.ws.send(json.dumps({"type": "message", "content": "How much does the Aurora X2 cost?",
                                   "conversation_id": sock.conversation_id}))
    first, texts, indexes = None, [], []
    while True:
        frame = json.loads(await sock.ws.recv())
        if frame["type"] == "delta":
            if first is None:
                first = time.perf_counter()
                sock.first.set()
            texts.append(frame["text"])
            indexes.append(frame["index"])
        elif frame["type"] == "done":
            sock.done = True
            return answer("", sent, first, texts, indexes, expected, frame["message"]["content"],
                          sock.conversation_id)
        elif frame["type"] == "error":
            raise RuntimeError(f"turn failed: {frame}")


async def idle_phase(address: str, pid: int, callers: list[Caller], settle: float) -> dict:
    before = status(pid)
    sockets = await open_sockets(address, callers)
    await asyncio.sleep(settle)
    after = status(pid)
    await close_sockets(sockets)
    return {"before": before, "after": after, "count": len(sockets)}


async def stream_phase(address: str, pid: int, callers: list[Caller], conversation_ids: list[str | None],
                       expected: str, settle: float) -> dict:
    sockets = await open_sockets(address, callers)
    for sock, conversation_id in zip(sockets, conversation_ids):
        sock.conversation_id = conversation_id
    await asyncio.sleep(settle)
    before = status(pid)
    tasks = [asyncio.ensure_future(stream(s, expected)) for s in sockets]
    started = asyncio.gather(*(s.first.wait() for s in sockets))
    pending = {started, *tasks}
    while not started.done():
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for task in done - {started}:
            if task.exception():  # a turn failed before every stream was open
                started.cancel()
                raise task.exception()
    after = status(pid)
    finished = sum(s.done for s in sockets)
    answers = await asyncio.gather(*tasks)
    await close_sockets(sockets)
    return {"before": before, "after": after, "count": len(sockets), "finished": finished, "answers": answers}


def warm_up(addresses: list[str], callers: list[Caller], conversations, expected: str) -> None:
    """On every worker at once, open a few sockets and run a turn on each, so that imports and
    first-use caches are in the worker before it is measured."""
    async def one(address: str):
        sockets = await open_sockets(address, callers)
        for sock, conversation_id in zip(sockets, await asyncio.to_thread(conversations, address)):
            sock.conversation_id = conversation_id
        await asyncio.gather(*(stream(s, expected) for s in sockets))
        await close_sockets(sockets)

    async def every():
        await asyncio.gather(*(one(address) for address in addresses))

    asyncio.run(every())


def worker(kind: str, env: dict, delay: float) -> tuple[contextlib.ExitStack, str, int]:
    """A fresh single uvicorn worker serving the app or the bare relay: a stack that stops it, its
    address and its pid."""
    app = "example_project.asgi:application" if kind == "app" else "bench.bare_relay:application"
    port, pids, stack = free_port(), {}, contextlib.ExitStack()
    address = stack.enter_context(process([
        sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port),
        "--ws-per-message-deflate", "false", "--lifespan", "off", "--no-access-log", "--log-level", "warning",
        "--backlog", "4096",
    ], {**env, "RAGCHAT_BENCH_TOKEN_DELAY": str(delay)}, port, kind, pids=pids))
    return stack, address, pids[kind]


def measure(kind: str, phase: str, worker: tuple[str, int], callers: list[Caller], count: int,
            expected: str, settle: float) -> dict:
    """One phase measured on a fresh (warmed-up) worker."""
    address, pid = worker
    group = callers[:count]
    if phase == "idle":
        return asyncio.run(idle_phase(address, pid, group, settle))
    conversation_ids = fresh_conversations(group) if kind == "app" else [None] * len(group)
    result = asyncio.run(stream_phase(address, pid, group, conversation_ids, expected, settle))
    if kind == "app":
        check_saved(result["answers"])
    return result


def row(kind: str, phase: str, result: dict) -> list:
    (before, threads_before), (after, threads_after) = result["before"], result["after"]
    answers = result.get("answers")
    return [
        "app (chat consumer)" if kind == "app" else "bare Channels consumer",
        "idle sockets" if phase == "idle" else "open streams", f"{result['count']:,}",
        f"{before / 1024:.1f}", f"{after / 1024:.1f}", f"{(after - before) / result['count']:.1f}",
        f"{threads_before} -> {threads_after}",
        "" if answers is None else str(result["finished"]),
        "" if answers is None else (
            f"{sum(a.lost for a in answers)}/{sum(a.duplicated for a in answers)}/"
            f"{sum(a.reordered for a in answers)}/{sum(not a.whole for a in answers)}"),
        "" if answers is None or kind != "app" else str(sum(a.saved_differs for a in answers)),
    ]


def run(sockets: int, streams: int, tokens: int, delay: float, settle: float = 1.0) -> list[list]:
    with tempfile.TemporaryDirectory(prefix="ragchat-bench-memory-") as tmpdir:
        model_port = free_port()
        env = {**os.environ, "RAGCHAT_BENCH_LLM": "openai", "RAGCHAT_BENCH_TOKENS": str(tokens),
               "RAGCHAT_BENCH_MODEL_URL": f"http://127.0.0.1:{model_port}/v1", "PYTHONPATH": str(ROOT)}
        os.environ.update({k: env[k] for k in ("RAGCHAT_BENCH_LLM", "RAGCHAT_BENCH_MODEL_URL")})
        with contextlib.ExitStack() as stack:
            stack.enter_context(process([
                sys.executable, str(ROOT / "bench" / "bench_streaming.py"), "--serve-model", str(model_port),
                "--tokens", str(tokens), "--token-delay", str(delay),
                "--arrivals", os.path.join(tmpdir, "arrivals.log")], env, model_port, "model server"))
            env.update(stack.enter_context(database(tmpdir)), DJANGO_SETTINGS_MODULE="bench.streaming_settings")
            callers = make_callers(max(sockets, streams, WARM_UP))
            phases = [(kind, phase, count) for phase, count in (("idle", sockets), ("streams", streams))
                      for kind in ("app", "bare")]
            # A worker of its own for each phase, all started at once (an idle worker costs no CPU).
            with ThreadPoolExecutor(len(phases)) as pool:
                started = list(pool.map(lambda p: worker(p[0], env, delay), phases))
            for worker_stack, _, _ in started:
                stack.enter_context(worker_stack)
            apps = {address for (kind, _, _), (_, address, _) in zip(phases, started) if kind == "app"}
            warm_up([address for _, address, _ in started], callers[:WARM_UP],
                    lambda address: fresh_conversations(callers[:WARM_UP]) if address in apps else [None] * WARM_UP,
                    reply_text(tokens))
            return [row(kind, phase, measure(kind, phase, (address, pid), callers, count, reply_text(tokens), settle))
                    for (kind, phase, count), (_, address, pid) in zip(phases, started)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sockets", type=int, default=1000, help="idle websockets to open")
    parser.add_argument("--streams", type=int, default=100, help="answers to hold open at once")
    parser.add_argument("--tokens", type=int, default=300, help="tokens per answer")
    parser.add_argument("--token-delay", type=float, default=0.04,
                        help="seconds between the model's tokens (long enough that every stream is open at once)")
    parser.add_argument("--settle", type=float, default=1.0,
                        help="seconds between the last socket opened and the RSS read")
    parser.add_argument("--quick", action="store_true", help="50 idle sockets, 10 streams of 20 tokens")
    args = parser.parse_args(argv)
    if args.quick:
        args.sockets, args.streams, args.tokens, args.token_delay = 50, 10, 20, 0.05
    # Each client socket is a file here and one in the worker; the model server's too.
    before, after = raise_file_limit(2 * max(args.sockets, args.streams) + 256)
    started = time.perf_counter()
    rows = run(args.sockets, args.streams, args.tokens, args.token_delay, args.settle)
    from django.db import connection

    print(f"Memory: one uvicorn worker per row, started fresh and warmed up ({WARM_UP} sockets, a turn each); "
          f"answers of {args.tokens} tokens {args.token_delay * 1000:g} ms apart; {connection.vendor}; "
          f"open-file limit {before} -> {after}; {machine()}")
    print("RSS: VmRSS of the worker process, MB, before and after opening the sockets (idle) or after every "
          "open socket's answer has begun (streams, over the same sockets idle). KB each: the growth / count. "
          "threads: the worker's threads before -> after. "
          "finished: answers already done when measured (should be 0). lost/dup/reord/incomplete: tokens lost, "
          "duplicated, out of order, answers not exactly the model's text. saved!=: saved answers that are not "
          "the text streamed.")
    print(table(["worker", "what", "count", "RSS before", "RSS after", "KB each", "threads", "finished",
                 "lost/dup/reord/incomplete", "saved!="], rows))
    print(f"load average {os.getloadavg()[0]:.2f}; took {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
