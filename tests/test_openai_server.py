"""The fake OpenAI server, driven by the real ``openai`` client over real HTTP.

No Django needed: run with ``pytest tests/test_openai_server.py -p no:django``.
"""

from __future__ import annotations

import base64
import json
import math
import signal
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import httpx2
import openai
import pytest

from django_ragchat.testing.openai_server import FakeOpenAIServer, embed

USER = [{"role": "user", "content": "What does the Aurora X2 cost?"}]


@pytest.fixture
def client(openai_server):
    # max_retries=0 unless a test wants retries: each request is then exactly one HTTP call.
    with openai.OpenAI(base_url=openai_server.base_url, api_key="test-key", max_retries=0) as c:
        yield c


def chat(client, messages=USER, **kwargs):
    return client.chat.completions.create(model="gpt-4o-mini", messages=messages, **kwargs)


def cosine(a, b):
    return sum(x * y for x, y in zip(a, b))


# -- endpoints -----------------------------------------------------------------


def test_models_list(client):
    ids = [m.id for m in client.models.list()]
    assert "gpt-4o-mini" in ids and "text-embedding-3-small" in ids
    assert client.models.retrieve("gpt-4o").id == "gpt-4o"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_embeddings_default_request_is_base64_and_decoded_by_client(client, openai_server):
    result = client.embeddings.create(model="text-embedding-3-small", input="hello world")
    # The client asks for base64 unless told otherwise, then decodes it itself.
    assert openai_server.last("embeddings").json["encoding_format"] == "base64"
    vec = result.data[0].embedding
    assert len(vec) == 64
    assert math.isclose(math.sqrt(sum(x * x for x in vec)), 1.0, rel_tol=1e-5)
    assert all(math.isclose(a, b, abs_tol=1e-6) for a, b in zip(vec, embed("hello world")))
    assert result.usage.prompt_tokens == 2 and result.usage.total_tokens == 2


def test_embeddings_float_list_and_dimensions(client):
    result = client.embeddings.create(
        model="text-embedding-3-small", input=["alpha beta", "gamma"], dimensions=16, encoding_format="float"
    )
    assert [d.index for d in result.data] == [0, 1]
    assert all(len(d.embedding) == 16 for d in result.data)
    assert result.data[0].embedding == embed("alpha beta", 16)
    assert result.usage.prompt_tokens == 3


def test_embeddings_explicit_base64_is_little_endian_float32(client):
    result = client.embeddings.create(model="m", input="hello", encoding_format="base64", dimensions=8)
    raw = base64.b64decode(result.data[0].embedding)  # left encoded when explicitly requested
    assert len(raw) == 8 * 4
    assert all(math.isclose(a, b, abs_tol=1e-6) for a, b in zip(struct.unpack("<8f", raw), embed("hello", 8)))


def test_embeddings_are_deterministic_and_word_overlap_means_similar(client):
    texts = ["Aurora X2 price list", "Aurora X2 price", "garden hose for sale"]
    first, again = (client.embeddings.create(model="m", input=texts, encoding_format="float") for _ in range(2))
    vecs = [d.embedding for d in first.data]
    assert vecs == [d.embedding for d in again.data]
    assert cosine(vecs[0], vecs[1]) > cosine(vecs[0], vecs[2]) + 0.3


def test_chat_default_reply_and_word_usage(client, openai_server):
    result = chat(client)
    assert result.choices[0].message.content == "Answer to: What does the Aurora X2 cost?"
    assert result.choices[0].finish_reason == "stop"
    assert (result.usage.prompt_tokens, result.usage.completion_tokens, result.usage.total_tokens) == (6, 8, 14)
    req = openai_server.last("chat/completions")
    assert req.method == "POST" and req.path == "/v1/chat/completions"
    assert req.json["messages"] == USER
    assert req.headers["authorization"] == "Bearer test-key"


def test_chat_stream_reassembles_reply_and_reports_usage(client, openai_server):
    openai_server.script("The Aurora X2 costs  1299 EUR.\nShipping is free.")
    chunks = list(chat(client, stream=True, stream_options={"include_usage": True}))
    deltas = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert deltas[:3] == ["The ", "Aurora ", "X2 "]  # one chunk per word, whitespace kept
    assert "".join(deltas) == "The Aurora X2 costs  1299 EUR.\nShipping is free."
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 9
    assert chunks[-1].usage.prompt_tokens == 6


def test_chat_stream_without_include_usage_has_no_usage(client):
    chunks = list(chat(client, stream=True))
    assert all(c.usage is None for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Answer to: What does the Aurora X2 cost?"


def test_max_tokens_truncates_with_finish_reason_length(client):
    result = chat(client, max_tokens=2)
    assert result.choices[0].message.content == "Answer to: "
    assert result.choices[0].finish_reason == "length"
    assert chat(client, max_completion_tokens=3).usage.completion_tokens == 3


# -- scripting -----------------------------------------------------------------


def test_script_queue_then_default(client, openai_server):
    openai_server.script("first", lambda req: f"{len(req['messages'])} messages")
    assert chat(client).choices[0].message.content == "first"
    assert chat(client).choices[0].message.content == "1 messages"
    assert chat(client).choices[0].message.content.startswith("Answer to: ")


def test_when_rules_win_over_script(client, openai_server):
    # Typical RAG flow: a query-rewrite call matched by a rule, then the scripted answer.
    openai_server.when(contains="How much is it?", reply="Aurora X2 price")
    openai_server.script("It costs 1299 EUR.")
    history = [
        {"role": "user", "content": "Tell me about the Aurora X2."},
        {"role": "assistant", "content": "A camera."},
        {"role": "user", "content": "How much is it?"},
    ]
    assert chat(client, history).choices[0].message.content == "Aurora X2 price"
    assert chat(client, [{"role": "user", "content": "Aurora X2 price"}]).choices[0].message.content == (
        "It costs 1299 EUR."
    )


def test_when_any_message_and_times(client, openai_server):
    openai_server.when(contains="Rewrite the question", reply="rewritten", any_message=True, times=1)
    openai_server.when(contains="Rewrite the question", reply=lambda req: "only last user message")
    messages = [{"role": "system", "content": "Rewrite the question."}, {"role": "user", "content": "hi"}]
    assert chat(client, messages).choices[0].message.content == "rewritten"
    assert chat(client, messages).choices[0].message.content == "Answer to: hi"  # rule used up
    assert chat(client, [{"role": "user", "content": "Rewrite the question x"}]).choices[0].message.content == (
        "only last user message"
    )


def test_reply_from_content_parts(client):
    messages = [{"role": "user", "content": [{"type": "text", "text": "parts work"}]}]
    assert chat(client, messages).choices[0].message.content == "Answer to: parts work"


def test_records_count_and_reset(client, openai_server):
    chat(client)
    client.embeddings.create(model="m", input="x")
    client.embeddings.create(model="m", input="y")
    assert openai_server.count() == 3
    assert openai_server.count("/v1/embeddings") == openai_server.count("embeddings") == 2
    method, path, body, headers = openai_server.requests[0]  # plain tuples too
    assert (method, path, body["model"]) == ("POST", "/v1/chat/completions", "gpt-4o-mini")
    openai_server.script("unused")
    openai_server.fail_next("server_error")
    openai_server.token_delay = 5
    openai_server.reset()
    assert openai_server.requests == [] and openai_server.token_delay == 0
    assert chat(client).choices[0].message.content.startswith("Answer to: ")


# -- faults ----------------------------------------------------------------------


def test_rate_limit_raises_after_client_retries(openai_server):
    openai_server.fail_next("rate_limit", times=3, retry_after=0.01)
    with openai.OpenAI(base_url=openai_server.base_url, api_key="k", max_retries=2) as c:
        with pytest.raises(openai.RateLimitError) as info:
            chat(c)
    assert openai_server.count("chat/completions") == 3  # 1 try + 2 retries
    assert info.value.status_code == 429 and info.value.code == "rate_limit_exceeded"
    assert info.value.response.headers["retry-after"] == "1"
    assert info.value.response.headers["retry-after-ms"] == "10"


def test_rate_limit_once_is_retried_transparently(openai_server):
    openai_server.fail_next("rate_limit")
    with openai.OpenAI(base_url=openai_server.base_url, api_key="k", max_retries=1) as c:
        assert chat(c).choices[0].message.content.startswith("Answer to: ")
    assert openai_server.count() == 2


def test_server_error(client, openai_server):
    openai_server.fail_next("server_error")
    with pytest.raises(openai.InternalServerError) as info:
        chat(client)
    assert info.value.status_code == 500
    openai_server.fail_next("server_error", status=503)
    with pytest.raises(openai.InternalServerError) as info:
        chat(client)
    assert info.value.status_code == 503


def test_latency_beyond_client_timeout(openai_server):
    openai_server.fail_next("latency", seconds=1.0)
    with openai.OpenAI(base_url=openai_server.base_url, api_key="k", max_retries=0, timeout=0.2) as c:
        started = time.monotonic()
        with pytest.raises(openai.APITimeoutError):
            chat(c)
        assert time.monotonic() - started < 0.95  # well before the server's 1.0 s answer


def test_timed_out_request_does_not_consume_later_replies(openai_server):
    openai_server.fail_next("latency", seconds=0.2)
    openai_server.script("for the retry", "for the next call")
    with openai.OpenAI(base_url=openai_server.base_url, api_key="k", max_retries=0, timeout=0.1) as c:
        with pytest.raises(openai.APITimeoutError):
            chat(c)
        assert chat(c).choices[0].message.content == "for the retry"
        time.sleep(0.2)  # the abandoned first attempt wakes up meanwhile
        assert chat(c).choices[0].message.content == "for the next call"


def test_latency_within_timeout_answers_normally(client, openai_server):
    openai_server.fail_next("latency", seconds=0.2)
    started = time.monotonic()
    assert chat(client).choices[0].message.content.startswith("Answer to: ")
    assert time.monotonic() - started >= 0.2


def test_cut_stream_raises_connection_error_after_partial_tokens(client, openai_server):
    openai_server.fail_next("cut_stream", after_tokens=2)
    received = []
    with pytest.raises(openai.APIConnectionError) as info:
        for chunk in chat(client, stream=True):
            received.append(chunk.choices[0].delta.content or "")
    assert "".join(received) == "Answer to: "  # the first two tokens did arrive
    # httpx sees the chunked body end early; the client wraps that.
    assert isinstance(info.value.__cause__, httpx2.RemoteProtocolError)


def test_cut_stream_on_plain_request_drops_connection(client, openai_server):
    openai_server.fail_next("cut_stream")
    with pytest.raises(openai.APIConnectionError):
        chat(client)


def test_malformed_json(client, openai_server):
    openai_server.fail_next("malformed_json", times=2)
    with pytest.raises(json.JSONDecodeError):
        chat(client)
    with pytest.raises(json.JSONDecodeError):
        list(chat(client, stream=True))
    openai_server.fail_next("malformed_json")
    with pytest.raises(json.JSONDecodeError):
        client.embeddings.create(model="m", input="x")


def test_faults_apply_to_any_endpoint_unless_restricted(client, openai_server):
    openai_server.fail_next("cut_stream")
    with pytest.raises(openai.APIConnectionError):
        client.models.list()
    openai_server.fail_next("malformed_json")
    with pytest.raises(json.JSONDecodeError):
        client.models.list()
    openai_server.fail_next("cut_stream")
    openai_server.script("kept for the retry")
    with pytest.raises(openai.APIConnectionError):
        chat(client)
    assert chat(client).choices[0].message.content == "kept for the retry"  # a dropped request uses no script


def test_fault_restricted_to_path(client, openai_server):
    openai_server.fail_next("server_error", path="chat/completions")
    assert len(client.embeddings.create(model="m", input="x").data) == 1  # unaffected
    with pytest.raises(openai.InternalServerError):
        chat(client)
    chat(client)  # used up


def test_unknown_fault_kind_rejected(openai_server):
    with pytest.raises(ValueError):
        openai_server.fail_next("explode")


# -- async client ------------------------------------------------------------------


@pytest.mark.asyncio
async def test_async_client_chat_stream_embeddings_and_faults(openai_server):
    openai_server.script("async works", "streamed async reply")
    async with openai.AsyncOpenAI(base_url=openai_server.base_url, api_key="k", max_retries=0) as c:
        result = await c.chat.completions.create(model="m", messages=USER)
        assert result.choices[0].message.content == "async works"
        stream = await c.chat.completions.create(
            model="m", messages=USER, stream=True, stream_options={"include_usage": True}
        )
        parts = [ch.choices[0].delta.content or "" async for ch in stream if ch.choices]
        assert "".join(parts) == "streamed async reply"
        emb = await c.embeddings.create(model="m", input=["a", "b"])
        assert len(emb.data) == 2 and len(emb.data[0].embedding) == 64
        openai_server.fail_next("rate_limit")
        with pytest.raises(openai.RateLimitError):
            await c.chat.completions.create(model="m", messages=USER)
        openai_server.fail_next("cut_stream", after_tokens=1)
        stream = await c.chat.completions.create(model="m", messages=USER, stream=True)
        with pytest.raises(openai.APIConnectionError):
            async for _ in stream:
                pass


# -- concurrency, streaming timing, lifecycle ----------------------------------------


def test_concurrent_streams_are_served_in_parallel(openai_server):
    openai_server.token_delay = 0.05
    openai_server.script(*[f"reply {i} with five words" for i in range(8)])
    results = []
    spans = []  # (first piece, last piece) per stream, as the client saw them
    barrier = threading.Barrier(8)

    def worker():
        with openai.OpenAI(base_url=openai_server.base_url, api_key="k", max_retries=0) as c:
            barrier.wait()
            pieces, first = [], None
            for ch in chat(c, stream=True):
                first = first if first is not None else time.monotonic()
                pieces.append(ch.choices[0].delta.content or "")
            spans.append((first, time.monotonic()))
            results.append("".join(pieces))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Served one after another, no two streams would be open at once; wall-clock limits flake
    # on a loaded machine, so count the overlap instead.
    most_open = max(sum(1 for a, b in spans if a <= start <= b) for start, _ in spans)
    assert most_open >= 2
    assert sorted(results) == sorted(f"reply {i} with five words" for i in range(8))


def test_stream_events_are_flushed_one_by_one(client, openai_server):
    # The server holds the stream after the first token: the client can only read that token
    # if it was sent on its own, not held back until the 8-token reply is done.
    openai_server.hold_streams(after_tokens=1)
    try:
        stream = chat(client, stream=True)
        first_content = next(ch for ch in stream if ch.choices[0].delta.content)
        assert first_content.choices[0].delta.content == "Answer "
    finally:
        openai_server.release_streams()
    stream.close()


def test_start_stop_is_fast_and_leaks_no_threads():
    before = set(threading.enumerate())
    server = FakeOpenAIServer(token_delay=0.5).start()
    c = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0, timeout=5)
    assert c.models.list().data  # leaves an idle keep-alive connection open
    server.fail_next("latency", seconds=30)
    errors = []

    def in_flight():
        try:
            chat(c)
        except openai.APIError as exc:
            errors.append(exc)

    blocked = threading.Thread(target=in_flight)
    blocked.start()
    while server.count() < 2:
        time.sleep(0.01)
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 0.5
    blocked.join(2)
    assert [type(e) for e in errors] == [openai.APIConnectionError]  # the in-flight request was dropped
    c.close()
    assert set(threading.enumerate()) <= before
    server.stop()  # idempotent


def test_context_manager_and_base_url():
    with FakeOpenAIServer() as server:
        assert server.base_url == f"http://127.0.0.1:{server.port}/v1" and server.port
        with urllib.request.urlopen(server.base_url + "/models", timeout=2) as response:
            assert json.load(response)["object"] == "list"


def test_runs_standalone():
    command = [sys.executable, "-m", "django_ragchat.testing.openai_server", "--port", "0"]
    # SIGINT at its default in the child, whatever this process inherited (nohup, `&`: ignored,
    # and an ignored signal stays ignored across exec).
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1],
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) as proc:
        try:
            base_url = proc.stdout.readline().split(" on ")[1].split()[0]
            with openai.OpenAI(base_url=base_url, api_key="k", max_retries=0) as c:
                assert chat(c).choices[0].message.content == "Answer to: What does the Aurora X2 cost?"
            proc.send_signal(signal.SIGINT)  # Ctrl+C stops it cleanly
            assert proc.wait(5) == 0
        finally:
            proc.kill()
