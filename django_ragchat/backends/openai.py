"""Models on OpenAI or any OpenAI-compatible server (Ollama, vLLM, llama.cpp, LM Studio),
through the official ``openai`` client.

The client side of the LLM backend ``openai`` (chat completions, whole or streamed,
``stages.llms.OpenAIChatBackend``) and the embedder ``openai`` (batched embeddings,
``stages.embedders.OpenAIEmbedder``). Both read the profile's ``options["openai"]``: one block
configures the server once for chat and embeddings::

    "options": {"openai": {
        "model": "gpt-4o-mini",                    # chat
        "embedding_model": "text-embedding-3-small",
        "base_url": None,                          # None: api.openai.com
        "api_key_env": "OPENAI_API_KEY",           # the key is read from this variable
        "timeout": 60, "max_retries": 2,
    }}

The key is read from the environment when a client is created, never from settings or the
database. Retries (429, 5xx, connection errors, honouring ``Retry-After``) and timeouts are
the client's own. Failures become ``LLMError`` with a short code and a message safe to show
(see ``llm_error``); the full detail goes to the log.

The building blocks are public so other components reuse them instead of copying them:
``OpenAIConnection`` (a server: URL, key, timeout, retries; it hands out pooled clients) and
``ChatModel`` (one model on a connection: requests, streaming, error mapping).
``chat_model_from_options`` builds a ``ChatModel`` for a helper component (query rewriting,
expansion, summaries) that defaults to the profile's own server and model, so
``{"rewrite": {"model": "small-model"}}`` is enough to rewrite with a cheaper model.
See docs/openai.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import email.utils
import functools
import importlib.util
import json
import json.scanner
import logging
import os
import ssl
import threading
import time
import weakref
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

import anyio
import openai
from django.core.exceptions import ImproperlyConfigured
from openai.types.chat import ChatCompletion

from django_ragchat.exceptions import LLMError
from django_ragchat.types import LLMDelta, LLMResponse, ToolCall, Usage

try:  # the HTTP library of the installed openai client (httpx2 in recent versions)
    import httpx2 as _http
except ImportError:  # pragma: no cover - older openai releases
    import httpx as _http

if TYPE_CHECKING:
    from django_ragchat.profiles import Profile
    from django_ragchat.turn.context import TurnContext

logger = logging.getLogger(__name__)

DEFAULT_CHAT_MODEL = "gpt-4o-mini"
DEFAULT_EMBEDDING_MODEL = "text-embedding-3-small"
# Native sizes of OpenAI's embedding models; any other model's size is learnt from its first reply.
EMBEDDING_MODEL_DIMENSIONS = {
    "text-embedding-3-small": 1536,
    "text-embedding-3-large": 3072,
    "text-embedding-ada-002": 1536,
}

# The keys of the shared ``options["openai"]`` block, by what uses them.
CONNECTION_OPTIONS = ("base_url", "api_key_env", "timeout", "max_retries", "headers", "http_client")
# The async client's HTTP library: httpx (the openai client's own), or aiohttp, openai's
# ``DefaultAioHttpClient`` (``pip install "openai[aiohttp]"``), whose C parser reads a streamed
# answer for about half the CPU of httpx's pure-Python one (bench/README.md, issue 27).
HTTP_CLIENTS = ("httpx", "aiohttp")
CHAT_OPTIONS = ("model", "temperature", "max_tokens", "max_tokens_param", "stream_usage", "extra_body")
EMBEDDING_OPTIONS = ("embedding_model", "embedding_dimensions", "send_dimensions", "batch_size")

USER_MESSAGES = {
    "rate_limited": "The model is receiving too many requests right now. Please try again in a moment.",
    "timeout": "The model took too long to answer. Please try again.",
    "model_unavailable": "The model is unavailable right now. Please try again later.",
    "request_rejected": "The model could not process this request.",
    "bad_response": "The model sent a response that could not be read. Please try again.",
    "stream_interrupted": "The connection to the model was lost while it was answering. Please try again.",
}


# --- Connections and clients -----------------------------------------------------------------


@functools.cache
def _ssl_context():
    # Loading the CA bundle takes ~20 ms; every client shares one context instead.
    return _http.create_ssl_context()


# Async clients by event loop: an httpx connection pool belongs to the loop that opened its
# connections, and the synchronous facade (``run_turn_sync``) runs every turn in a new loop.
# Under ASGI there is one loop, so one client per server for the process.
_async_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[dict, Any]] = weakref.WeakKeyDictionary()
_sync_clients: dict[tuple, openai.OpenAI] = {}
_clients_lock = threading.Lock()


async def _close_at_loop_shutdown(clients: dict) -> AsyncIterator[None]:
    """Suspended for the loop's lifetime; ``loop.shutdown_asyncgens()`` (which ``asyncio.run``
    calls) closes it, and with it the loop's clients and their open connections."""
    try:
        yield
    finally:
        for client in list(clients.values()):
            await client.close()


@dataclasses.dataclass(frozen=True)
class OpenAIConnection:
    """An OpenAI-compatible server: where it is, how to authenticate, timeouts and retries.

    ``base_url`` ``None`` means api.openai.com. The key is read from the environment variable
    ``api_key_env`` when a client is created; a server with a ``base_url`` and no key set
    (a local Ollama, vLLM or llama.cpp) gets a placeholder, as those ignore it. ``timeout``
    (seconds) and ``max_retries`` go to the client, whose retry loop handles 429 (honouring
    ``Retry-After``), 5xx and connection errors. Instances are hashable: clients are pooled per
    connection (and per event loop), never created per request. ``http_client`` is the async
    client's HTTP library (``HTTP_CLIENTS``); the synchronous client is always httpx.
    """

    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    timeout: float = 60.0
    max_retries: int = 2
    headers: tuple[tuple[str, str], ...] = ()
    http_client: str = "httpx"

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> OpenAIConnection:
        """A connection from the ``CONNECTION_OPTIONS`` keys of ``options`` (others ignored)."""
        values = {k: options[k] for k in CONNECTION_OPTIONS if k in options and options[k] is not None}
        if "headers" in values:
            if not isinstance(values["headers"], dict):
                raise ImproperlyConfigured("openai option 'headers' must be a dict of header name -> value.")
            values["headers"] = tuple(sorted((str(k), str(v)) for k, v in values["headers"].items()))
        if "timeout" in values and not (isinstance(values["timeout"], (int, float)) and values["timeout"] > 0):
            raise ImproperlyConfigured(
                f"openai option 'timeout' must be a positive number of seconds, not {values['timeout']!r}.")
        if "max_retries" in values and not (isinstance(values["max_retries"], int) and values["max_retries"] >= 0):
            raise ImproperlyConfigured(
                f"openai option 'max_retries' must be an integer >= 0, not {values['max_retries']!r}.")
        _check_http_client(values.get("http_client", "httpx"))
        return cls(**values)

    def api_key(self) -> str | None:
        """The key from the environment; a placeholder for keyless local servers; else None."""
        key = os.environ.get(self.api_key_env, "").strip()
        if key:
            return key
        return "not-needed" if self.base_url else None

    def describe(self) -> str:
        return self.base_url or "api.openai.com"

    def _client_kwargs(self) -> dict[str, Any]:
        key = self.api_key()
        if key is None:
            logger.error("No API key for %s: the environment variable %s is not set.",
                         self.describe(), self.api_key_env)
            raise LLMError("model_unavailable", USER_MESSAGES["model_unavailable"])
        return {"api_key": key, "base_url": self.base_url, "timeout": self.timeout,
                "max_retries": self.max_retries, "default_headers": dict(self.headers) or None}

    async def async_client(self) -> openai.AsyncOpenAI:
        """The ``AsyncOpenAI`` client of this connection for the running event loop."""
        kwargs = self._client_kwargs()
        loop = asyncio.get_running_loop()
        key = (self, kwargs["api_key"])
        with _clients_lock:
            entry = _async_clients.get(loop)
        if entry is None:
            clients: dict = {}
            closer = _close_at_loop_shutdown(clients)
            entry = (clients, closer)
            with _clients_lock:
                _async_clients[loop] = entry
            await closer.asend(None)  # started: the loop now tracks it (runs to its yield, no suspension)
        clients = entry[0]
        if key not in clients:
            client_class = openai.DefaultAioHttpClient if self.http_client == "aiohttp" else openai.DefaultAsyncHttpxClient
            clients[key] = openai.AsyncOpenAI(http_client=client_class(verify=_ssl_context()), **kwargs)
        return clients[key]

    def sync_client(self) -> openai.OpenAI:
        """The process-wide synchronous ``OpenAI`` client of this connection (ingestion,
        management commands, background work)."""
        kwargs = self._client_kwargs()
        key = (self, kwargs["api_key"])
        with _clients_lock:
            if key not in _sync_clients:
                http_client = openai.DefaultHttpxClient(verify=_ssl_context())
                _sync_clients[key] = openai.OpenAI(http_client=http_client, **kwargs)
            return _sync_clients[key]


def _check_http_client(name: Any) -> None:
    """Refuses an ``http_client`` option this process cannot use, at startup, not at a turn."""
    if name not in HTTP_CLIENTS:
        raise ImproperlyConfigured(f"openai option 'http_client' must be one of {HTTP_CLIENTS}, not {name!r}.")
    if name == "aiohttp" and (importlib.util.find_spec("aiohttp") is None
                              or not hasattr(openai, "DefaultAioHttpClient")):
        raise ImproperlyConfigured("openai option 'http_client': 'aiohttp' needs aiohttp and an openai "
                                   "client that supports it: pip install \"openai[aiohttp]\".")


# --- Errors ------------------------------------------------------------------------------------


def _retry_after(exc: openai.APIStatusError) -> float | None:
    headers = exc.response.headers
    try:
        if headers.get("retry-after-ms"):
            return float(headers["retry-after-ms"]) / 1000
        value = headers.get("retry-after")
        if not value:
            return None
        try:
            return float(value)
        except ValueError:  # an HTTP date
            return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def _timed_out(exc: BaseException) -> bool:
    """Whether the client's error is a timeout. Under the ``aiohttp`` http_client, openai's
    adapter raises httpx's ``ConnectTimeout`` for every aiohttp connection error (refused,
    dropped): one that is not aiohttp's own timeout is a connection error, as under httpx."""
    if not isinstance(exc, (openai.APITimeoutError, _http.TimeoutException)):
        return False
    cause = exc.__cause__
    while cause is not None:
        if type(cause).__module__.startswith("aiohttp."):
            return isinstance(cause, TimeoutError)  # aiohttp's timeouts are TimeoutErrors
        cause = cause.__cause__
    return True


def llm_error(exc: BaseException, *, what: str, during_stream: bool = False) -> LLMError | None:
    """The ``LLMError`` for an exception raised by the ``openai`` client, or ``None`` when the
    exception is not a model failure (a bug: let it propagate). Logs the detail.

    Codes: ``rate_limited`` (429, with ``retry_after``), ``timeout``, ``model_unavailable``
    (404, 401/403, 5xx, connection refused, no key), ``request_rejected`` (other 4xx, e.g. the
    context window exceeded), ``bad_response`` (malformed JSON: the client raises
    ``json.JSONDecodeError`` itself for a malformed body), ``stream_interrupted`` (the connection
    dropped while an answer was streaming). ``what`` names the call in the log.
    """
    retry_after = None
    if isinstance(exc, LLMError):
        return exc
    if _timed_out(exc):
        code = "timeout"
    elif isinstance(exc, (openai.APIConnectionError, _http.TransportError)):
        code = "stream_interrupted" if during_stream else "model_unavailable"
    elif isinstance(exc, openai.RateLimitError):
        code, retry_after = "rate_limited", _retry_after(exc)
    elif isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        code = "model_unavailable" if status >= 500 or status in (401, 403, 404) else "request_rejected"
    elif isinstance(exc, (json.JSONDecodeError, openai.APIResponseValidationError)):
        code = "bad_response"
    else:
        return None
    detail = repr(exc)
    if isinstance(exc, openai.APIStatusError):
        detail += f" status={exc.status_code} request_id={exc.request_id} body={exc.body!r}"[:2000]
    if exc.__cause__ is not None:
        detail += f" (cause: {exc.__cause__!r})"
    logger.warning("%s failed with %s: %s", what, code, detail)
    return LLMError(code, USER_MESSAGES[code], retry_after=retry_after)


_MODEL_ERRORS = (openai.OpenAIError, json.JSONDecodeError, _http.HTTPError)


@contextlib.contextmanager
def model_errors(what: str, *, during_stream: bool = False) -> Iterator[None]:
    """Turn the model failures raised inside the block into ``LLMError`` (see ``llm_error``)."""
    try:
        yield
    except _MODEL_ERRORS as exc:
        error = llm_error(exc, what=what, during_stream=during_stream)
        if error is None:
            raise
        raise error from exc


def _usage(usage: Any) -> Usage | None:
    if usage is None:
        return None
    return Usage(prompt_tokens=usage.prompt_tokens or 0, completion_tokens=getattr(usage, "completion_tokens", 0) or 0)


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _usage_dict(usage: Any) -> Usage | None:
    """``_usage`` for a stream chunk's decoded ``usage`` object."""
    if not isinstance(usage, dict):
        return None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return Usage(prompt_tokens=prompt if isinstance(prompt, int) else 0,
                 completion_tokens=completion if isinstance(completion, int) else 0)


# --- Tool calls ----------------------------------------------------------------------------------


class ToolCallAssembler:
    """The tool calls of a streamed answer, assembled from its fragments.

    A stream sends each call in pieces (``delta.tool_calls``): the first with the call's
    ``index``, ``id`` and function ``name``, the next ones with more of its ``arguments``, to be
    joined in order; parallel calls have their own index. Some servers (Ollama) give every call
    of a parallel batch index 0 and tell them apart only by id: a new id at a used index starts
    a new call.
    """

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.by_index: dict[int, dict[str, Any]] = {}

    def add(self, fragment: Any) -> None:
        if not isinstance(fragment, dict):
            return
        index = fragment.get("index")
        call_id = _str(fragment.get("id"))
        function = fragment.get("function") if isinstance(fragment.get("function"), dict) else {}
        call = self.by_index.get(index) if isinstance(index, int) else (self.calls[-1] if self.calls and not call_id
                                                                        else None)
        if call is None or (call_id and call["id"] and call_id != call["id"]):
            call = {"id": call_id, "name": [], "arguments": []}
            self.calls.append(call)
            if isinstance(index, int):
                self.by_index[index] = call
        elif call_id:
            call["id"] = call_id
        call["name"].append(_str(function.get("name")))
        call["arguments"].append(_str(function.get("arguments")))

    def result(self) -> tuple[ToolCall, ...]:
        """The assembled calls, in the order they began (a call without an id gets one)."""
        return tuple(ToolCall(id=call["id"] or f"call_{position}", name="".join(call["name"]),
                              arguments="".join(call["arguments"]) or "{}")
                     for position, call in enumerate(self.calls) if "".join(call["name"]))


def whole_tool_calls(message: Any) -> tuple[ToolCall, ...]:
    """The tool calls of a whole answer's message (``message.tool_calls``)."""
    calls = []
    for position, call in enumerate(getattr(message, "tool_calls", None) or ()):
        function = getattr(call, "function", None)
        name = _str(getattr(function, "name", None))
        if name:
            calls.append(ToolCall(id=_str(getattr(call, "id", None)) or f"call_{position}", name=name,
                                  arguments=_str(getattr(function, "arguments", None)) or "{}"))
    return tuple(calls)


# --- Chat ----------------------------------------------------------------------------------------


class ChatModel:
    """One chat model on one connection: builds requests, calls the client, maps errors.

    ``temperature`` ``None`` leaves it to the server (reasoning models accept only their
    default). ``max_tokens`` caps the reply, sent as ``max_tokens_param`` (``"max_tokens"``,
    understood by every compatible server; OpenAI's reasoning models want
    ``"max_completion_tokens"``). ``stream_usage`` asks for the usage chunk at the end of a
    stream (``stream_options.include_usage``); turn it off for servers that reject it.
    ``extra_body`` is merged into every request (server-specific parameters).
    """

    def __init__(self, connection: OpenAIConnection, *, model: str, temperature: float | None = None,
                 max_tokens: int | None = None, max_tokens_param: str = "max_tokens",
                 stream_usage: bool = True, extra_body: dict[str, Any] | None = None):
        if not model or not isinstance(model, str):
            raise ImproperlyConfigured("openai option 'model' must name a model.")
        if max_tokens_param not in ("max_tokens", "max_completion_tokens"):
            raise ImproperlyConfigured(
                "openai option 'max_tokens_param' must be 'max_tokens' or 'max_completion_tokens'.")
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            raise ImproperlyConfigured(f"openai option 'max_tokens' must be a positive integer, not {max_tokens!r}.")
        self.connection = connection
        self.model = model
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.max_tokens_param = max_tokens_param
        self.stream_usage = stream_usage
        self.extra_body = dict(extra_body or {})

    def __repr__(self) -> str:
        return f"<ChatModel {self.model} at {self.connection.describe()}>"

    def body(self, messages: list[dict[str, Any]], *, max_tokens: int | None = None,
             stream: bool = False, tools: tuple | list = (), tool_choice: str | None = None) -> dict[str, Any]:
        """The JSON body of a chat completions request for ``messages`` (and ``tools``, the
        ``tools`` entries offered; ``tool_choice`` ``"none"`` forbids calling them this time)."""
        body: dict[str, Any] = {"model": self.model, "messages": messages}
        if tools:
            body["tools"] = list(tools)
            if tool_choice:
                body["tool_choice"] = tool_choice
        limit = max_tokens or self.max_tokens
        if limit:
            body[self.max_tokens_param] = limit
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if stream:
            body["stream"] = True
            if self.stream_usage:
                body["stream_options"] = {"include_usage": True}
        body.update(self.extra_body)
        return body

    # The requests go through ``client.post`` (the client's documented way to send a body as
    # is) rather than ``chat.completions.create``, which first walks every message through the
    # typed request schema: about 0.17 ms a message, 10 ms a request with 50 messages of
    # history, to produce the same JSON for plain text messages. Authentication, retries,
    # timeouts and response parsing are the client's, exactly as with ``create``.

    def _response(self, completion: Any) -> LLMResponse:
        try:
            choice = completion.choices[0]
            text = choice.message.content or getattr(choice.message, "refusal", None) or ""
            return LLMResponse(text=text, model=completion.model or self.model, usage=_usage(completion.usage),
                               finish_reason=choice.finish_reason or "stop",
                               tool_calls=whole_tool_calls(choice.message))
        except (AttributeError, IndexError, TypeError) as exc:  # no choices, or not a completion at all
            logger.warning("chat completion from %r has an unexpected shape: %r", self, completion)
            raise LLMError("bad_response", USER_MESSAGES["bad_response"]) from exc

    async def complete(self, messages: list[dict[str, Any]], *, max_tokens: int | None = None,
                       tools: tuple | list = (), tool_choice: str | None = None) -> LLMResponse:
        """The whole reply to ``messages``; raises ``LLMError``. With ``tools``, the reply may
        be ``tool_calls`` instead of (or beside) text."""
        client = await self.connection.async_client()
        body = self.body(messages, max_tokens=max_tokens, tools=tools, tool_choice=tool_choice)
        with model_errors(repr(self)):
            completion = await client.post("/chat/completions", body=body, cast_to=ChatCompletion)
        return self._response(completion)

    def complete_sync(self, messages: list[dict[str, str]], *, max_tokens: int | None = None) -> LLMResponse:
        """``complete`` for synchronous callers (background threads, commands)."""
        client = self.connection.sync_client()
        with model_errors(repr(self)):
            completion = client.post("/chat/completions", body=self.body(messages, max_tokens=max_tokens),
                                     cast_to=ChatCompletion)
        return self._response(completion)

    async def stream(self, messages: list[dict[str, Any]], *, max_tokens: int | None = None,
                     tools: tuple | list = (), tool_choice: str | None = None) -> AsyncIterator[LLMDelta]:
        """The reply as ``LLMDelta`` pieces; the last one carries the model, the usage (when
        the server reports it), the finish reason and the tool calls the model asked for,
        assembled from their fragments. Raises ``LLMError``, mid-stream too. Closing the
        iterator early closes the HTTP response."""
        client = await self.connection.async_client()
        body = self.body(messages, max_tokens=max_tokens, stream=True, tools=tools, tool_choice=tool_choice)
        with model_errors(repr(self)):
            response = await client.post(
                "/chat/completions", body=body,
                # Chunks as the decoded JSON (``cast_to`` object), not ``ChatCompletionChunk``
                # models: building a typed model is ~0.3 ms of CPU a token, the largest cost of
                # relaying an answer, and what a worker streaming many answers at once spends
                # its time on instead of starting the next turns.
                cast_to=ChatCompletion, stream=True, stream_cls=ChunkLists,
            )
        read = _StreamRead(self.model)
        try:
            with model_errors(repr(self), during_stream=True):
                async for chunks in response:
                    # The chunks one read of the socket brought: their text is one piece.
                    texts: list[str] = []
                    bad = read.chunks(chunks, texts)
                    if texts:
                        yield LLMDelta(text="".join(texts))
                    if bad is not None:  # what came before the bad chunk is still the answer's
                        logger.warning("stream chunk from %r has an unexpected shape: %r", self, bad[0])
                        raise LLMError("bad_response", USER_MESSAGES["bad_response"])
        finally:
            await response.close()
        yield LLMDelta(model=read.model, usage=read.usage, finish_reason=read.finish or "stop",
                       tool_calls=read.calls.result())


class _StreamRead:
    """What a streamed answer's chunks said so far besides its text: the model, the usage, the
    finish reason, the tool calls. A run of text chunks alike (``_Run``) is read once for its
    fields, however many tokens it holds; a field of another kind than expected is skipped."""

    def __init__(self, model: str):
        self.model, self.usage, self.finish = model, None, None
        self.calls = ToolCallAssembler()

    def chunks(self, chunks: list, texts: list[str]) -> tuple[Any] | None:
        """Add the text of ``chunks`` to ``texts``; ``(chunk,)`` for the first chunk that is
        not an object (the text of those before it added), else ``None``."""
        for chunk in chunks:
            if type(chunk) is _Run:  # text chunks alike but for their text: the same fields, each its text
                self._fields(chunk.chunk)
                self._finish(chunk.chunk["choices"][0])  # its refusal and tool calls are empty
                texts.extend([text for text in chunk.texts if text])
                continue
            if not isinstance(chunk, dict):
                return (chunk,)
            self._fields(chunk)
            choices = chunk.get("choices")
            for choice in choices if isinstance(choices, list) else ():
                if not isinstance(choice, dict):
                    continue
                self._finish(choice)
                delta = choice.get("delta")
                if isinstance(delta, dict):
                    self._delta(delta, texts)
        return None

    def _fields(self, chunk: dict) -> None:
        """The chunk's model and usage, when it says them."""
        model = chunk.get("model")
        if model and isinstance(model, str):
            self.model = model
        usage = chunk.get("usage")
        if usage is not None:
            self.usage = _usage_dict(usage) or self.usage

    def _finish(self, choice: dict) -> None:
        finish = choice.get("finish_reason")
        if finish and isinstance(finish, str):
            self.finish = finish

    def _delta(self, delta: dict, texts: list[str]) -> None:
        for key in ("content", "refusal"):
            text = delta.get(key)
            if text and isinstance(text, str):
                texts.append(text)
        fragments = delta.get("tool_calls")
        for fragment in fragments if isinstance(fragments, list) else ():
            self.calls.add(fragment)


class _Events:
    """Server-sent events from bytes, as the ``openai`` client's decoder reads them (lines ended
    by CR, LF or CRLF; ``event``, ``data``, ``id``, ``retry`` fields; an event at each blank
    line), at a fraction of its cost for the usual event, one ``data: ...`` line: ``feed`` takes
    every piece of the body one read brought and returns the complete events among them, a data
    string each (``(event, data)`` for an event with a name). An incomplete event at the end of
    the body is dropped, as by the client's decoder."""

    def __init__(self) -> None:
        self.rest = b""  # the start of an incomplete event
        self.cr = b""  # a CR ending a piece: the first half of a CRLF, maybe
        self.event: str | None = None
        self.data: list[str] = []
        self.last_id: str | None = None
        self.retry: int | None = None

    def feed(self, pieces: list[bytes]) -> list:
        raw = self.cr + b"".join(pieces) if len(pieces) > 1 or self.cr else pieces[0]
        if b"\r" in raw:
            if raw.endswith(b"\r"):
                raw, self.cr = raw[:-1], b"\r"
            else:
                self.cr = b""
            raw = raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        blocks = (self.rest + raw if self.rest else raw).split(b"\n\n")
        self.rest = blocks.pop()
        events: list = []
        for block in blocks:
            if block[:6] == b"data: " and b"\n" not in block and self.last_id is None:
                events.append(block[6:].decode("utf-8"))
            else:
                for line in block.split(b"\n"):
                    self._line(line.decode("utf-8"), events)
                self._line("", events)
        return events

    def _line(self, line: str, events: list) -> None:
        # openai's SSEDecoder.decode, which follows the specification's event stream interpretation.
        if not line:
            if self.event or self.data or self.last_id or self.retry is not None:
                data = "\n".join(self.data)
                events.append((self.event, data) if self.event else data)
                self.event, self.data, self.retry = None, [], None
            return
        if line.startswith(":"):
            return
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "event":
            self.event = value or None
        elif name == "data":
            self.data.append(value)
        elif name == "id":
            if "\0" not in value:
                self.last_id = value
        elif name == "retry":
            with contextlib.suppress(TypeError, ValueError):
                self.retry = int(value)


# json.loads' own scanner, called without its wrappers: a stream decodes a chunk per token.
_scan_json = json.scanner.make_scanner(json.JSONDecoder())


def _json_value(data: str) -> Any:
    """``json.loads(data)``, a third quicker for the usual text, one JSON value and nothing
    around it; any other (whitespace around it, more after it, invalid) is read by
    ``json.loads`` itself, which reads or refuses it as always."""
    try:
        value, end = _scan_json(data, 0)
    except (StopIteration, ValueError):
        return json.loads(data)
    return value if end == len(data) else json.loads(data)


_scan_string = json.decoder.scanstring  # json.loads' reader of a string (strict, as json.loads)
_SCALARS = (str, int, float, bool, type(None))


class _Run:
    """Text chunks that came one after the other, each ``chunk`` (a ``_TextChunks`` kept
    chunk) but for its ``content``: their contents, in order. ``ChunkLists`` lists one run
    instead of a dict per chunk; ``_StreamRead`` reads it as it reads those chunks."""

    __slots__ = ("chunk", "texts")

    def __init__(self, chunk: dict, texts: list[str]):
        self.chunk, self.texts = chunk, texts


class _TextChunks:
    """A stream's text chunks read by their text alone. A model's text chunks differ only by
    their text: ``{"id": ..., "choices": [{"index": 0, "delta": {"content": "word"}, ...}]}``
    with the same bytes around it each time. Once a chunk of that shape was read whole (a
    single choice whose delta has a ``content`` string, no ``refusal``, no ``tool_calls``, no
    ``error``, every other value a string, number, boolean or null), the text before and after
    its ``content`` string is kept (``chunk``: what it decoded to); a later chunk with exactly
    that text around one JSON string is that chunk with another ``content``, so only the string
    is read (``json``'s own string reader, which reads or refuses it as ``json.loads`` does):
    ``text``. Any other text is read whole by ``read`` (``_json_value``). Where the string is
    in the text is checked once per shape, by reading the chunk again with another text there
    (``json.loads``): it must change that ``content`` and nothing else. A stream whose chunks
    differ elsewhere too (a per-chunk random field) stops looking after ``learn_limit`` shapes."""

    learn_limit = 4

    def __init__(self) -> None:
        self.prefix: str | None = None  # the kept text up to the content string's opening quote
        self.suffix = ""  # the kept text after its closing quote
        self.chunk: dict | None = None
        self.learnt = 0

    def text(self, data: str) -> str | None:
        """The ``content`` of ``data`` when it is the kept chunk but for it; else ``None``."""
        prefix = self.prefix
        if prefix is not None and data.startswith(prefix) and data.endswith(self.suffix):
            try:
                text, end = _scan_string(data, len(prefix))
            except ValueError:  # not one valid string there: read whole (and refused as json.loads does)
                return None
            if end == len(data) - len(self.suffix):
                return text
        return None

    def read(self, data: str) -> Any:
        """``data`` decoded (``_json_value``); kept as the shape of the chunks to come when it is one."""
        decoded = _json_value(data)
        if self.learnt < self.learn_limit:
            self._learn(data, decoded)
        return decoded

    @staticmethod
    def with_text(chunk: dict, text: str) -> dict:
        """``chunk`` (a kept one) with ``content`` ``text``: what ``json.loads`` reads of a chunk
        that ``text`` returns ``text`` for (new dicts and list)."""
        choice = chunk["choices"][0]
        return {**chunk, "choices": [{**choice, "delta": {**choice["delta"], "content": text}}]}

    def _learn(self, data: str, decoded: Any) -> None:
        parts = _text_chunk_parts(decoded)
        span = _content_span(data) if parts is not None else None
        if span is None:
            return
        (start, end), delta = span, parts[2]
        kept = self.with_text(decoded, delta["content"])  # a copy of its own
        try:
            if _scan_string(data, start) != (delta["content"], end):
                return
            # The same text with another string there: only this chunk's content may change.
            other = delta["content"] + "~"
            if json.loads(data[:start] + json.dumps(other)[1:] + data[end:]) != self.with_text(kept, other):
                return
        except ValueError:
            return
        self.prefix, self.suffix, self.chunk = data[:start], data[end:], kept
        self.learnt += 1


def _text_chunk_parts(decoded: Any) -> tuple[dict, dict, dict] | None:
    """(the chunk, its choice, the choice's delta) of a chunk whose one choice's delta has a
    ``content`` string and no ``refusal`` nor ``tool_calls``, without an ``error``, every other
    value in them a string, number, boolean or null; else ``None``."""
    choices = decoded.get("choices") if isinstance(decoded, dict) else None
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return None
    choice = choices[0]
    delta = choice.get("delta")
    if not isinstance(delta, dict) or not isinstance(delta.get("content"), str):
        return None
    if decoded.get("error") or delta.get("refusal") or delta.get("tool_calls"):
        return None
    for values, skip in ((decoded, "choices"), (choice, "delta"), (delta, "content")):
        if not all(isinstance(value, _SCALARS) for key, value in values.items() if key != skip):
            return None
    return decoded, choice, delta


def _content_span(data: str) -> tuple[int, int] | None:
    """Where the string after the last ``"content":`` key of ``data`` is: (the position after its
    opening quote, the position after its closing quote); ``None`` when there is none."""
    position = data.rfind('"content"') + len('"content"')
    if position < len('"content"'):
        return None
    for expected in (":", '"'):
        while data[position:position + 1] in (" ", "\t", "\n", "\r"):
            position += 1
        if data[position:position + 1] != expected:
            return None
        position += 1
    try:
        return position, _scan_string(data, position)[1]
    except ValueError:
        return None


class ChunkLists(openai.AsyncStream[object]):
    """A chat completions stream read a list of chunks (their decoded JSON; a run of text chunks
    alike but for their text as one ``_Run``, ``_TextChunks``) at a time: every
    event the model's socket brought since the list before (one when the model writes slower
    than it is read, as a remote model does; many when a local model writes faster than a busy
    worker gets to them). A worker relaying many answers then does per list, not per token,
    what each piece costs up to the socket (``ChatModel.stream`` joins a list's text into one
    piece). The body is read by a task of its own (``_Reader``), which waits for the socket
    while the answer's own task relays what came. Read as the ``openai`` client's
    ``AsyncStream`` reads an answer: the same events, ``[DONE]`` ending it, a chunk with an
    ``error`` raised as ``openai.APIError``, the client's errors for a timeout or a lost
    connection, the connection kept for the next request."""

    async def __stream__(self) -> AsyncIterator[list]:  # type: ignore[override]
        response = self.response
        events = _Events()
        texts = _TextChunks()
        reader = _Reader(_body_pieces(response))
        try:
            while True:
                pieces, end = await reader.take()
                if pieces:
                    chunks, done, error = self._chunks(events.feed(pieces), texts)
                    if chunks:
                        if reader.eager and _has_words(chunks):
                            reader.eager = False  # from now on, what comes meanwhile is read as one list
                        yield chunks
                    if error is not None:
                        raise error
                    if done:  # the rest of the body is read (the connection is reused), 0.1 s at most
                        await reader.finish(0.1)
                        return
                if end is True:
                    return
                if end is not None:
                    raise end
        except _http.TimeoutException as exc:
            exc.request = response.request  # as aiter_bytes names it
            raise openai.APITimeoutError(request=response.request) from exc
        except (_http.RequestError, ssl.SSLError, anyio.EndOfStream) as exc:
            if isinstance(exc, _http.RequestError):
                exc.request = response.request
            raise openai.APIConnectionError(request=response.request) from exc
        finally:
            await reader.finish(0)
            await response.aclose()

    def _chunks(self, events: list, texts: _TextChunks | None = None) -> tuple[list, bool, BaseException | None]:
        """The chunks of ``events``; whether ``[DONE]`` was among them; the error of a chunk
        that could not be read (the chunks before it are read first, as by the client).
        ``texts``: the stream's reader of its text chunks (``_TextChunks``): the chunks it
        reads by their text alone are listed as ``_Run`` objects, one per run of them."""
        chunks: list = []
        for item in events:
            data = item if isinstance(item, str) else item[1]
            if data.startswith("[DONE]"):
                return chunks, True, None
            text = texts.text(data) if texts is not None and isinstance(item, str) else None
            if text is not None:  # the kept chunk with another text: a _Run's
                last = chunks[-1] if chunks else None
                if type(last) is _Run and last.chunk is texts.chunk:
                    last.texts.append(text)
                else:
                    chunks.append(_Run(texts.chunk, [text]))
                continue
            try:
                chunks.append(self._chunk(item, data, texts))
            except Exception as exc:
                return chunks, False, exc
        return chunks, False, None

    def _chunk(self, item: Any, data: str, texts: _TextChunks | None = None) -> Any:
        # An event without a name (a str): the chat completions' chunks, read by ``texts``.
        decoded = texts.read(data) if texts is not None and isinstance(item, str) else _json_value(data)
        event = None if isinstance(item, str) else item[0]
        if event and event.startswith("thread."):  # the Assistants' events, as the client yields them
            if event == "error" and isinstance(decoded, dict) and decoded.get("error"):
                self._raise(decoded)
            return {"data": decoded, "event": event}
        if isinstance(decoded, dict) and decoded.get("error"):
            self._raise(decoded)
        return decoded

    def _raise(self, decoded: dict) -> None:
        error = decoded.get("error")
        message = error.get("message") if isinstance(error, dict) else None
        if not message or not isinstance(message, str):
            message = "An error occurred during streaming"
        raise openai.APIError(message=message, request=self.response.request, body=error)

    async def close(self) -> None:
        await self._iterator.aclose()  # its reader stopped, then the response closed
        await self.response.aclose()


def _body_pieces(response: Any) -> AsyncIterator[bytes]:
    """The pieces of a response's body as the transport reads them: its own stream when the
    body has no ``Content-Encoding`` (``aiter_bytes``' decoder and chunker would hand each piece
    on unchanged, through two more generators: 0.6 µs a token), else ``aiter_bytes`` (gzip...).
    Closed with the response (``ChunkLists.__stream__``), as ``aiter_bytes`` closes it."""
    if "content-encoding" in response.headers:
        return response.aiter_bytes()
    response.is_stream_consumed = True  # as aiter_bytes marks it: not to be read twice
    return response.stream.__aiter__()


def _has_words(chunks: list) -> bool:
    """Whether a list of chunks has a choice whose delta carries something (text, a tool call)."""
    for chunk in chunks:
        if type(chunk) is _Run:
            if any(chunk.texts):
                return True
            continue
        choices = chunk.get("choices") if isinstance(chunk, dict) else None
        for choice in choices if isinstance(choices, list) else ():
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if isinstance(delta, dict) and any(delta.get(k) for k in ("content", "refusal", "tool_calls")):
                return True
    return False


class _Reader:
    """Reads a body's pieces in a task of its own: ``take`` returns every piece read since the
    last call (waiting for one when there is none), and how the body ended (``True``, or the
    exception that ended it) once all its pieces are taken. While ``eager`` (until the answer's
    first words are out), a piece is handed over before the next is read."""

    def __init__(self, reads: AsyncIterator[bytes]):
        self.pieces: list[bytes] = []
        self.end: bool | BaseException | None = None
        self.waiter: asyncio.Future | None = None
        self.eager = True  # hand each piece over as it comes (until the stream says otherwise)
        self.task = asyncio.ensure_future(self._run(reads))

    async def _run(self, reads: AsyncIterator[bytes]) -> None:
        try:
            async for piece in reads:
                self.pieces.append(piece)
                if self.waiter is not None and not self.waiter.done():
                    self.waiter.set_result(None)
                    if self.eager:
                        # Until the answer's first words: its task goes first, and they leave
                        # before more is read (a model that wrote its whole answer at once).
                        await asyncio.sleep(0)
            self.end = True
        except Exception as exc:
            self.end = exc
        finally:
            if self.end is None:  # cancelled
                self.end = asyncio.CancelledError()
            if self.waiter is not None and not self.waiter.done():
                self.waiter.set_result(None)

    async def take(self) -> tuple[list[bytes], bool | BaseException | None]:
        if not self.pieces and self.end is None:
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        pieces, self.pieces = self.pieces, []
        return pieces, self.end

    async def finish(self, seconds: float) -> None:
        """Wait ``seconds`` at most for the body to end, then stop reading it."""
        task = self.task
        if not task.done() and seconds:
            await asyncio.wait((task,), timeout=seconds)
        if not task.done():
            task.cancel()
            await asyncio.wait((task,))


def check_options(component: str, options: dict[str, Any], accepted: tuple[str, ...]) -> None:
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ImproperlyConfigured(
            f"{component} got unknown option(s) {unknown}; accepted: {sorted(accepted)}."
        )


# Keys a helper component inherits from the profile's "openai" block: the server and the model.
INHERITED_OPTIONS = (*CONNECTION_OPTIONS, "model", "max_tokens_param")
HELPER_OPTIONS = (*CONNECTION_OPTIONS, "model", "temperature", "max_tokens", "max_tokens_param", "extra_body")


def chat_model_from_options(profile: Profile, options: dict[str, Any], *, max_tokens: int,
                            temperature: float | None = 0.0) -> ChatModel:
    """The ``ChatModel`` of a helper component (rewrite, multi_query, summary...).

    Takes the ``HELPER_OPTIONS`` keys out of ``options`` (the component's own options, changed
    in place so the component sees only the rest). Whatever the component does not set comes
    from the profile's ``options["openai"]`` (server and model), then from the defaults:
    a deterministic ``temperature`` of 0 and the component's ``max_tokens``.
    """
    shared = profile.options_for("openai")
    own = {k: options.pop(k) for k in HELPER_OPTIONS if k in options}
    merged = {k: shared[k] for k in INHERITED_OPTIONS if k in shared}
    merged.update(own)
    return ChatModel(
        OpenAIConnection.from_options(merged),
        model=merged.get("model") or DEFAULT_CHAT_MODEL,
        temperature=merged.get("temperature", temperature),
        max_tokens=merged.get("max_tokens", max_tokens),
        max_tokens_param=merged.get("max_tokens_param", "max_tokens"),
        extra_body=merged.get("extra_body"),
    )


def record_call(turn: TurnContext, by: str, response: LLMResponse | None, started: float, error: str = "") -> None:
    """Note a helper model call (not the answer) in the trace: who, model, time, usage."""
    entry: dict[str, Any] = {"by": by, "ms": round((time.perf_counter() - started) * 1000, 3)}
    if response is not None:
        entry["model"] = response.model
        if response.usage:
            entry.update(prompt_tokens=response.usage.prompt_tokens,
                         completion_tokens=response.usage.completion_tokens)
    if error:
        entry["error"] = error
    turn.trace.setdefault("llm_calls", []).append(entry)
