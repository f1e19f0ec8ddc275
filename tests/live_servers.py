"""Real server processes for the streaming tests, and the clients that talk to them.

Each server is started once per test session (a pytest plugin, loaded by ``conftest.py``) on
a free loopback port, with ``tests.live_settings``: the same test database as the pytest
process, a Redis cache shared with it, and the loopback OpenAI-compatible server of the session
for the ``fake`` profile. Tests use the function-scoped fixtures, which also give them a
committed database (``transactional_db``, so the servers see what the test wrote) and fresh
per-user limit counters:

* ``asgi`` - uvicorn, in-memory channel layer (websocket and server-sent events);
* ``wsgi`` - gunicorn with threads (server-sent events through ``ThreadedStream``);
* ``redis_workers`` - two ASGI processes, daphne and uvicorn, sharing the Redis channel layer;
* ``quick_wsgi``, ``quick_asgi`` - gunicorn and uvicorn beating every half second
  (``STREAM_HEARTBEAT_SECONDS``): a stream's keep-alive tells them within a second or two that
  its client left.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis
from websockets.sync.client import connect as ws_connect

ROOT = Path(__file__).resolve().parent.parent
REDIS_URL = os.environ.get("RAGCHAT_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """A server started as a child process, answering on 127.0.0.1:``port``."""

    # Where the servers' logs go: pytest's temporary directory of the session (set by the
    # ``server_logs`` fixture), never loose files in the system's temp folder.
    log_dir: Path = ROOT / "var" / "test-logs"

    def __init__(self, name: str, argv: list[str], env: dict[str, str], port: int):
        self.name, self.argv, self.env, self.port = name, argv, env, port
        self.log = self.log_dir / f"ragchat-{name}-{os.getpid()}-{port}.log"
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> ServerProcess:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(self.argv, env=self.env, cwd=ROOT, stdout=log,
                                            stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{self.name} did not answer on port {self.port} within {timeout} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def uvicorn(name: str, env: dict[str, str]) -> ServerProcess:
    port = free_port()
    return ServerProcess(name, [
        sys.executable, "-m", "uvicorn", "tests.asgi:application", "--host", "127.0.0.1",
        "--port", str(port), "--lifespan", "off", "--no-access-log", "--log-level", "warning",
    ], env, port)


def daphne(name: str, env: dict[str, str]) -> ServerProcess:
    port = free_port()
    return ServerProcess(name, [
        sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "-v", "0",
        "tests.asgi:application",
    ], env, port)


def gunicorn(name: str, env: dict[str, str], threads: int = 16) -> ServerProcess:
    port = free_port()
    return ServerProcess(name, [
        sys.executable, "-m", "gunicorn", "tests.wsgi:application",
        "--bind", f"127.0.0.1:{port}", "--workers", "1", "--worker-class", "gthread",
        "--threads", str(threads), "--graceful-timeout", "2", "--log-level", "warning",
    ], env, port)


def child_pids(pid: int) -> list[int]:
    """The processes ``pid`` started (gunicorn's master: its workers)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            if int(stat.read_text().rpartition(")")[2].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


# --- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="session", autouse=True)
def server_logs(tmp_path_factory) -> Path:
    """The directory of the server processes' logs, in pytest's temporary directory."""
    ServerProcess.log_dir = tmp_path_factory.mktemp("server-logs")
    return ServerProcess.log_dir


@pytest.fixture(scope="session")
def live_prefix() -> str:
    """The Redis key prefix of this session's servers (cache and channel layer)."""
    return f"ragchat-test-{os.getpid()}-{secrets.token_hex(4)}"


@pytest.fixture(scope="session")
def live_env(django_db_setup, openai_server_session, live_prefix, tmp_path_factory) -> dict[str, str]:
    """The environment of the server processes (after the test database exists)."""
    return {
        **os.environ,
        "TMPDIR": str(tmp_path_factory.mktemp("server-tmp")),  # gunicorn's worker files, not in /tmp
        "DJANGO_SETTINGS_MODULE": "tests.live_settings",
        "PYTHONPATH": str(ROOT),
        "RAGCHAT_LIVE_PREFIX": live_prefix,
        "RAGCHAT_LIVE_REDIS_URL": REDIS_URL,
        "RAGCHAT_FAKE_OPENAI_URL": openai_server_session.base_url,
    }


@contextlib.contextmanager
def running(*servers: ServerProcess):
    started = []
    try:
        for server in servers:
            started.append(server.start())
        yield servers
    finally:
        for server in started:
            server.stop()


@pytest.fixture(scope="session")
def asgi_server(live_env):
    with running(uvicorn("uvicorn", live_env)) as (server,):
        yield server


@pytest.fixture(scope="session")
def wsgi_server(live_env):
    with running(gunicorn("gunicorn", live_env)) as (server,):
        yield server


#: The heartbeat of the ``quick_*`` servers, in seconds.
QUICK_HEARTBEAT = 0.5


@pytest.fixture(scope="session")
def quick_wsgi_server(live_env):
    env = {**live_env, "RAGCHAT_LIVE_HEARTBEAT_SECONDS": str(QUICK_HEARTBEAT)}
    with running(gunicorn("gunicorn-quick", env)) as (server,):
        yield server


@pytest.fixture(scope="session")
def quick_asgi_server(live_env):
    env = {**live_env, "RAGCHAT_LIVE_HEARTBEAT_SECONDS": str(QUICK_HEARTBEAT)}
    with running(uvicorn("uvicorn-quick", env)) as (server,):
        yield server


@pytest.fixture(scope="session")
def redis_worker_pair(live_env):
    env = {**live_env, "RAGCHAT_LIVE_CHANNEL_LAYER": "redis"}
    with running(daphne("daphne-1", env), uvicorn("uvicorn-2", env)) as servers:
        yield servers


@pytest.fixture
def live_cache(live_prefix):
    """Fresh per-user limit counters for this test (the servers' cache is in Redis)."""
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(match=f"{live_prefix}:*:ragchat:*", count=1000))
    if keys:
        client.delete(*keys)
    yield
    client.close()


def rate_counted(live_prefix: str, user) -> int:
    """Turns the servers counted against ``user``'s ``TURNS_PER_MINUTE``, over every minute."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(client.scan_iter(match=f"{live_prefix}:*:ragchat:rate:u{user.pk}:*", count=1000))
        return sum(int(client.get(key) or 0) for key in keys)
    finally:
        client.close()


def slot_keys(live_prefix: str) -> list[bytes]:
    """The stream slots held on the servers (every user's)."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        return list(client.scan_iter(match=f"{live_prefix}:*:ragchat:slot:*", count=1000))
    finally:
        client.close()


def settle(timeout: float = 10.0) -> None:
    """Wait until the servers have saved every answer still being written (a test that closed
    its connections leaves them stopping), so the database is not emptied under them."""
    from django_ragchat.models import Message

    deadline = time.monotonic() + timeout
    while Message.objects.filter(status=Message.Status.STREAMING).exists() and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.fixture
def asgi(asgi_server, transactional_db, live_cache) -> ServerProcess:
    yield asgi_server
    settle()


@pytest.fixture
def wsgi(wsgi_server, transactional_db, live_cache) -> ServerProcess:
    yield wsgi_server
    settle()


@pytest.fixture
def quick_wsgi(quick_wsgi_server, transactional_db, live_cache) -> ServerProcess:
    yield quick_wsgi_server
    settle()


@pytest.fixture
def quick_asgi(quick_asgi_server, transactional_db, live_cache) -> ServerProcess:
    yield quick_asgi_server
    settle()


@pytest.fixture
def redis_workers(redis_worker_pair, transactional_db, live_cache) -> tuple[ServerProcess, ServerProcess]:
    yield redis_worker_pair
    settle()


# --- callers and clients ----------------------------------------------------------------------


@dataclass
class Caller:
    """Someone with a Django session on the live servers: the cookies a browser would send."""

    sessionid: str
    csrftoken: str

    @property
    def cookies(self) -> dict[str, str]:
        return {"sessionid": self.sessionid, "csrftoken": self.csrftoken}

    @property
    def cookie_header(self) -> str:
        return f"sessionid={self.sessionid}; csrftoken={self.csrftoken}"


def caller_for(user) -> Caller:
    """A signed-in session for ``user`` (in the shared test database)."""
    from django.test import Client

    client = Client()
    client.force_login(user)
    return Caller(client.cookies["sessionid"].value, secrets.token_hex(16))


def anonymous_caller() -> Caller:
    """An anonymous visitor with a session of their own."""
    from django.contrib.sessions.backends.db import SessionStore

    session = SessionStore()
    session.create()
    return Caller(session.session_key, secrets.token_hex(16))


def open_socket(server: ServerProcess, caller: Caller | None, path: str = "/ws/ragchat/", *,
                origin: str | None = None, ready: bool = True):
    """A websocket client connected to ``server``; with ``ready``, the ``ready`` frame is read."""
    headers = {"Cookie": caller.cookie_header} if caller else {}
    ws = ws_connect(server.ws_url + path, origin=origin or server.url, additional_headers=headers,
                    max_size=None, open_timeout=10, close_timeout=5).__enter__()
    if ready:
        frame = receive(ws)
        assert frame["type"] == "ready", frame
    return ws


def receive(ws, timeout: float = 10.0) -> dict:
    return json.loads(ws.recv(timeout=timeout))


def send(ws, **frame) -> None:
    ws.send(json.dumps(frame))


def read_turn(ws, timeout: float = 20.0) -> list[dict]:
    """Frames up to and including the turn's ``done`` or ``error``."""
    frames = []
    deadline = time.monotonic() + timeout
    while True:
        frame = receive(ws, max(0.1, deadline - time.monotonic()))
        frames.append(frame)
        if frame["type"] in ("done", "error"):
            return frames


def frames_until(ws, predicate, timeout: float = 20.0) -> list[dict]:
    """Frames up to and including the first one ``predicate`` accepts."""
    frames = []
    while not frames or not predicate(frames[-1]):
        frames.append(receive(ws, timeout))
    return frames


def parse_sse(lines) -> list[dict]:
    """Events of a ``text/event-stream`` body given as lines; checks ``event:`` matches the data."""
    events, name = [], None
    for line in lines:
        if line.startswith("event: "):
            name = line[len("event: "):]
        elif line.startswith("data: "):
            data = json.loads(line[len("data: "):])
            assert data["type"] == name, (name, data)
            events.append(data)
    return events


def sse_url(server: ServerProcess, conversation_id) -> str:
    return f"{server.url}/chat/conversations/{conversation_id}/stream/"


def sse_headers(caller: Caller) -> dict[str, str]:
    return {"X-CSRFToken": caller.csrftoken, "Accept": "text/event-stream"}


def post_stream(server: ServerProcess, caller: Caller, conversation_id, content, *, timeout: float = 20.0):
    """POST to the server-sent events endpoint and read the whole answer:
    ``(response, events)``; ``events`` is empty when the server refused with a JSON error."""
    with httpx.Client(cookies=caller.cookies, timeout=timeout) as client:
        with client.stream("POST", sse_url(server, conversation_id), json={"content": content},
                           headers=sse_headers(caller)) as response:
            if response.headers.get("content-type", "").startswith("text/event-stream"):
                return response, parse_sse(response.iter_lines())
            response.read()
            return response, []


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.05):
    """Poll ``predicate`` until it returns something truthy; that value, or AssertionError."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)


def unknown_id() -> str:
    return str(uuid.uuid4())


def words(n: int) -> str:
    """A model-free answer of exactly ``n`` distinct tokens, to count what a client receives."""
    return " ".join(f"word{i}" for i in range(n))


@contextlib.contextmanager
def chromium(window: str = "1280,900"):
    """Headless Chromium (Debian's, through /usr/bin/chromedriver), its profile and scratch
    files in a folder of its own under the tests' temp folder (var/tmp/, tests/conftest.py),
    removed afterwards. Short on purpose: Chromium puts a UNIX socket (at most 107 bytes of
    path) under its TMPDIR, which a pytest tmp_path in the checkout can exceed."""
    import shutil
    import tempfile

    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    scratch = Path(tempfile.mkdtemp(prefix="chr"))
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     "--no-first-run", f"--user-data-dir={scratch / 'profile'}", f"--window-size={window}",
                     "--force-device-scale-factor=1"):
        options.add_argument(argument)
    service = Service(executable_path="/usr/bin/chromedriver", env={**os.environ, "TMPDIR": str(scratch)})
    try:
        driver = webdriver.Chrome(service=service, options=options)
        driver.set_page_load_timeout(30)
        try:
            yield driver
        finally:
            driver.quit()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
