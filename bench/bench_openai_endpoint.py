"""The OpenAI-compatible endpoint beside the websocket: the same turn, one client at a time.

    .venv/bin/python bench/bench_openai_endpoint.py               # 200 turns per path, 100-token answers
    .venv/bin/python bench/bench_openai_endpoint.py --quick       # 10 turns per path, 20 tokens
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/ragchat .venv/bin/python bench/bench_openai_endpoint.py

Processes, as in ``bench_streaming.py``: the loopback OpenAI-compatible model server
(``FakeOpenAIServer``, each answer ``--tokens`` one-word tokens with no delay), one uvicorn
worker serving ``example_project.asgi`` (the websocket, and the endpoint at ``/openai/v1/``), one
gunicorn worker (``gthread``) serving ``example_project.wsgi``; one database with the demo's
sample documents. The ``default`` profile answers through the model server.

Every turn is the same turn on every path: a question about the sample documents starting a
new conversation of the same user (the websocket's ``message`` frame without a conversation,
the endpoint's stateless request with one user message). Each client stays connected (the
websocket open, the ``openai`` client's HTTP connection kept alive) and the paths take turns,
one turn at a time, so load from elsewhere falls on all of them alike. Measured by the client:

* ttft: message sent -> the first token received (a ``delta`` frame; a chunk with content);
* total: message sent -> the answer's end (``done``; the stream's ``[DONE]``; the whole response).

Paths: ``websocket``; ``openai stream asgi`` and ``openai whole asgi`` (the ``openai`` Python
client, ``AsyncOpenAI``, against uvicorn); ``openai httpx asgi`` (the same stream read by httpx
and ``json.loads``, as the websocket client reads its frames: what the server costs, without the
``openai`` client's parsing of each chunk into its models); ``openai stream wsgi`` (against
gunicorn); ``sse asgi`` (the app's own server-sent events, for reference); ``model openai`` and
``model httpx``: the same two clients streaming straight from the model server, no django-ragchat
(their difference is what the ``openai`` client itself costs per turn). Each answer is checked
whole.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._setup import machine, percentile, table
from bench.bench_streaming import QUESTIONS, database, free_port, make_callers, process, reply_text

PATHS = ("websocket", "openai stream asgi", "openai httpx asgi", "openai whole asgi", "openai stream wsgi", "sse asgi",
         "model openai", "model httpx")
BASELINE = "websocket"


class Paths:
    """One client per path, connected once; ``turn(path, question)`` -> (ttft, total) in seconds."""

    def __init__(self, asgi: str, wsgi: str, model: str, cookies: dict, key: str, expected: str):
        self.asgi, self.wsgi, self.model, self.cookies, self.key = asgi, wsgi, model, cookies, key
        self.expected = expected

    async def __aenter__(self) -> Paths:
        import httpx
        import openai
        import websockets

        cookie = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        self.ws = await websockets.connect(f"ws://{self.asgi}/ws/ragchat/", origin=f"http://{self.asgi}",
                                           additional_headers={"Cookie": cookie}, max_size=None)
        assert json.loads(await self.ws.recv())["type"] == "ready"
        self.openai_asgi = openai.AsyncOpenAI(base_url=f"http://{self.asgi}/openai/v1", api_key=self.key,
                                              max_retries=0, timeout=60)
        self.openai_wsgi = openai.AsyncOpenAI(base_url=f"http://{self.wsgi}/openai/v1", api_key=self.key,
                                              max_retries=0, timeout=60)
        self.openai_model = openai.AsyncOpenAI(base_url=f"http://{self.model}/v1", api_key="bench", max_retries=0,
                                               timeout=60)
        self.http = httpx.AsyncClient(timeout=60, cookies=self.cookies)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.ws.close()
        await self.openai_asgi.close()
        await self.openai_wsgi.close()
        await self.openai_model.close()
        await self.http.aclose()

    def check(self, text: str) -> None:
        if text != self.expected:
            raise RuntimeError(f"an answer arrived incomplete or changed: {text[:80]!r}")

    async def turn(self, path: str, question: str) -> tuple[float, float]:
        if path == "websocket":
            return await self.websocket(question)
        if path == "sse asgi":
            return await self.sse(question)
        if path in ("openai httpx asgi", "model httpx"):
            base = f"http://{self.asgi}/openai/v1" if path.startswith("openai") else f"http://{self.model}/v1"
            return await self.raw_stream(base, question)
        client = {"openai stream wsgi": self.openai_wsgi, "model openai": self.openai_model}.get(path, self.openai_asgi)
        if "whole" in path:
            sent = time.perf_counter()
            response = await client.chat.completions.create(model="default", messages=[
                {"role": "user", "content": question}])
            total = time.perf_counter() - sent
            self.check(response.choices[0].message.content)
            return total, total
        return await self.openai_stream(client, question)

    async def websocket(self, question: str) -> tuple[float, float]:
        sent = time.perf_counter()
        await self.ws.send(json.dumps({"type": "message", "content": question}))
        first, texts = None, []
        while True:
            frame = json.loads(await self.ws.recv())
            if frame["type"] == "delta":
                first = first or time.perf_counter()
                texts.append(frame["text"])
            elif frame["type"] == "done":
                total = time.perf_counter() - sent
                self.check("".join(texts))
                self.ws_conversation = frame["conversation_id"]
                return first - sent, total
            elif frame["type"] == "error":
                raise RuntimeError(f"websocket turn failed: {frame}")

    async def openai_stream(self, client, question: str) -> tuple[float, float]:
        sent = time.perf_counter()
        first, texts = None, []
        stream = await client.chat.completions.create(model="default", stream=True, messages=[
            {"role": "user", "content": question}])
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                first = first or time.perf_counter()
                texts.append(chunk.choices[0].delta.content)
        total = time.perf_counter() - sent
        self.check("".join(texts))
        return first - sent, total

    async def raw_stream(self, base_url: str, question: str) -> tuple[float, float]:
        sent = time.perf_counter()
        first, texts = None, []
        body = {"model": "default", "stream": True, "messages": [{"role": "user", "content": question}]}
        async with self.http.stream("POST", f"{base_url}/chat/completions", json=body,
                                    headers={"Authorization": f"Bearer {self.key}"}) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    content = chunk["choices"][0]["delta"].get("content") if chunk["choices"] else None
                    if content:
                        first = first or time.perf_counter()
                        texts.append(content)
        total = time.perf_counter() - sent
        self.check("".join(texts))
        return first - sent, total

    async def sse(self, question: str) -> tuple[float, float]:
        sent = time.perf_counter()
        first, texts = None, []
        async with self.http.stream("POST", f"http://{self.asgi}/stream/", json={"content": question},
                                    headers={"X-CSRFToken": self.cookies["csrftoken"]}) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    event = json.loads(line[6:])
                    if event["type"] == "delta":
                        first = first or time.perf_counter()
                        texts.append(event["text"])
        total = time.perf_counter() - sent
        self.check("".join(texts))
        return first - sent, total


async def measure(paths: list[str], clients: Paths, turns: int, warmup: int) -> dict[str, list[tuple[float, float]]]:
    results: dict[str, list[tuple[float, float]]] = {path: [] for path in paths}
    async with clients:
        for i in range(warmup + turns):
            # Rotated each round: no path always runs right after another one.
            for path in paths[i % len(paths):] + paths[:i % len(paths)]:
                timing = await clients.turn(path, f"{QUESTIONS[i % len(QUESTIONS)]}")
                if i >= warmup:
                    results[path].append(timing)
    return results


def rows(results: dict[str, list[tuple[float, float]]]) -> list[list]:
    base_ttft = percentile([t * 1000 for t, _ in results[BASELINE]], 50)
    base_total = percentile([t * 1000 for _, t in results[BASELINE]], 50)
    out = []
    for path, timings in results.items():
        ttft = [t * 1000 for t, _ in timings]
        total = [t * 1000 for _, t in timings]
        out.append([path, percentile(ttft, 50), percentile(ttft, 99), percentile(total, 50), percentile(total, 99),
                    f"{percentile(ttft, 50) - base_ttft:+.2f}", f"{percentile(total, 50) - base_total:+.2f}",
                    str(len(timings))])
    return out


def run(turns: int, warmup: int, tokens: int, paths: list[str]) -> list[list]:
    from bench.bench_streaming import __file__ as streaming_bench

    with tempfile.TemporaryDirectory(prefix="ragchat-bench-openai-") as tmpdir:
        model_port = free_port()
        env = {**os.environ, "RAGCHAT_BENCH_LLM": "openai",
               "RAGCHAT_BENCH_MODEL_URL": f"http://127.0.0.1:{model_port}/v1", "PYTHONPATH": str(ROOT)}
        os.environ.update({k: env[k] for k in ("RAGCHAT_BENCH_LLM", "RAGCHAT_BENCH_MODEL_URL")})
        with contextlib.ExitStack() as stack:
            stack.enter_context(process([sys.executable, streaming_bench, "--serve-model", str(model_port),
                                         "--tokens", str(tokens), "--arrivals", os.path.join(tmpdir, "arrivals")],
                                        env, model_port, "model server"))
            env.update(stack.enter_context(database(tmpdir)), DJANGO_SETTINGS_MODULE="bench.streaming_settings")
            asgi_port, wsgi_port = free_port(), free_port()
            asgi = stack.enter_context(process([
                sys.executable, "-m", "uvicorn", "example_project.asgi:application", "--host", "127.0.0.1",
                "--port", str(asgi_port), "--ws-per-message-deflate", "false", "--lifespan", "off",
                "--no-access-log", "--log-level", "warning"], env, asgi_port, "uvicorn"))
            wsgi = stack.enter_context(process([
                sys.executable, "-m", "gunicorn", "example_project.wsgi", "--bind", f"127.0.0.1:{wsgi_port}",
                "--workers", "1", "--worker-class", "gthread", "--threads", "4", "--log-level", "warning"],
                env, wsgi_port, "gunicorn"))
            from django_ragchat.models import ApiKey

            [caller] = make_callers(1)
            key = ApiKey.create_key(caller.user, "bench")[1]
            clients = Paths(asgi, wsgi, f"127.0.0.1:{model_port}", caller.cookies, key, reply_text(tokens))
            return rows(asyncio.run(measure(paths, clients, turns, warmup)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=200, help="measured turns per path")
    parser.add_argument("--warmup", type=int, default=10, help="turns per path before measuring")
    parser.add_argument("--tokens", type=int, default=100, help="tokens per answer")
    parser.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated, from: {', '.join(PATHS)}")
    parser.add_argument("--quick", action="store_true", help="10 turns per path, 20 tokens")
    args = parser.parse_args(argv)
    if args.quick:
        args.turns, args.warmup, args.tokens = 10, 2, 20
    paths = [p.strip() for p in args.paths.split(",")]
    if set(paths) - set(PATHS) or BASELINE not in paths:
        parser.error(f"choose paths from {', '.join(PATHS)}, {BASELINE} included")
    started = time.perf_counter()
    result = run(args.turns, args.warmup, args.tokens, paths)
    from django.db import connection

    print(f"The OpenAI-compatible endpoint beside the websocket: {args.tokens}-token answers from the loopback "
          f"model, one turn at a time, each in a new conversation; {args.turns} turns per path after "
          f"{args.warmup} warm-up; {connection.vendor}; {machine()}")
    print("Milliseconds. ttft: message sent -> first token received; total: -> the answer's end. "
          "vs websocket: p50 difference.")
    print(table(["path", "ttft p50", "ttft p99", "total p50", "total p99", "ttft p50 vs ws", "total p50 vs ws",
                 "turns"], result))
    print(f"load average {os.getloadavg()[0]:.2f}; took {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
