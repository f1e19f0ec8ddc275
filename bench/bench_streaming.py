"""Streaming under load: N clients against one ASGI worker, each answer 200 tokens.

    .venv/bin/python bench/bench_streaming.py                 # 10, 50 and 100 clients, 3 rounds
    .venv/bin/python bench/bench_streaming.py --stagger 5     # starts spread over 5 s
    .venv/bin/python bench/bench_streaming.py --quick         # 2 and 5 clients, 20 tokens
    .venv/bin/python bench/bench_streaming.py --llm extractive    # the offline answerer instead
    .venv/bin/python bench/bench_streaming.py --workers 2     # two uvicorn workers, Redis layer
    .venv/bin/python bench/bench_streaming.py --scaleout      # 1 (in-memory), 1, 2, 4 workers (Redis) at 100, 400
    .venv/bin/python bench/bench_streaming.py --token-delay 0.01   # a model writing 100 tokens a second
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/ragchat .venv/bin/python bench/bench_streaming.py

Processes: this one (the clients); a loopback OpenAI-compatible server (``FakeOpenAIServer``,
standard library, streaming each answer as 200 one-word tokens with no delay unless
``--token-delay``); one uvicorn
worker serving ``example_project.asgi`` (websocket and server-sent events; in-memory channel
layer; websocket compression off unless ``--ws-deflate``), or with ``--workers 2`` two uvicorn
processes on the Redis channel layer (127.0.0.1:6379, a key prefix of the run's own), the
clients split between them; one gunicorn worker (``gthread``, a
thread per client) serving ``example_project.wsgi`` for server-sent events under WSGI. All on
loopback, sharing one database (a SQLite file by default) holding the demo's sample documents.

Each round starts N turns, each in a fresh conversation of its own user, asking about the
sample documents: all at the same instant by default, or spread evenly over ``--stagger``
seconds. Every question carries a marker that the model server logs with the time it received
the request. For every client the benchmark measures

* ttft: from sending the message to receiving the first ``delta``;
* before model: from sending the message to the model server receiving the request
  (django-ragchat's work: receiving, saving the messages, retrieval, the prompt, and waiting
  for its turn in the worker);
* model -> client: the rest (the model's first token, relayed to the client);

(all processes read the same monotonic clock) and checks that the answer arrived whole: 200
deltas, indexes 0..199 in order, their text exactly the model's. The same requests are measured
along five paths:

* ``model``: the ``openai`` client streaming straight from the model server (no django-ragchat);
* ``pipeline``: ``stream_turn`` in this process, N concurrent tasks (the turn without transport);
* ``websocket``: through uvicorn and the chat consumer;
* ``sse asgi`` / ``sse wsgi``: the server-sent events endpoint under uvicorn / gunicorn;
* ``websocket before``, ``sse asgi before``, ``sse wsgi before``: the same from another checkout
  (``--baseline DIR``, e.g. a ``git archive`` of the commit before a change), its own servers.

Tokens/s is all deltas delivered over the round's wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._setup import machine, median, percentile, table

QUESTIONS = (
    "How much does the Aurora X2 cost?",
    "How long does the Zephyr Buds battery last?",
    "What does the Nimbus Tab warranty cover?",
)
PATHS = ("model", "bare relay", "pipeline", "websocket", "websocket before", "sse asgi", "sse asgi before",
         "sse wsgi", "sse wsgi before")
# The paths served by the baseline's checkout (``--baseline``), each beside the same path on this one.
BEFORE_PATHS = ("websocket before", "sse asgi before", "sse wsgi before")
DEFAULT_PATHS = ("model", "pipeline", "websocket", "sse asgi", "sse wsgi")
# Issue 27's table: 100 clients in the same instant, 50 at once, 100 arriving over 5 s.
ISSUE_27_LOADS = "100,50,100/5"
ISSUE_27_PATHS = ("model", "bare relay", "websocket")
TOKEN = re.compile(r"t(\d+)")


def reply_text(tokens: int) -> str:
    """The model's answer: ``tokens`` distinct words, so each delta can be checked."""
    return " ".join(f"t{i}" for i in range(tokens))


# --- the model server process -----------------------------------------------------------------


MARKER = re.compile(r"#q(\d+)")


def serve_model(port: int, tokens: int, arrivals: str, token_delay: float = 0.0) -> None:
    """The model server; writes ``<marker> <monotonic time>`` to ``arrivals`` for each request.
    ``token_delay``: seconds before each streamed token (0: as fast as the socket takes them)."""
    import socketserver

    from django_ragchat.testing.openai_server import FakeOpenAIServer

    # The standard library listens with a backlog of 5; 100 clients connect at once.
    socketserver.TCPServer.request_queue_size = 1024
    answer = reply_text(tokens)
    log = open(arrivals, "a", buffering=1)
    lock = threading.Lock()

    def reply(request: dict) -> str:
        # Called as the request is answered, just before its first token is written. The
        # marker is in the user's question, which the prompt carries.
        arrived = time.perf_counter()  # CLOCK_MONOTONIC: comparable across processes
        text = " ".join(str(m.get("content")) for m in request.get("messages") or [])
        found = MARKER.findall(text)
        if found:
            with lock:
                log.write(f"{found[-1]} {arrived}\n")
        return answer

    server = FakeOpenAIServer(port=port, default_reply=reply, token_delay=token_delay)
    server.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    server.stop()


# --- processes ---------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def process(argv: list[str], env: dict[str, str], port: int, name: str, cwd: Path = ROOT,
            pids: dict[str, int] | None = None):
    """Run ``argv`` until the context ends; ``pids[name]`` is its process id (for its RSS and CPU)."""
    log = tempfile.TemporaryFile()
    child = subprocess.Popen(argv, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
    if pids is not None:
        pids[name] = child.pid
    try:
        deadline = time.monotonic() + 30
        while True:
            if child.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"{name} exited:\n{log.read().decode(errors='replace')[-3000:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start")
            time.sleep(0.1)
        try:
            yield f"127.0.0.1:{port}"
        except BaseException:
            log.seek(0)
            print(f"--- {name} log (tail) ---\n{log.read().decode(errors='replace')[-4000:]}", file=sys.stderr)
            raise
    finally:
        child.terminate()
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        log.close()


# --- the database ------------------------------------------------------------------------------


@contextlib.contextmanager
def database(tmpdir: str):
    """Environment variables naming a fresh, migrated database with the sample documents."""
    import dj_database_url

    url = os.environ.get("DATABASE_URL")
    if url:
        config = dj_database_url.parse(url)
        # A name of this run's own: two runs on one server (two checkouts, the SQLite and the
        # PostgreSQL pass side by side) must not drop each other's database.
        name = f"test_{config['NAME']}_streaming_{os.getpid()}"
        env = {"RAGCHAT_BENCH_DB_ENGINE": config["ENGINE"], "RAGCHAT_BENCH_DB_NAME": name,
               "RAGCHAT_BENCH_DB_HOST": str(config.get("HOST") or ""),
               "RAGCHAT_BENCH_DB_PORT": str(config.get("PORT") or ""),
               "RAGCHAT_BENCH_DB_USER": str(config.get("USER") or ""),
               "RAGCHAT_BENCH_DB_PASSWORD": str(config.get("PASSWORD") or "")}
        _postgres(config, f'DROP DATABASE IF EXISTS "{name}"', f'CREATE DATABASE "{name}"')
    else:
        name = os.path.join(tmpdir, "bench.sqlite3")
        env = {"RAGCHAT_BENCH_DB_ENGINE": "django.db.backends.sqlite3", "RAGCHAT_BENCH_DB_NAME": name}
    os.environ.update(env)
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.streaming_settings"
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    from django_ragchat.ingestion.pipeline import ingest_paths

    ingest_paths([ROOT / "example_project" / "sample_docs"], root=ROOT)
    try:
        yield env
    finally:
        from django.db import connections

        connections.close_all()
        if url:
            _postgres(config, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _postgres(config: dict, *statements: str) -> None:
    import psycopg

    with psycopg.connect(host=config.get("HOST") or None, port=config.get("PORT") or None,
                         user=config.get("USER") or None, password=config.get("PASSWORD") or None,
                         dbname="postgres", autocommit=True) as connection:
        for statement in statements:
            connection.execute(statement)


@dataclass
class Caller:
    user: object
    cookies: dict


def make_callers(count: int) -> list[Caller]:
    from django.contrib.auth import get_user_model
    from django.test import Client

    callers = []
    for i in range(count):
        user = get_user_model().objects.create_user(f"bench{i}")
        client = Client()
        client.force_login(user)
        callers.append(Caller(user, {"sessionid": client.cookies["sessionid"].value,
                                     "csrftoken": secrets.token_hex(16)}))
    return callers


def fresh_conversations(callers: list[Caller]) -> list[str]:
    from django_ragchat.models import Conversation

    return [str(c.pk) for c in Conversation.objects.bulk_create(
        [Conversation(owner=caller.user) for caller in callers])]


# --- clients -----------------------------------------------------------------------------------

_sequence = iter(range(10**9))


@dataclass
class Answer:
    """One client's answer. Times are ``time.perf_counter()`` (CLOCK_MONOTONIC on Linux, shared
    by every process of the machine), so they compare with the model server's arrivals."""

    marker: str
    sent: float
    first: float  # the first token received
    tokens: int  # the model's tokens received (words of the text; a frame may carry several)
    frames: int  # delta frames received
    whole: bool  # every token, in order, exactly the model's text, delta indexes without a gap
    reordered: bool
    lost: int = 0  # the model's tokens missing from the text received
    duplicated: int = 0  # tokens received more than once
    text: str = ""  # what was streamed
    conversation_id: str | None = None
    saved_differs: bool = False  # the saved answer is not what was streamed
    at_model: float | None = None  # when the model server received the request

    @property
    def ttft(self) -> float:
        return self.first - self.sent


def question(i: int) -> tuple[str, str]:
    """A question about the sample documents, tagged with a unique marker the model server logs."""
    marker = str(next(_sequence))
    return marker, f"{QUESTIONS[i % len(QUESTIONS)]} #q{marker}"


def answer(marker: str, sent: float, first: float, texts: list[str], indexes: list[int] | None,
           expected: str | None, final: str | None, conversation_id: str | None = None) -> Answer:
    """One client's answer, its tokens counted: the model's answer is ``t0 t1 ... tN``, so the
    text received tells which were lost, duplicated or reordered, however the deltas split it."""
    joined = "".join(texts)
    whole = (expected is None or joined == expected) and (final is None or joined == final)
    if indexes is not None:
        whole = whole and indexes == list(range(len(texts)))
    got = [int(t) for t in TOKEN.findall(joined)] if expected is not None else joined.split()
    want = {int(t) for t in TOKEN.findall(expected)} if expected is not None else set()
    reordered = (indexes is not None and indexes != sorted(indexes)) or (
        expected is not None and any(a >= b for a, b in zip(got, got[1:])))
    return Answer(marker, sent, first, len(got), len(texts), whole, reordered,
                  lost=len(want - set(got)), duplicated=len(got) - len(set(got)), text=joined,
                  conversation_id=conversation_id)


async def staggered(start: asyncio.Event, i: int, count: int, stagger: float) -> None:
    """Wait for the round to start, then for this client's turn within ``stagger`` seconds."""
    await start.wait()
    if stagger:
        await asyncio.sleep(stagger * i / count)


async def model_round(base_url: str, count: int, expected: str | None, stagger: float):
    import openai
    from openai.types.chat import ChatCompletion

    client = openai.AsyncOpenAI(base_url=base_url, api_key="bench", max_retries=0)
    start = asyncio.Event()

    async def one(i: int) -> Answer:
        marker, text = question(i)
        await staggered(start, i, count, stagger)
        sent = time.perf_counter()
        first, texts = None, []
        # The chunks as decoded JSON, as the app's model client reads them
        # (django_ragchat.backends.openai): building typed ChatCompletionChunk models cost this
        # process about 0.3 ms of CPU a token, which at 20 answers a second of 200 tokens is more
        # than a core of this machine, and the model alone's first tokens queued behind it.
        stream = await client.post(
            "/chat/completions", cast_to=ChatCompletion, stream=True, stream_cls=openai.AsyncStream[object],
            body={"model": "gpt-4o-mini", "stream": True, "messages": [{"role": "user", "content": text}]})
        async for chunk in stream:
            content = ((chunk.get("choices") or [{}])[0].get("delta") or {}).get("content")
            if content:
                first = first or time.perf_counter()
                texts.append(content)
        return answer(marker, sent, first, texts, None, expected, None)

    try:
        return await run_round(start, [one(i) for i in range(count)])
    finally:
        await client.close()


async def pipeline_round(conversation_ids: list[str], expected: str | None, stagger: float):
    from asgiref.sync import sync_to_async

    from django_ragchat.events import Completed, Delta
    from django_ragchat.models import Conversation
    from django_ragchat.turn.pipeline import stream_turn

    conversations = await sync_to_async(lambda: list(Conversation.objects.filter(pk__in=conversation_ids)))()
    start = asyncio.Event()

    async def one(i: int, conversation) -> Answer:
        marker, text = question(i)
        await staggered(start, i, len(conversations), stagger)
        sent = time.perf_counter()
        first, texts, indexes, final = None, [], [], None
        async with contextlib.aclosing(stream_turn(conversation, text)) as events:
            async for event in events:
                if isinstance(event, Delta):
                    first = first or time.perf_counter()
                    texts.append(event.text)
                    indexes.append(event.index)
                elif isinstance(event, Completed):
                    final = event.message["content"]
        return answer(marker, sent, first, texts, indexes, expected, final, str(conversation.pk))

    return await run_round(start, [one(i, c) for i, c in enumerate(conversations)])


async def websocket_round(addresses: list[str], callers: list[Caller], conversation_ids: list[str],
                          expected: str | None, stagger: float):
    import websockets

    start = asyncio.Event()
    connected = asyncio.Semaphore(0)

    async def one(i: int, caller: Caller, conversation_id: str) -> Answer:
        marker, text = question(i)
        address = addresses[i % len(addresses)]
        cookie = "; ".join(f"{k}={v}" for k, v in caller.cookies.items())
        async with websockets.connect(f"ws://{address}/ws/ragchat/", origin=f"http://{address}",
                                      additional_headers={"Cookie": cookie}, max_size=None,
                                      open_timeout=60) as ws:
            assert json.loads(await ws.recv())["type"] == "ready"
            connected.release()
            await staggered(start, i, len(callers), stagger)
            sent = time.perf_counter()
            await ws.send(json.dumps({"type": "message", "content": text, "conversation_id": conversation_id}))
            first, texts, indexes = None, [], []
            while True:
                frame = json.loads(await ws.recv())
                if frame["type"] == "delta":
                    first = first or time.perf_counter()
                    texts.append(frame["text"])
                    indexes.append(frame["index"])
                elif frame["type"] == "done":
                    return answer(marker, sent, first, texts, indexes, expected, frame["message"]["content"],
                                  conversation_id)
                elif frame["type"] == "error":
                    raise RuntimeError(f"websocket turn failed: {frame}")

    async def all_connected():
        for _ in callers:
            await connected.acquire()

    return await run_round(start, [one(i, c, k) for i, (c, k) in enumerate(zip(callers, conversation_ids))],
                           ready=all_connected())


async def sse_round(addresses: list[str], callers: list[Caller], conversation_ids: list[str],
                    expected: str | None, stagger: float):
    import httpx

    start = asyncio.Event()

    async def one(i: int, caller: Caller, conversation_id: str, client) -> Answer:
        marker, text = question(i)
        address = addresses[i % len(addresses)]
        await staggered(start, i, len(callers), stagger)
        sent = time.perf_counter()
        first, texts, indexes, final = None, [], [], None
        async with client.stream("POST", f"http://{address}/conversations/{conversation_id}/stream/",
                                 json={"content": text}, cookies=caller.cookies,
                                 headers={"X-CSRFToken": caller.cookies["csrftoken"]}) as response:
            if response.status_code != 200:
                raise RuntimeError(f"server-sent events refused: {response.status_code} {await response.aread()}")
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                event = json.loads(line[6:])
                if event["type"] == "delta":
                    first = first or time.perf_counter()
                    texts.append(event["text"])
                    indexes.append(event["index"])
                elif event["type"] == "done":
                    final = event["message"]["content"]
                elif event["type"] == "error":
                    raise RuntimeError(f"server-sent events turn failed: {event}")
        return answer(marker, sent, first, texts, indexes, expected, final, conversation_id)

    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=len(callers) + 5), timeout=120) as client:
        return await run_round(start, [one(i, c, k, client) for i, (c, k) in enumerate(zip(callers, conversation_ids))])


async def run_round(start: asyncio.Event, clients, ready=None) -> tuple[list[Answer], float]:
    """Run the clients, start them together, and return their answers and the wall time."""
    tasks = [asyncio.ensure_future(c) for c in clients]
    if ready is not None:
        await ready
    await asyncio.sleep(0.05)
    began = time.perf_counter()
    start.set()
    answers = await asyncio.gather(*tasks)
    return answers, time.perf_counter() - began


# --- the benchmark -----------------------------------------------------------------------------


def read_arrivals(path: str) -> dict[str, float]:
    arrivals = {}
    with open(path) as lines:
        for line in lines:
            marker, at = line.split()
            arrivals[marker] = float(at)
    return arrivals


def result_row(load: str, path: str, answers: list[Answer], rates: list[float], frame_rates: list[float],
               arrivals: dict[str, float]) -> list:
    """One row of the table: TTFT, the model's and the app's share of it, throughput, losses."""
    ttft = [a.ttft * 1000 for a in answers]
    timed = [a for a in answers if a.marker in arrivals]
    before = [(arrivals[a.marker] - a.sent) * 1000 for a in timed]
    after = [(a.first - arrivals[a.marker]) * 1000 for a in timed]
    return [
        load, path, percentile(ttft, 50), percentile(ttft, 99),
        *((percentile(before, 50), percentile(before, 99), percentile(after, 50),
           percentile(after, 99)) if timed else ("", "", "", "")),
        f"{median(rates):,.0f}", f"{median(frame_rates):,.0f}", f"{sum(a.tokens for a in answers):,}",
        f"{sum(a.lost for a in answers)}/{sum(a.duplicated for a in answers)}/{sum(a.reordered for a in answers)}",
        str(sum(a.saved_differs for a in answers)),
        f"{sum(not a.whole for a in answers)}/{sum(a.reordered for a in answers)}",
    ]


def parse_loads(text: str) -> list[tuple[int, float]]:
    """``"100,50,100/5"``: 100 clients at once, 50 at once, 100 spread over 5 s."""
    loads = []
    for item in text.split(","):
        clients, _, stagger = item.strip().partition("/")
        loads.append((int(clients), float(stagger or 0)))
    return loads


def load_name(clients: int, stagger: float) -> str:
    return f"{clients}/{stagger:g}s" if stagger else str(clients)


def check_saved(answers: list[Answer]) -> None:
    """Mark the answers whose saved assistant message is not exactly what was streamed."""
    from django_ragchat.models import Message

    saved = {str(c): content for c, content in Message.objects.filter(
        conversation_id__in=[a.conversation_id for a in answers], role=Message.Role.ASSISTANT,
    ).values_list("conversation_id", "content")}
    for a in answers:
        a.saved_differs = saved.get(a.conversation_id) != a.text


def _first_on_path(tree: str) -> str:
    """``PYTHONPATH`` with ``tree`` first: its code, the packages the caller added after it."""
    return os.pathsep.join(filter(None, (tree, os.environ.get("PYTHONPATH"))))


def start_servers(stack: contextlib.ExitStack, env: dict, paths: list[str], clients: int, ws_deflate: bool,
                  workers: int, baseline: str | None, redis: bool | None = None,
                  pids: dict[str, int] | None = None, baseline_env: dict | None = None) -> dict[str, list[str]]:
    """The server processes the paths need: their addresses by path (and their ids in ``pids``).
    ``redis``: the Redis channel layer (by default with more than one worker); ``baseline_env``:
    extra environment of the baseline's server (the same code with a setting changed)."""
    def uvicorn(app: str, name: str, cwd: Path = ROOT, extra_env: dict | None = None) -> str:
        port = free_port()
        return stack.enter_context(process([
            sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port),
            "--ws-per-message-deflate", str(ws_deflate).lower(), "--lifespan", "off", "--no-access-log",
            "--log-level", "warning",
        ], {**env, **(extra_env or {})}, port, name, cwd=cwd, pids=pids))

    servers: dict[str, list[str]] = {}
    env.pop("RAGCHAT_BENCH_REDIS_PREFIX", None)
    if workers > 1 if redis is None else redis:  # the workers' sockets meet through Redis, under a prefix
        env["RAGCHAT_BENCH_REDIS_PREFIX"] = f"ragchat-bench-{secrets.token_hex(4)}"
    if {"websocket", "sse asgi"} & set(paths):
        servers["asgi"] = [uvicorn("example_project.asgi:application", f"uvicorn {w}") for w in range(workers)]
    if {"websocket before", "sse asgi before"} & set(paths):  # the same app from another checkout
        servers["asgi before"] = [uvicorn("example_project.asgi:application", "baseline uvicorn", Path(baseline),
                                          {"PYTHONPATH": _first_on_path(baseline), **(baseline_env or {})})]
    if "bare relay" in paths:
        servers["bare"] = [uvicorn("bench.bare_relay:application", "bare relay")]
    def gunicorn(name: str, cwd: Path = ROOT, extra_env: dict | None = None) -> str:
        port = free_port()
        return stack.enter_context(process([
            sys.executable, "-m", "gunicorn", "example_project.wsgi", "--bind", f"127.0.0.1:{port}",
            "--workers", "1", "--worker-class", "gthread", "--threads", str(clients + 4),
            "--log-level", "warning",
        ], {**env, **(extra_env or {})}, port, name, cwd=cwd, pids=pids))

    if "sse wsgi" in paths:
        servers["wsgi"] = [gunicorn("gunicorn")]
    if "sse wsgi before" in paths:
        servers["wsgi before"] = [gunicorn("baseline gunicorn", Path(baseline),
                                           {"PYTHONPATH": _first_on_path(baseline), **(baseline_env or {})})]
    return servers


def measure_round(path: str, n: int, stagger: float, env: dict, servers: dict, callers: list[Caller],
                  expected: str | None) -> tuple[list[Answer], float]:
    """One round of ``n`` clients on ``path``; the answers saved by the app are checked."""
    group = callers[:n]
    if path == "model":
        return asyncio.run(model_round(env["RAGCHAT_BENCH_MODEL_URL"], n, expected, stagger))
    conversation_ids = fresh_conversations(group)
    if path == "bare relay":
        return asyncio.run(websocket_round(servers["bare"], group, conversation_ids, expected, stagger))
    if path == "pipeline":
        answers, elapsed = asyncio.run(pipeline_round(conversation_ids, expected, stagger))
    elif path in ("websocket", "websocket before"):
        addresses = servers["asgi" if path == "websocket" else "asgi before"]
        answers, elapsed = asyncio.run(websocket_round(addresses, group, conversation_ids, expected, stagger))
    else:
        addresses = servers[{"sse asgi": "asgi", "sse asgi before": "asgi before", "sse wsgi": "wsgi",
                             "sse wsgi before": "wsgi before"}[path]]
        answers, elapsed = asyncio.run(sse_round(addresses, group, conversation_ids, expected, stagger))
    check_saved(answers)
    return answers, elapsed


@dataclass
class Bench:
    """What every configuration of a run shares: the model server, the database, the users."""

    env: dict
    callers: list[Caller]
    arrivals_log: str
    expected: str | None
    pids: dict[str, int]


@contextlib.contextmanager
def bench(tokens: int, llm: str, most: int, token_delay: float = 0.0):
    """The model server process (``token_delay`` seconds before each token) and a fresh database
    with ``most`` users logged in."""
    with tempfile.TemporaryDirectory(prefix="ragchat-bench-stream-") as tmpdir:
        arrivals_log = os.path.join(tmpdir, "arrivals.log")
        model_port = free_port()
        env = {**os.environ, "RAGCHAT_BENCH_LLM": llm, "RAGCHAT_BENCH_TOKENS": str(tokens),
               "RAGCHAT_BENCH_MODEL_URL": f"http://127.0.0.1:{model_port}/v1",
               "PYTHONPATH": _first_on_path(str(ROOT))}
        os.environ.update({k: env[k] for k in ("RAGCHAT_BENCH_LLM", "RAGCHAT_BENCH_MODEL_URL")})
        pids: dict[str, int] = {}
        with contextlib.ExitStack() as stack:
            stack.enter_context(process([sys.executable, __file__, "--serve-model", str(model_port),
                                         "--tokens", str(tokens), "--arrivals", arrivals_log,
                                         "--token-delay", str(token_delay)],
                                        env, model_port, "model server", pids=pids))
            db_env = stack.enter_context(database(tmpdir))
            env.update(db_env, DJANGO_SETTINGS_MODULE="bench.streaming_settings")
            yield Bench(env, make_callers(most), arrivals_log, reply_text(tokens) if llm == "openai" else None, pids)


# The server processes (``start_servers``' names, by prefix) whose CPU time a path's answers cost.
PATH_PROCESSES = {"websocket": "uvicorn ", "sse asgi": "uvicorn ", "websocket before": "baseline uvicorn",
                  "sse asgi before": "baseline uvicorn", "bare relay": "bare relay", "sse wsgi": "gunicorn",
                  "sse wsgi before": "baseline gunicorn"}


def path_cpu(path: str, pids: dict[str, int]) -> float:
    """CPU seconds used so far by the server processes of ``path`` and their children (gunicorn's
    worker is its master's child), 0 for the in-process paths."""
    prefix = PATH_PROCESSES.get(path)
    return sum(cpu_seconds(each) for name, pid in pids.items() if prefix and name.startswith(prefix)
               for each in process_tree(pid))


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants alive now (``/proc/<pid>/task/<tid>/children``)."""
    found, todo = [], [pid]
    while todo:
        each = todo.pop()
        found.append(each)
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{each}/task").iterdir():
                todo += [int(child) for child in (task / "children").read_text().split()]
    return found


def measure_load(b: Bench, servers: dict, paths: list[str], n: int, stagger: float, rounds: int) -> dict:
    """``rounds`` rounds of ``n`` clients on every path, interleaved (so that load from elsewhere
    spreads evenly): by path, the answers, tokens/s and frames/s of each round, and the CPU
    seconds its server processes used over the rounds (handshakes, turns and streams)."""
    results = {path: ([], [], [], [0.0]) for path in paths}
    for _ in range(rounds):
        for path in paths:
            cpu = path_cpu(path, b.pids)
            answers, elapsed = measure_round(path, n, stagger, b.env, servers, b.callers, b.expected)
            results[path][3][0] += path_cpu(path, b.pids) - cpu
            results[path][0].extend(answers)
            results[path][1].append(sum(a.tokens for a in answers) / elapsed)
            results[path][2].append(sum(a.frames for a in answers) / elapsed)
    return results


def run(loads: list[tuple[int, float]], rounds: int, tokens: int, llm: str, paths: list[str],
        ws_deflate: bool = False, workers: int = 1, baseline: str | None = None,
        cpu_rows: list | None = None, baseline_env: dict | None = None, token_delay: float = 0.0) -> list[list]:
    """The table's rows; with ``cpu_rows``, (path, load, CPU seconds, answers) of every server path."""
    if llm != "openai":
        paths = [p for p in paths if p not in ("model", "bare relay")]
    most = max(n for n, _ in loads)
    with bench(tokens, llm, most, token_delay) as b, contextlib.ExitStack() as stack:
        servers = start_servers(stack, b.env, paths, most, ws_deflate, workers, baseline, pids=b.pids,
                                baseline_env=baseline_env)
        for path in paths:  # warm-up: connections, vector index, clients
            measure_round(path, min(5, most), 0.0, b.env, servers, b.callers, b.expected)
        rows = []
        for n, stagger in loads:
            results = measure_load(b, servers, paths, n, stagger, rounds)
            arrivals = read_arrivals(b.arrivals_log) if llm == "openai" else {}
            rows += [result_row(load_name(n, stagger), path, *results[path][:3], arrivals) for path in paths]
            if cpu_rows is not None:
                cpu_rows += [(path, load_name(n, stagger), results[path][3][0], len(results[path][0]))
                             for path in paths if path in PATH_PROCESSES]
    return rows


# --- scale-out: 1, 2, 4 workers -------------------------------------------------------------------

SCALEOUT = "1m,1,2,4"  # "1m": one worker on the in-memory layer (the single-process deployment)
SCALEOUT_LOADS = "100,400"


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (all its threads) so far, from ``/proc``."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def redis_pids() -> list[int]:
    """The Redis server's process, if it runs on this machine (its CPU time is counted too)."""
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and (entry / "comm").read_text().strip() == "redis-server":
                found.append(int(entry.name))
    return found


def database_pids() -> list[int]:
    """The PostgreSQL server processes serving this run's database (none on SQLite: its work is
    done in the workers)."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return []
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                       "AND pid <> pg_backend_pid()")
        return [pid for (pid,) in cursor.fetchall()]


def cpu_snapshot(groups: dict[str, list[int] | Callable[[], list[int]]]) -> dict[str, dict[int, float]]:
    """CPU seconds so far of each process of each group (a group may be a function listing them
    now: the database's server processes come and go)."""
    seconds: dict[str, dict[int, float]] = {}
    for name, pids in groups.items():
        seconds[name] = {}
        for pid in pids() if callable(pids) else pids:
            with contextlib.suppress(OSError):
                seconds[name][pid] = cpu_seconds(pid)
    return seconds


def cpu_spent(before: dict[str, dict[int, float]], after: dict[str, dict[int, float]]) -> dict[str, float]:
    """CPU seconds of each group between two snapshots (a process started since counts in full)."""
    return {name: sum(t - before[name].get(pid, 0.0) for pid, t in pids.items()) for name, pids in after.items()}


def parse_scaleout(text: str) -> list[tuple[int, bool]]:
    """``"0,1m,1,2,4"`` -> (workers, on the Redis layer): ``1m`` is one worker on the in-memory layer,
    ``0`` the model alone (the ``openai`` client straight to the model server, for reference)."""
    return [(int(item.strip().rstrip("m")), not item.strip().endswith("m")) for item in text.split(",")]


def scaleout(configs: list[tuple[int, bool]], loads: list[tuple[int, float]], rounds: int,
             tokens: int) -> list[dict]:
    """The websocket path under each configuration of workers (or the model alone), one after the
    other, on one database and one model server; per load, the CPU time of each process group."""
    most = max(n for n, _ in loads)
    cells = []
    with bench(tokens, "openai", most) as b:
        for workers, redis in configs:
            pids: dict[str, int] = {}
            with contextlib.ExitStack() as stack:
                path = "websocket" if workers else "model"
                servers = start_servers(stack, b.env, [path], most, False, workers, None, redis, pids)
                groups = {"clients": [os.getpid()], "model": [b.pids["model server"]],
                          "workers": list(pids.values()), "redis": redis_pids(), "database": database_pids}
                measure_round(path, min(5, most), 0.0, b.env, servers, b.callers, b.expected)
                for n, stagger in loads:
                    cells.append(scaleout_cell(b, servers, path, n, stagger, rounds, groups))
                    cells[-1].update(workers=workers, redis=redis)
    return cells


def scaleout_cell(b: Bench, servers: dict, path: str, n: int, stagger: float, rounds: int,
                  groups: dict) -> dict:
    cpu, began = cpu_snapshot(groups), time.perf_counter()
    results = measure_load(b, servers, [path], n, stagger, rounds)
    wall, spent = time.perf_counter() - began, cpu_spent(cpu, cpu_snapshot(groups))
    return {"load": load_name(n, stagger), "row": result_row(load_name(n, stagger), path, *results[path][:3],
                                                             read_arrivals(b.arrivals_log)),
            "rate": median(results[path][1]), "cores": {k: t / wall for k, t in spent.items()},
            "per answer": {k: t * 1000 / len(results[path][0]) for k, t in spent.items()}}


def scaleout_rows(cells: list[dict]) -> list[list]:
    """One row per configuration and load; the ratios are to one worker on the Redis layer at the
    same load (per worker: the ratio / workers, the per-core efficiency while workers <= cores)."""
    one = {c["load"]: c["rate"] for c in cells if c["workers"] == 1 and c["redis"]}
    rows = []
    for c in cells:
        row, base, cores = c["row"], one.get(c["load"]), c["cores"]
        name = f"{c['workers']} ({'redis' if c['redis'] else 'memory'})" if c["workers"] else "model alone"
        rows.append([
            name, c["load"], row[2], row[3], row[4], row[6],
            row[8], row[9], f"{c['rate'] / base:.2f}x" if base and c["workers"] else "",
            f"{c['rate'] / base / c['workers']:.2f}" if base and c["workers"] else "", row[11], row[12], row[13],
            " / ".join(f"{cores[k]:.2f}" for k in ("clients", "model", "workers", "redis", "database")),
            f"{sum(cores.values()):.2f}",
            f"{c['per answer']['workers']:.1f} / {sum(c['per answer'].values()):.1f}",
        ])
    return rows


def scaleout_goal(cells: list[dict]) -> list[str]:
    """Issue 27: 2 workers on Redis at least 1.7x one worker's deltas/s at 100 clients."""
    rate = {(c["workers"], c["redis"], c["load"]): c["rate"] for c in cells}
    lines = []
    for base_redis in (True, False):
        two, one = rate.get((2, True, "100")), rate.get((1, base_redis, "100"))
        if two and one:
            lines.append(f"2 workers (redis) / 1 worker ({'redis' if base_redis else 'memory'}) at 100 clients: "
                         f"{two / one:.2f}x deltas/s (goal >= 1.7x): {'met' if two / one >= 1.7 else 'missed'}")
    return lines


def print_scaleout(cells: list[dict], args) -> None:
    from django.db import connection

    print(f"Scale-out: the websocket path, {args.tokens}-token answers, {args.rounds} round(s) per cell, N clients "
          f"at once split round-robin over the uvicorn workers; {connection.vendor}; {machine()}")
    print("workers: uvicorn processes (channel layer). Milliseconds, p50/p99 over every client of every round. "
          "deltas/s: the model's deltas (tokens) received per second of the round, median of the rounds; frames/s: "
          "websocket delta frames (coalesced). x 1: deltas/s / one worker's on Redis at the same load; per worker: "
          "that / workers (per-core efficiency up to 2 workers on 2 cores). lost/dup/reord: tokens; saved!=: saved "
          "answers not the text streamed; incomplete/reordered: answers. CPU cores busy over the rounds (CPU "
          "seconds / wall seconds) of the client process / the model server / the workers / redis-server "
          "(shared with the machine) / PostgreSQL's processes serving this run's database, and their sum (2 = both cores). CPU ms per answer: the workers' CPU time over "
          "the rounds / answers, and every process's.")
    print(table(["workers", "clients", "ttft p50", "ttft p99", "before model p50", "model->client p50",
                 "deltas/s", "frames/s", "x 1", "per worker", "lost/dup/reord", "saved!=", "incomplete/reordered",
                 "cores: clients / model / workers / redis / db", "cores total", "CPU ms/answer: workers / all"],
                scaleout_rows(cells)))
    for line in scaleout_goal(cells):
        print(line)


def goals(rows: list[list]) -> list[str]:
    """Issue 27's goals for one worker, from the rows of this run (``--issue27``)."""
    cell = {(row[0], row[1]): row for row in rows}
    lines = []
    for app in ("websocket", "websocket before", "sse asgi", "sse asgi before", "sse wsgi", "sse wsgi before"):
        burst, model, bare = cell.get(("100", app)), cell.get(("100", "model")), cell.get(("100", "bare relay"))
        spread, model_spread = cell.get(("100/5s", app)), cell.get(("100/5s", "model"))
        if burst and model:
            over = (burst[2] - model[2]) / 1000
            lines.append(f"{app}: 100 at once, ttft p50 {over:+.2f} s over the model alone (goal <= 0.4 s): "
                         f"{'met' if over <= 0.4 else 'missed'}")
        if burst and bare:
            share = float(burst[8].replace(",", "")) / float(bare[8].replace(",", ""))
            lines.append(f"{app}: 100 at once, tokens/s 1/{1 / share:.1f} of the bare relay's (goal >= 1/4): "
                         f"{'met' if share >= 0.25 else 'missed'}")
        if spread and model_spread:
            over = spread[2] - model_spread[2]
            lines.append(f"{app}: 100 over 5 s, ttft p50 {over:+.1f} ms over the model alone (goal <= 10 ms): "
                         f"{'met' if over <= 10 else 'missed'}")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="10,50,100", help="concurrent clients, comma-separated")
    parser.add_argument("--loads", help='loads, comma-separated: "N" (N clients at once) or "N/S" (N clients '
                        'spread over S seconds); replaces --clients and --stagger')
    parser.add_argument("--issue27", action="store_true",
                        help=f"issue 27's table: --loads {ISSUE_27_LOADS} --paths {','.join(ISSUE_27_PATHS)} "
                             "(and 'websocket before' with --baseline), and its goals")
    parser.add_argument("--baseline", metavar="DIR",
                        help="another checkout of the project (e.g. a git archive of the commit before a "
                             "change): the paths 'websocket before', 'sse asgi before' and 'sse wsgi before' serve its "
                             "code, in the same run")
    parser.add_argument("--baseline-env", action="append", default=[], metavar="KEY=VALUE",
                        help="extra environment of the baseline's server, e.g. --baseline . --baseline-env "
                             "RAGCHAT_BENCH_STARTING_TURNS=0: the same code with a setting changed (repeatable)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per number of clients and path")
    parser.add_argument("--tokens", type=int, default=200, help="tokens per answer")
    parser.add_argument("--llm", choices=["openai", "extractive"], default="openai",
                        help="openai: the loopback model server (default); extractive: the offline answerer")
    parser.add_argument("--quick", action="store_true", help="2 and 5 clients, 20 tokens, 1 round")
    parser.add_argument("--ws-deflate", action="store_true",
                        help="let uvicorn compress websocket frames (permessage-deflate; off by default, "
                             "as docs/deployment.md recommends)")
    parser.add_argument("--workers", type=int, default=1,
                        help="uvicorn worker processes; more than one use the Redis channel layer")
    parser.add_argument("--scaleout", nargs="?", const=SCALEOUT, metavar="WORKERS",
                        help=f"the scale-out table: the websocket path under each number of workers, one after "
                             f"the other (default {SCALEOUT}; '1m': one worker on the in-memory layer, others on "
                             f"Redis; '0': the model alone), at --loads (default {SCALEOUT_LOADS}), with the CPU time of each process")
    parser.add_argument("--paths", help=f"comma-separated, from: {', '.join(PATHS)} "
                        f"(default: {', '.join(DEFAULT_PATHS)})")
    parser.add_argument("--stagger", type=float, default=0.0,
                        help="spread each round's starts evenly over this many seconds (default: all at once)")
    parser.add_argument("--serve-model", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--arrivals", help=argparse.SUPPRESS)
    parser.add_argument("--token-delay", type=float, default=0.0, metavar="SECONDS",
                        help="the model server's pause before each token (default 0: as fast as the socket "
                             "takes them; 0.01: a model writing 100 tokens a second)")
    args = parser.parse_args(argv)
    if args.serve_model:
        return serve_model(args.serve_model, args.tokens, args.arrivals, args.token_delay)
    if args.quick:
        args.clients, args.rounds, args.tokens = "2,5", 1, 20
    if args.scaleout:
        started = time.perf_counter()
        loads = parse_loads(args.loads or ("2,5" if args.quick else SCALEOUT_LOADS))
        print_scaleout(scaleout(parse_scaleout(args.scaleout), loads, args.rounds, args.tokens), args)
        return print(f"load average {os.getloadavg()[0]:.2f}; took {time.perf_counter() - started:.0f} s")
    paths = list(ISSUE_27_PATHS if args.issue27 else DEFAULT_PATHS)
    if args.issue27 and args.baseline:
        paths.append("websocket before")
    if args.paths:
        paths = [p.strip() for p in args.paths.split(",")]
    unknown = set(paths) - set(PATHS)
    if unknown:
        parser.error(f"unknown paths {sorted(unknown)}; choose from {', '.join(PATHS)}")
    if set(BEFORE_PATHS) & set(paths) and not args.baseline:
        parser.error(f"the paths {', '.join(repr(p) for p in BEFORE_PATHS)} need --baseline DIR")
    if any("=" not in item for item in args.baseline_env):
        parser.error("--baseline-env takes KEY=VALUE")
    baseline_env = dict(item.split("=", 1) for item in args.baseline_env)
    loads = parse_loads(args.loads or (ISSUE_27_LOADS if args.issue27 and not args.quick else
                                       ",".join(f"{n}/{args.stagger:g}" for n in args.clients.split(","))))
    started = time.perf_counter()
    cpu_rows: list = []
    rows = run(loads, args.rounds, args.tokens, args.llm, paths, args.ws_deflate, args.workers, args.baseline,
               cpu_rows, baseline_env, args.token_delay)
    from django.db import connection

    deflate = "on" if args.ws_deflate else "off"
    asgi_workers = ("one uvicorn worker (in-memory layer)" if args.workers == 1
                    else f"{args.workers} uvicorn workers (Redis layer)")
    pace = f", a token every {args.token_delay * 1000:g} ms" if args.token_delay else ""
    print(f"Streaming: {args.tokens}-token answers ({args.llm}{pace}), {args.rounds} round(s) per cell; {asgi_workers} "
          f"(websocket compression {deflate}), one gunicorn gthread worker, {connection.vendor}; {machine()}")
    from bench import streaming_settings

    print(f"The app's model client over {streaming_settings._http_client} (RAGCHAT_BENCH_HTTP_CLIENT; "
          "the baseline's as its own settings say).")
    if set(BEFORE_PATHS) & set(paths):
        extra = "".join(f" {key}={value}" for key, value in baseline_env.items())
        print(f"{', '.join(p for p in paths if p in BEFORE_PATHS)}: the app from {args.baseline}{' with' + extra if extra else ''}")
    print("load: N clients at once, or N/Ss spread over S seconds. Milliseconds, p50 and p99 over every client "
          "of every round. ttft: message sent -> first token received. before model: message sent -> the model "
          "server receives the request (django-ragchat's work: receive, save, retrieve, prompt; and waiting for "
          "its turn). model -> client: the rest (the model's first token, relayed). tokens/s: the model's tokens "
          "received per second of the round; frames/s: delta frames (one may carry several tokens). "
          "lost/dup/reord: tokens lost, duplicated, out of order; saved!=: saved answers that are not the text "
          "streamed; incomplete/reordered: answers not exactly the model's text or with a gap in the delta "
          "indexes / answers reordered.")
    print(table(["load", "path", "ttft p50", "ttft p99", "before model p50", "before model p99",
                 "model->client p50", "model->client p99", "tokens/s", "frames/s", "tokens", "lost/dup/reord",
                 "saved!=", "incomplete/reordered"], rows))
    if cpu_rows:
        print("Server CPU time (/proc/<pid>/stat, user + system, every thread of the path's server processes) "
              "over the rounds of each cell, per answer: the websocket handshake, the turn and its stream.")
        print(table(["path", "load", "CPU s", "answers", "CPU ms per answer"],
                    [[path, load, f"{cpu:.2f}", str(count), f"{cpu / count * 1000:.1f}"]
                     for path, load, cpu, count in cpu_rows]))
    for line in goals(rows):
        print(line)
    print(f"load average {os.getloadavg()[0]:.2f}; took {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
