"""Streamed chunks are read from their JSON (not typed models): every field the backend used
to read still counts, and chunks of another shape are skipped or refused, never a crash.
Served by a real loopback HTTP server writing exactly the given server-sent events."""

import asyncio
import contextlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from django_ragchat.backends.openai import ChatModel, OpenAIConnection
from django_ragchat.exceptions import LLMError


@contextlib.contextmanager
def sse_server(*chunks):
    """A server answering every POST with ``chunks`` as server-sent events, then [DONE]."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for chunk in chunks:
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def stream(base_url):
    model = ChatModel(OpenAIConnection.from_options({"base_url": base_url, "max_retries": 0}), model="m")

    async def collect():
        return [piece async for piece in model.stream([{"role": "user", "content": "hi"}])]

    return asyncio.run(collect())


def test_text_refusal_usage_model_and_finish_reason_are_read_from_the_chunks():
    chunks = [
        {"model": "served-model", "choices": [{"index": 0, "delta": {"content": "Hel"}}]},
        {"choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {"refusal": " no"}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
        {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}},
    ]
    with sse_server(*chunks) as url:
        pieces = stream(url)
    assert [p.text for p in pieces[:-1]] == ["Hel", "lo", " no"]
    last = pieces[-1]
    assert (last.model, last.finish_reason) == ("served-model", "length")
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (7, 3)


def test_choices_and_deltas_of_another_shape_are_skipped():
    chunks = [
        {"choices": ["not a choice", {"delta": "not a delta"}, {"delta": {"content": 5}}]},
        {"choices": "not a list", "usage": "not usage", "model": 3},
        {"choices": [{"delta": {"content": "ok"}}]},
    ]
    with sse_server(*chunks) as url:
        pieces = stream(url)
    assert [p.text for p in pieces] == ["ok", ""]
    assert pieces[-1].model == "m" and pieces[-1].usage is None and pieces[-1].finish_reason == "stop"


def test_a_chunk_that_is_not_an_object_is_a_bad_response():
    with sse_server({"choices": [{"delta": {"content": "a"}}]}, ["not", "an", "object"]) as url, \
            pytest.raises(LLMError) as raised:
        stream(url)
    assert raised.value.code == "bad_response"
