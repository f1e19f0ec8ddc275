"""A small OpenAI-compatible HTTP server for tests and local development.

It speaks enough of the OpenAI wire format for the official ``openai`` client
(sync and async) to talk to it over real HTTP: ``GET /v1/models``,
``POST /v1/embeddings`` and ``POST /v1/chat/completions`` (whole or streamed
as server-sent events). Answers are deterministic and scriptable, and faults
(latency, 429, 500, cut streams, malformed JSON) can be injected so that error
handling is exercised against the exceptions the real client raises.

Standard library only, so it can ship inside the package::

    with FakeOpenAIServer() as server:
        server.script("Hello!")
        client = openai.OpenAI(base_url=server.base_url, api_key="test")

Tool calling: a scripted reply may ask for tools instead of (or beside) text,
``server.script(tool_calls(call("order_status", order_number="ORD-17")), "It shipped.")``:
the first request is answered with the call (whole, or streamed as the API streams them:
the call's id and name, then its arguments in fragments, ``finish_reason`` ``"tool_calls"``),
the next one with the text. Requests are checked as the API checks them: every ``tool``
message must answer a call of the assistant message before it, and every call must be
answered (400 otherwise); ``tool_choice: "none"`` gets no calls.

Standalone: ``python -m django_ragchat.testing.openai_server --port 8001``.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import itertools
import json
import logging
import math
import random
import re
import select
import signal
import socket
import socketserver
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from functools import lru_cache, partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, NamedTuple, Union
from urllib.parse import urlsplit

__all__ = ["FakeOpenAIServer", "RecordedRequest", "embed", "FAULT_KINDS", "call", "tool_calls"]

log = logging.getLogger(__name__)

# A reply: text, a tool_calls(...) dict, or a callable of the request returning either.
Reply = Union[str, dict, Callable[[dict], Union[str, dict]]]
FAULT_KINDS = frozenset({"latency", "rate_limit", "server_error", "cut_stream", "malformed_json"})
DEFAULT_MODELS = ("gpt-4o-mini", "gpt-4o", "text-embedding-3-small", "text-embedding-3-large")
# Tokens are words together with the whitespace around them, so that joining
# the streamed deltas gives back the reply exactly.
_TOKEN_RE = re.compile(r"\s*\S+\s*")


class RecordedRequest(NamedTuple):
    """One request as the server received it (``headers`` keys are lower-case)."""

    method: str
    path: str
    json: Any
    headers: dict


@dataclass
class _Rule:
    contains: str
    reply: Reply
    any_message: bool
    times: int | None


@dataclass
class _Fault:
    kind: str
    times: int
    path: str | None
    opts: dict = field(default_factory=dict)


def _path_matches(path: str, pattern: str | None) -> bool:
    # "chat/completions", "/chat/completions" and "/v1/chat/completions" all
    # match, so callers need not care whether base_url carries "/v1".
    return pattern is None or path == pattern or path.endswith("/" + pattern.lstrip("/"))


def _words(text: str) -> int:
    return len(text.split())


def _text(content: Any) -> str:
    """Text of a message ``content``: a string or a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


@lru_cache(maxsize=8192)
def _word_vector(word: str, dims: int) -> tuple:
    seed = int.from_bytes(hashlib.sha256(word.encode()).digest()[:8], "little")
    rng = random.Random(seed)
    return tuple(rng.gauss(0.0, 1.0) for _ in range(dims))


def embed(text: str, dimensions: int = 64) -> list[float]:
    """Deterministic, L2-normalised embedding of ``text``.

    A hashed bag of words (each lower-cased word maps to a fixed random
    vector), so texts sharing words are close in cosine similarity: retrieval
    tests behave sensibly without a real model. Exposed so tests can compute
    the same vectors the server returns.
    """
    words = re.findall(r"\w+", text.lower()) or [text]
    vec = [0.0] * dimensions
    for word in words:
        for i, x in enumerate(_word_vector(word, dimensions)):
            vec[i] += x
    norm = math.sqrt(sum(x * x for x in vec)) or 1.0
    return [x / norm for x in vec]


def call(name: str, arguments: Any = None, *, id: str | None = None, **kwargs: Any) -> dict:
    """One tool call for :func:`tool_calls`: ``call("order_status", order_number="ORD-17")``.
    ``arguments`` may be a dict (sent as JSON) or text sent as is (malformed JSON, to test
    how a client copes); ``id`` defaults to ``call_<n>``."""
    if arguments is None:
        arguments = kwargs
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": id, "name": name, "arguments": text}


def tool_calls(*calls: dict, content: str = "") -> dict:
    """A reply asking for tool calls (several: parallel calls), with optional text before them."""
    return {"content": content, "tool_calls": list(calls)}


@dataclass
class _Answer:
    """A chosen reply: its text and the tool calls it asks for (OpenAI's shape)."""

    content: str
    tool_calls: list = field(default_factory=list)


def _answer(value: Any, ids: Callable[[], str]) -> _Answer:
    if not isinstance(value, dict):
        return _Answer(str(value))
    calls = []
    for position, item in enumerate(value.get("tool_calls") or ()):
        calls.append({"id": item.get("id") or f"{ids()}-{position}", "type": "function",
                      "function": {"name": item["name"], "arguments": item.get("arguments", "{}")}})
    return _Answer(str(value.get("content") or ""), calls)


def tool_protocol_error(body: dict) -> str | None:
    """What the API would answer 400 for in a request's tools and tool messages, or None."""
    for tool in body.get("tools") or ():
        function = tool.get("function") if isinstance(tool, dict) else None
        if not (isinstance(function, dict) and tool.get("type") == "function" and function.get("name")):
            return "Invalid 'tools': each tool must be {'type': 'function', 'function': {'name': ...}}."
    expected: set = set()
    for message in body.get("messages") or ():
        role = message.get("role") if isinstance(message, dict) else None
        if role == "tool":
            if message.get("tool_call_id") not in expected:
                return "messages with role 'tool' must be a response to a preceeding message with 'tool_calls'."
            expected.discard(message.get("tool_call_id"))
            continue
        if expected:
            return (f"An assistant message with 'tool_calls' must be followed by tool messages responding to "
                    f"each 'tool_call_id'. The following tool_call_ids did not have response messages: "
                    f"{', '.join(sorted(expected))}")
        if role == "assistant" and message.get("tool_calls"):
            expected = {c.get("id") for c in message["tool_calls"] if isinstance(c, dict)}
    return None


def default_reply(request: dict) -> str:
    """The answer given when nothing is scripted: echoes the last user message."""
    messages = request.get("messages") or []
    last_user = next((_text(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "")
    return f"Answer to: {last_user[:200]}"


class FakeOpenAIServer:
    """OpenAI-compatible HTTP server running in a background thread.

    Args:
        host, port: where to listen; port 0 picks a free port.
        token_delay: seconds to wait before each streamed token (and tool call fragment).
        embedding_dimensions: default embedding size when a request gives no
            ``dimensions``.
        models: ids listed by ``GET /v1/models``.
        default_reply: ``(request_json) -> str`` used when no rule or script
            applies.

    Chat replies are chosen in this order: the first matching :meth:`when`
    rule, then the next :meth:`script` entry, then ``default_reply``. Rules
    come first so a test can script the final answer while a rule answers an
    earlier helper call (e.g. query rewriting).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        token_delay: float = 0.0,
        embedding_dimensions: int = 64,
        models: tuple = DEFAULT_MODELS,
        default_reply: Callable[[dict], str] = default_reply,
        argument_fragment_chars: int = 7,
    ) -> None:
        self.host, self.port = host, port
        # A streamed tool call's arguments arrive in pieces of this many characters.
        self.argument_fragment_chars = argument_fragment_chars
        self.token_delay = self._initial_token_delay = token_delay
        self.embedding_dimensions = embedding_dimensions
        self.models = tuple(models)
        self.default_reply = default_reply
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._ids = itertools.count(1)
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._generation = 0  # bumped by reset(); lets late requests see their test is over
        self.reset()

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> FakeOpenAIServer:
        """Bind and serve in a daemon thread; returns ``self``."""
        if self._httpd is not None:
            return self
        self._stopping.clear()
        self._httpd = _HTTPServer((self.host, self.port), _Handler, fake=self)
        self.port = self._httpd.server_address[1]
        # A short poll interval keeps stop() fast.
        serve = partial(self._httpd.serve_forever, poll_interval=0.05)
        self._thread = threading.Thread(target=serve, name=f"fake-openai:{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, drop open connections and join every thread."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self._stopping.set()  # wakes handlers sleeping on latency/token delays
        httpd.shutdown()
        httpd.close_connections()  # wakes handlers blocked on idle keep-alive sockets
        httpd.server_close()  # joins the handler threads
        self._thread.join()

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT/v1``, ready for ``openai.OpenAI(base_url=...)``."""
        return f"http://{self.host}:{self.port}/v1"

    # -- scripting ---------------------------------------------------------

    def reset(self) -> None:
        """Forget scripts, rules, faults and recorded requests; restore ``token_delay``."""
        with self._lock:
            self._generation += 1
            self._script: deque = deque()
            self._rules: list[_Rule] = []
            self._faults: list[_Fault] = []
            self._requests: list[RecordedRequest] = []
            self.token_delay = self._initial_token_delay
            self._hold_after: int | None = None
            self._released = threading.Event()

    def hold_streams(self, after_tokens: int) -> None:
        """Streamed answers stop after ``after_tokens`` tokens until ``release_streams()`` (or
        10 s): a test can then check what a client received while the model is still
        "writing", with no timing involved."""
        self._released.clear()
        self._hold_after = after_tokens

    def release_streams(self) -> None:
        """Let streams held by ``hold_streams`` go on."""
        self._hold_after = None
        self._released.set()

    def script(self, *replies: Reply) -> None:
        """Queue chat replies, used in order; each a string, a :func:`tool_calls` reply, or
        ``(request_json) -> str | dict``."""
        with self._lock:
            self._script.extend(replies)

    def when(self, contains: str, reply: Reply, *, any_message: bool = False, times: int | None = None) -> None:
        """Answer chat requests whose last user message contains ``contains``.

        With ``any_message=True`` every message (system, history...) is
        searched. ``times`` limits how often the rule fires (default: always).
        """
        with self._lock:
            self._rules.append(_Rule(contains, reply, any_message, times))

    def fail_next(self, kind: str, times: int = 1, *, path: str | None = None, **opts: Any) -> None:
        """Inject a fault into the next ``times`` requests (to ``path`` if given).

        Kinds and options:
          * ``latency`` (``seconds=1.0``): wait, then answer normally.
          * ``rate_limit`` (``retry_after=0.01``): 429 with ``Retry-After`` headers.
          * ``server_error`` (``status=500``): error JSON.
          * ``cut_stream`` (``after_tokens=1``): stream that many tokens then drop
            the connection without ``[DONE]``; non-streamed requests are dropped
            before any response.
          * ``malformed_json`` (``after_tokens=1``): a 200 whose body (or, when
            streaming, whose next chunk) is not valid JSON.
        """
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; expected one of {sorted(FAULT_KINDS)}")
        if times < 1:
            raise ValueError("times must be at least 1")
        with self._lock:
            self._faults.append(_Fault(kind, times, path, opts))

    # -- inspection --------------------------------------------------------

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request received since the last :meth:`reset`, oldest first."""
        with self._lock:
            return list(self._requests)

    def count(self, path: str | None = None) -> int:
        """Number of recorded requests, optionally only those to ``path``."""
        return sum(1 for r in self.requests if _path_matches(r.path, path))

    def last(self, path: str | None = None) -> RecordedRequest | None:
        """The most recent request (to ``path`` if given), or ``None``."""
        return next((r for r in reversed(self.requests) if _path_matches(r.path, path)), None)

    # -- internals used by the handler ---------------------------------------

    def _record(self, request: RecordedRequest) -> _Fault | None:
        """Record a request and take the first fault that applies to it."""
        with self._lock:
            self._requests.append(request)
            for fault in self._faults:
                if _path_matches(request.path, fault.path):
                    fault.times -= 1
                    if fault.times <= 0:
                        self._faults.remove(fault)
                    return fault
        return None

    def _choose_reply(self, body: dict) -> _Answer:
        messages = body.get("messages") or []
        texts = [_text(m.get("content")) for m in messages]
        last_user = next((t for m, t in zip(reversed(messages), reversed(texts)) if m.get("role") == "user"), "")
        reply: Reply | None = None
        with self._lock:
            for rule in self._rules:
                if any(rule.contains in t for t in (texts if rule.any_message else [last_user])):
                    if rule.times is not None:
                        rule.times -= 1
                        if rule.times <= 0:
                            self._rules.remove(rule)
                    reply = rule.reply
                    break
            if reply is None and self._script:
                reply = self._script.popleft()
        if reply is None:
            reply = self.default_reply
        # Callables run outside the lock: they may be slow or call back in.
        answer = _answer(reply(body) if callable(reply) else reply, lambda: self._next_id("call"))
        if body.get("tool_choice") == "none" or not body.get("tools"):
            answer.tool_calls = []  # a model is never given the chance
        return answer

    def _next_id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._ids)}"


class _HTTPServer(ThreadingHTTPServer):
    def __init__(self, address: tuple, handler: type, *, fake: FakeOpenAIServer) -> None:
        self.fake = fake
        self._conns: set = set()
        self._workers: list[threading.Thread] = []
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        # Like ThreadingMixIn, but remembers daemon threads too (the stdlib only
        # tracks non-daemon ones) so server_close() can join every one of them.
        # Daemon, so a server someone forgot to stop never blocks interpreter exit.
        worker = threading.Thread(target=self.process_request_thread, args=(request, client_address), daemon=True)
        with self.fake._lock:
            self._workers = [w for w in self._workers if w.is_alive()]
            self._workers.append(worker)
        worker.start()

    def server_close(self) -> None:
        super().server_close()
        for worker in self._workers:
            worker.join()

    def server_bind(self) -> None:
        # HTTPServer.server_bind calls socket.getfqdn(), a DNS lookup we don't need.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    def track(self, conn: socket.socket, add: bool) -> None:
        with self.fake._lock:
            if add and self.fake._stopping.is_set():
                _shutdown(conn)  # accepted while stopping: don't let it block the join
            elif add:
                self._conns.add(conn)
            else:
                self._conns.discard(conn)

    def close_connections(self) -> None:
        with self.fake._lock:
            for conn in self._conns:
                _shutdown(conn)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients hanging up (timeouts, cut streams, stop()) are routine here.
        log.debug("fake OpenAI server: error handling request", exc_info=True)


def _shutdown(conn: socket.socket) -> None:
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, and chunked encoding so a cut stream is detectable
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        # Without this, Nagle + delayed ACKs add ~40 ms to small responses.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.track(self.connection, add=False)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s - %s", self.address_string(), format % args)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    # -- plumbing ------------------------------------------------------------

    def _dispatch(self, method: str) -> None:
        fake = self.server.fake
        path = urlsplit(self.path).path
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        headers = {k.lower(): v for k, v in self.headers.items()}
        fault = fake._record(RecordedRequest(method, path, body, headers))
        route = path[3:] if path.startswith("/v1/") else path
        streaming = route == "/chat/completions" and isinstance(body, dict) and bool(body.get("stream"))
        if fault is not None and self._answer_fault(fault, streaming, raw):
            return
        if fault is not None and fault.kind == "latency":
            fault = None  # waited, then answered as usual
        self._route(method, route, path, body, fault)

    def _answer_fault(self, fault: _Fault, streaming: bool, raw: bytes) -> bool:
        """Answer (or drop) the request as ``fault`` says; False when it is still to be answered."""
        fake = self.server.fake
        if fault.kind == "latency":
            generation = fake._generation
            # A client that timed out, or a test that has moved on (reset), must not
            # have this late request consume replies scripted for what comes next.
            stopped = fake._stopping.wait(fault.opts.get("seconds", 1.0))
            if stopped or generation != fake._generation or self._client_gone():
                self._abort()
                return True
            return False
        if fault.kind == "rate_limit":
            wait = float(fault.opts.get("retry_after", 0.01))
            # The openai client prefers retry-after-ms; plain Retry-After must be an integer.
            extra = {"Retry-After": str(math.ceil(wait)), "retry-after-ms": str(int(wait * 1000))}
            self._error(429, "Rate limit reached (injected fault).", "requests", "rate_limit_exceeded", extra)
        elif fault.kind == "server_error":
            status = int(fault.opts.get("status", 500))
            self._error(status, "The server had an error (injected fault).", "server_error")
        elif fault.kind == "cut_stream" and not streaming:
            self._abort()  # nothing streamed to cut: drop the request unanswered
        elif fault.kind == "malformed_json" and not streaming:
            self._json(200, None, raw=b'{"object": "list", "data": [{"broken": ')
        else:
            return False  # a streamed answer's fault: the stream applies it
        return True

    def _route(self, method: str, route: str, path: str, body: Any, fault: _Fault | None) -> None:
        fake = self.server.fake
        if not isinstance(body, dict) and method == "POST":
            return self._error(400, "Request body must be a JSON object.", "invalid_request_error")
        if method == "GET" and route == "/models":
            return self._json(200, {"object": "list", "data": [self._model(m) for m in fake.models]})
        if method == "GET" and route.startswith("/models/") and route[8:] in fake.models:
            return self._json(200, self._model(route[8:]))
        if method == "POST" and route == "/embeddings":
            return self._embeddings(body)
        if method == "POST" and route == "/chat/completions":
            return self._chat(body, fault)
        self._error(404, f"Unknown endpoint {method} {path}.", "invalid_request_error", code="unknown_url")

    def _json(self, status: int, payload: Any, headers: dict | None = None, raw: bytes | None = None) -> None:
        data = raw if raw is not None else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("x-request-id", self.server.fake._next_id("req"))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _error(
        self, status: int, message: str, type_: str, code: str | None = None, headers: dict | None = None
    ) -> None:
        self._json(status, {"error": {"message": message, "type": type_, "param": None, "code": code}}, headers)

    def _client_gone(self) -> bool:
        readable, _, _ = select.select([self.connection], [], [], 0)
        try:
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _abort(self) -> None:
        # FIN rather than RST: the client still reads what was sent, then sees
        # the body end early (incomplete chunked read).
        self.close_connection = True
        _shutdown(self.connection)

    def _model(self, model_id: str) -> dict:
        return {"id": model_id, "object": "model", "created": 0, "owned_by": "django-ragchat-tests"}

    # -- endpoints -----------------------------------------------------------

    def _embeddings(self, body: dict) -> None:
        inputs = body.get("input")
        if isinstance(inputs, str) or (isinstance(inputs, list) and inputs and isinstance(inputs[0], int)):
            inputs = [inputs]
        texts = [t if isinstance(t, str) else " ".join(map(str, t)) for t in inputs or []]
        dims = int(body.get("dimensions") or self.server.fake.embedding_dimensions)
        as_base64 = body.get("encoding_format") == "base64"
        data = []
        for i, text in enumerate(texts):
            vec = embed(text, dims)
            if as_base64:  # little-endian float32, as the API sends it
                vec = base64.b64encode(struct.pack(f"<{dims}f", *vec)).decode()
            data.append({"object": "embedding", "index": i, "embedding": vec})
        tokens = sum(_words(t) for t in texts)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        self._json(200, {"object": "list", "data": data, "model": body.get("model", ""), "usage": usage})

    def _chat(self, body: dict, fault: _Fault | None) -> None:
        fake = self.server.fake
        problem = tool_protocol_error(body)
        if problem:
            return self._error(400, problem, "invalid_request_error", code="invalid_request")
        try:
            answer = fake._choose_reply(body)
        except Exception as exc:  # a scripted callable failed: tell the test, loudly
            log.exception("reply callable failed")
            return self._error(500, f"Scripted reply raised {exc!r}", "server_error")
        reply = answer.content
        tokens = _TOKEN_RE.findall(reply) or ([reply] if reply else [])
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        finish = "tool_calls" if answer.tool_calls else "stop"
        if limit and len(tokens) > int(limit):
            tokens, finish = tokens[: int(limit)], "length"
        prompt = sum(_words(_text(m.get("content"))) for m in body.get("messages") or [])
        completion = sum(_words(t) for t in tokens) + sum(
            _words(c["function"]["arguments"].replace('"', " ")) for c in answer.tool_calls)
        usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        base = {
            "id": fake._next_id("chatcmpl"),
            "created": int(time.time()),
            "model": body.get("model", ""),
            "system_fingerprint": "fp_ragchat",
        }
        if body.get("stream"):
            return self._stream(base, tokens, finish, usage, body, fault, answer.tool_calls)
        message = {"role": "assistant", "content": "".join(tokens) if tokens or not answer.tool_calls else None,
                   "refusal": None}
        if answer.tool_calls:
            message["tool_calls"] = answer.tool_calls
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
        self._json(200, {**base, "object": "chat.completion", "choices": [choice], "usage": usage})

    def _stream(self, base: dict, tokens: list, finish: str, usage: dict, body: dict, fault: _Fault | None,
                calls: list = ()) -> None:
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        base = {**base, "object": "chat.completion.chunk"}

        def chunk(delta: dict, finish_reason: str | None = None) -> dict:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return {**base, "choices": [choice], **({"usage": None} if include_usage else {})}

        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self._event(chunk({"role": "assistant", "content": "", "refusal": None}))
        cut_at = int(fault.opts.get("after_tokens", 1)) if fault else None
        for i, token in enumerate(tokens):
            if cut_at is not None and i >= cut_at:
                break
            if self.server.fake.token_delay and self.server.fake._stopping.wait(self.server.fake.token_delay):
                return self._abort()
            if i == self.server.fake._hold_after:
                self.server.fake._released.wait(10)
            self._event(chunk({"content": token}))
        for position, tool_call in enumerate(calls):
            if self._stream_tool_call(chunk, position, tool_call):
                return self._abort()
        if fault and fault.kind == "cut_stream":
            return self._abort()
        if fault and fault.kind == "malformed_json":
            self._event('{"id": "chatcmpl-broken", "choices": [{')
        else:
            self._event(chunk({}, finish))
            if include_usage:
                self._event({**base, "choices": [], "usage": usage})
        self._event("[DONE]")
        self.wfile.write(b"0\r\n\r\n")

    def _stream_tool_call(self, chunk: Callable[[dict], dict], position: int, tool_call: dict) -> bool:
        """Stream one call as the API does: id, type and name first, then the arguments in
        fragments. True when the server is stopping (the caller drops the connection)."""
        fake = self.server.fake
        function = tool_call["function"]
        self._event(chunk({"tool_calls": [{"index": position, "id": tool_call["id"], "type": "function",
                                           "function": {"name": function["name"], "arguments": ""}}]}))
        text, size = function["arguments"], max(1, fake.argument_fragment_chars)
        for start in range(0, len(text), size):
            if fake.token_delay and fake._stopping.wait(fake.token_delay):
                return True
            self._event(chunk({"tool_calls": [{"index": position, "function": {"arguments": text[start:start + size]}}]}))
        return False

    def _event(self, payload: Any) -> None:
        text = payload if isinstance(payload, str) else json.dumps(payload)
        data = f"data: {text}\n\n".encode()
        # One write per event (no buffering on wfile): each event leaves at once.
        self.wfile.write(b"%X\r\n%s\r\n" % (len(data), data))


def main(argv: list[str] | None = None) -> None:
    """Run the server in the foreground until interrupted."""
    parser = argparse.ArgumentParser(description="Fake OpenAI-compatible server for django-ragchat.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--token-delay", type=float, default=0.0, help="seconds between streamed tokens")
    parser.add_argument("--dimensions", type=int, default=64, help="default embedding size")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every request")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(message)s")
    server = FakeOpenAIServer(args.host, args.port, token_delay=args.token_delay, embedding_dimensions=args.dimensions)
    stop = threading.Event()
    # Explicit handlers: a shell starting us in the background leaves SIGINT ignored.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    with server:
        print(f"Fake OpenAI server on {server.base_url} (Ctrl+C to stop)", flush=True)
        while not stop.wait(0.5):
            pass


if __name__ == "__main__":
    main()
