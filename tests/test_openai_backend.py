"""The ``openai`` LLM backend and embedder: full turns through the real ``openai`` client over
HTTP to the loopback OpenAI-compatible server, whole and streamed, with every injected fault."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import openai
import pytest
from asgiref.sync import async_to_sync

from django_ragchat.backends.openai import OpenAIConnection
from django_ragchat.checks import check_openai_keys
from django_ragchat.events import Accepted, Completed, Delta, Failed
from django_ragchat.models import Message, TurnTrace
from django_ragchat.profiles import get_profile
from django_ragchat.testing.openai_server import embed
from django_ragchat.turn.context import components_for
from django_ragchat.turn.pipeline import run_turn_sync, stream_turn
from tests.conftest import PRODUCT_DOCS

pytestmark = pytest.mark.django_db

QUESTION = "How much does the Aurora X2 cost?"
# The async client's HTTP library (the ``http_client`` option): every answer, fault and error
# code the same over either.
HTTP_CLIENTS = ["httpx", pytest.param("aiohttp", marks=pytest.mark.skipif(
    find_spec("aiohttp") is None, reason='needs pip install "openai[aiohttp]"'))]
ANSWER = "The Aurora X2 costs $699 with 128 GB of storage [1]."


def openai_profile(server, openai_options=None, **profile):
    """A profile answering and embedding through ``server``; each request is one HTTP call
    (no client retries) unless ``openai_options`` says otherwise."""
    options = {"base_url": server.base_url, "max_retries": 0, "timeout": 5, "embedding_dimensions": 64,
               **(openai_options or {})}
    extra_options = profile.pop("options", {})
    return {"llm": "openai", "embedder": "openai", "options": {"openai": options, **extra_options}, **profile}


def use_openai(override, server, openai_options=None, *, ingest=True, **profile):
    """Make ``profile`` the default profile and (optionally) ingest the product documents with
    its embedder; then forget the ingestion requests, so tests count only the turn's."""
    override(PROFILES={"default": openai_profile(server, openai_options, **profile)})
    if ingest:
        from django_ragchat.ingestion.pipeline import ingest_text

        for source, text in PRODUCT_DOCS.items():
            ingest_text(source, text, content_type="markdown")
    server.reset()


def events_of(conversation, text, *, stream=True):
    """Every event of one turn, consumed the way a transport does."""

    async def collect():
        return [event async for event in stream_turn(conversation, text, stream=stream)]

    return async_to_sync(collect)()


@pytest.fixture
def site(openai_server, ragchat_settings_override):
    use_openai(ragchat_settings_override, openai_server)
    return openai_server


# --- Answers ----------------------------------------------------------------------------------


def test_a_whole_turn_answers_through_the_client_and_records_server_usage(site, conversation):
    site.script(ANSWER)

    result = run_turn_sync(conversation, QUESTION)

    assert result.error is None and result.status == "complete"
    assert result.answer == ANSWER
    [citation] = result.message["citations"]  # [1]: the first passage of the prompt
    assert citation["chunk_id"] == result.message["sources"][0]["chunk_id"]
    # Exactly what the profile implies: the question embedded once, the model asked once.
    assert site.count("embeddings") == 1 and site.count("chat/completions") == 1 and site.count() == 2
    request = site.last("chat/completions").json
    assert request["model"] == "gpt-4o-mini" and not request.get("stream")
    assert request["max_tokens"] == get_profile().max_answer_tokens
    assert request["messages"][0] == {"role": "system", "content": get_profile().system_prompt}
    assert QUESTION in request["messages"][-1]["content"] and "$699" in request["messages"][-1]["content"]
    assert site.last("embeddings").json["dimensions"] == 64
    # The server's own token counts (it counts words) are saved on the message.
    message = Message.objects.get(pk=result.message["id"])
    server_prompt_words = sum(len(m["content"].split()) for m in request["messages"])
    assert (message.prompt_tokens, message.completion_tokens) == (server_prompt_words, len(ANSWER.split()))
    assert result.trace["model"] == "gpt-4o-mini"
    assert result.trace["usage"] == {"prompt_tokens": server_prompt_words, "completion_tokens": len(ANSWER.split())}


@pytest.mark.parametrize("http_client", HTTP_CLIENTS)
def test_a_streamed_turn_sends_deltas_and_records_the_usage_chunk(openai_server, ragchat_settings_override,
                                                                  conversation, http_client):
    site = openai_server
    use_openai(ragchat_settings_override, site, {"http_client": http_client})
    site.script(ANSWER)

    events = events_of(conversation, QUESTION)

    deltas = [e for e in events if isinstance(e, Delta)]
    # The server streams one chunk per word; the chunks one read brings are one delta.
    assert 1 <= len(deltas) <= len(ANSWER.split())
    assert "".join(d.text for d in deltas) == ANSWER
    assert [d.index for d in deltas] == list(range(len(deltas)))
    done = events[-1]
    assert isinstance(done, Completed) and done.message["content"] == ANSWER
    request = site.last("chat/completions").json
    assert request["stream"] is True and request["stream_options"] == {"include_usage": True}
    message = Message.objects.get(pk=done.message["id"])
    assert message.completion_tokens == len(ANSWER.split()) and message.prompt_tokens > 0
    assert site.count("chat/completions") == 1 and site.count("embeddings") == 1


def test_a_reply_cut_at_max_tokens_is_kept_and_the_trace_says_so(openai_server, ragchat_settings_override, conversation):
    use_openai(ragchat_settings_override, openai_server, {"max_tokens": 3})
    openai_server.script(ANSWER)

    result = run_turn_sync(conversation, QUESTION)

    assert result.answer == "The Aurora X2 "
    assert openai_server.last("chat/completions").json["max_tokens"] == 3
    assert "the answer was cut at 3 tokens (max_tokens)" in result.trace["warnings"]


def test_a_client_leaving_mid_stream_keeps_the_partial_answer_as_incomplete(site, conversation):
    site.script(ANSWER)
    # The model holds its stream after two tokens: reading them cannot have waited for the rest.
    site.hold_streams(after_tokens=2)

    async def read_two_deltas():
        received = []
        async with contextlib.aclosing(stream_turn(conversation, QUESTION)) as events:
            async for event in events:
                if isinstance(event, Delta):
                    received.append(event.text)
                    if len("".join(received).split()) == 2:
                        break  # the client went away: the transport closes the stream
        return received

    try:
        received = async_to_sync(read_two_deltas)()
    finally:
        site.release_streams()
    message = Message.objects.get(conversation=conversation, role="assistant")
    assert message.status == Message.Status.INCOMPLETE
    assert message.content == "".join(received) == "The Aurora "


# --- Faults -------------------------------------------------------------------------------------

FAULTS = [
    # (fault, its options, client timeout, expected code, partial answer when streamed)
    ("latency", {"seconds": 2.0}, 0.3, "timeout", ""),
    ("rate_limit", {"retry_after": 2.5}, 5, "rate_limited", ""),
    ("server_error", {"status": 500}, 5, "model_unavailable", ""),
    ("server_error", {"status": 503}, 5, "model_unavailable", ""),
    ("cut_stream", {"after_tokens": 2}, 5, "stream_interrupted", "The Aurora "),
    ("malformed_json", {"after_tokens": 2}, 5, "bad_response", "The Aurora "),
]


@pytest.mark.parametrize("http_client", HTTP_CLIENTS)
@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
@pytest.mark.parametrize("fault,opts,timeout,code,partial", FAULTS, ids=[f"{f[0]}-{f[3]}" for f in FAULTS])
def test_every_model_fault_ends_in_a_clear_error_and_loses_nothing(
    openai_server, ragchat_settings_override, conversation, caplog, stream, fault, opts, timeout, code, partial,
    http_client,
):
    use_openai(ragchat_settings_override, openai_server, {"timeout": timeout, "http_client": http_client})
    openai_server.script(ANSWER)
    openai_server.fail_next(fault, path="chat/completions", **opts)
    if fault == "cut_stream" and not stream:
        code = "model_unavailable"  # nothing was streaming: the server hung up on the request

    with caplog.at_level(logging.WARNING, logger="django_ragchat"):
        events = events_of(conversation, QUESTION, stream=stream)

    assert isinstance(events[0], Accepted)
    error = events[-1]
    assert isinstance(error, Failed), events
    assert error.code == code
    assert error.message and "Error code" not in error.message and "http" not in error.message.lower()
    if code == "rate_limited":
        assert error.retry_after == pytest.approx(opts["retry_after"])
    # The user's message is saved; the assistant's partial answer is kept, marked error.
    user_message = Message.objects.get(pk=events[0].user_message_id)
    assert user_message.content == QUESTION and user_message.status == Message.Status.COMPLETE
    assistant = Message.objects.get(pk=events[0].assistant_message_id)
    assert assistant.status == Message.Status.ERROR
    assert assistant.content == (partial if stream else "")
    assert "".join(e.text for e in events if isinstance(e, Delta)) == assistant.content
    assert assistant.metadata["error"] == {"code": code, "message": error.message}
    assert error.assistant_message["status"] == "error" and error.assistant_message["content"] == assistant.content
    trace = TurnTrace.objects.get(message=assistant).data
    assert trace["error"]["code"] == code
    # The detail (exception, status, cause) reaches the log, not the user.
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name == "django_ragchat.backends.openai")
    assert f"failed with {code}" in logged
    assert openai_server.count("chat/completions") == 1  # max_retries=0: one request, no loop of ours


def test_the_client_retries_rate_limits_itself_and_the_turn_succeeds(openai_server, ragchat_settings_override,
                                                                     conversation):
    use_openai(ragchat_settings_override, openai_server, {"max_retries": 2})
    openai_server.script(ANSWER)
    openai_server.fail_next("rate_limit", times=2, path="chat/completions", retry_after=0.01)

    result = run_turn_sync(conversation, QUESTION, stream=True)

    assert result.error is None and result.answer == ANSWER
    assert openai_server.count("chat/completions") == 3  # two 429s, then the answer


def test_rate_limit_after_the_clients_retries_reports_retry_after(openai_server, ragchat_settings_override,
                                                                   conversation):
    use_openai(ragchat_settings_override, openai_server, {"max_retries": 1})
    openai_server.fail_next("rate_limit", times=2, path="chat/completions", retry_after=0.05)

    result = run_turn_sync(conversation, QUESTION)

    assert result.error.code == "rate_limited" and result.error.retry_after == pytest.approx(0.05)
    assert openai_server.count("chat/completions") == 2


def test_an_embedding_failure_is_a_clear_error_and_the_question_is_kept(site, conversation):
    site.fail_next("server_error", path="embeddings")

    result = run_turn_sync(conversation, QUESTION)

    assert result.error.code == "model_unavailable"
    assert Message.objects.filter(conversation=conversation, role="user", content=QUESTION).exists()
    assert result.status == "error"
    assert site.count("chat/completions") == 0  # nothing to answer with


@pytest.mark.parametrize("http_client", HTTP_CLIENTS)
def test_an_unreachable_server_is_model_unavailable(ragchat_settings_override, conversation, http_client):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ragchat_settings_override(PROFILES={"default": {
        "llm": "openai", "options": {"openai": {"base_url": f"http://127.0.0.1:{port}/v1", "max_retries": 0,
                                                "http_client": http_client}},
        "empty_context": "answer",
    }})

    result = run_turn_sync(conversation, "Hello?")

    assert result.error.code == "model_unavailable" and result.status == "error"


# --- Keys, clients, configuration ---------------------------------------------------------------


def test_the_key_comes_from_the_named_environment_variable_and_is_never_stored(
    openai_server, ragchat_settings_override, conversation, monkeypatch,
):
    monkeypatch.setenv("RAGCHAT_TEST_KEY", "sk-test-secret-123")
    use_openai(ragchat_settings_override, openai_server, {"api_key_env": "RAGCHAT_TEST_KEY",
                                                          "headers": {"X-Tenant": "acme"}})
    openai_server.script(ANSWER)

    run_turn_sync(conversation, QUESTION)

    headers = openai_server.last("chat/completions").headers
    assert headers["authorization"] == "Bearer sk-test-secret-123"
    assert headers["x-tenant"] == "acme"
    assert openai_server.last("embeddings").headers["authorization"] == "Bearer sk-test-secret-123"
    stored = json.dumps([list(Message.objects.values()), list(TurnTrace.objects.values())], default=str)
    assert "sk-test-secret" not in stored


def test_a_missing_key_for_api_openai_com_is_a_warning_and_a_clear_turn_error(
    ragchat_settings_override, conversation, monkeypatch,
):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    ragchat_settings_override(PROFILES={"default": {"llm": "openai", "embedder": "openai"}})

    [warning] = check_openai_keys()
    assert warning.id == "ragchat.W020" and "OPENAI_API_KEY" in warning.msg

    result = run_turn_sync(conversation, QUESTION)  # fails before any network access
    assert result.error.code == "model_unavailable"

    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    assert check_openai_keys() == []


def test_a_local_server_needs_no_key(openai_server, ragchat_settings_override, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    ragchat_settings_override(PROFILES={"default": openai_profile(openai_server)})

    assert check_openai_keys() == []
    assert components_for(get_profile()).embedder.embed(["hello"]).shape == (1, 64)
    assert openai_server.last("embeddings").headers["authorization"] == "Bearer not-needed"


@pytest.mark.parametrize("http_client", HTTP_CLIENTS)
def test_clients_are_pooled_per_event_loop_and_closed_with_it(openai_server, http_client):
    connection = OpenAIConnection(base_url=openai_server.base_url, max_retries=0, http_client=http_client)

    async def two_calls():
        first = await connection.async_client()
        await first.models.list()
        second = await connection.async_client()
        return first, second

    loop = asyncio.new_event_loop()
    try:
        first, second = loop.run_until_complete(two_calls())
        assert first is second and not first.is_closed()
        library = openai.DefaultAioHttpClient if http_client == "aiohttp" else openai.DefaultAsyncHttpxClient
        assert isinstance(first._client, library)  # the HTTP library the option names
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())  # what asyncio.run does on the way out
        loop.close()
    assert first.is_closed()
    third, _ = asyncio.run(two_calls())  # another loop: its own client
    assert third is not first and third.is_closed()
    assert connection.sync_client() is connection.sync_client()


def test_invalid_options_fail_the_system_check(ragchat_settings_override):
    from django_ragchat.checks import check_profiles

    ragchat_settings_override(PROFILES={
        "typo": {"llm": "openai", "options": {"openai": {"modle": "gpt-4o"}}},
        "timeout": {"llm": "openai", "options": {"openai": {"timeout": -1}}},
        "bad_size": {"embedder": "openai", "options": {"openai": {"embedding_dimensions": "768"}}},
        "bad_client": {"llm": "openai", "options": {"openai": {"http_client": "curl"}}},
    })

    messages = {e.msg.split(":")[0]: e.msg for e in check_profiles()}
    assert "'modle'" in messages["Profile 'typo'"]
    assert "timeout" in messages["Profile 'timeout'"]
    assert "embedding_dimensions" in messages["Profile 'bad_size'"]
    assert "http_client" in messages["Profile 'bad_client'"] and "'curl'" in messages["Profile 'bad_client'"]


# --- The embedder --------------------------------------------------------------------------------


def test_the_embedder_batches_requests_and_returns_the_servers_vectors(openai_server, ragchat_settings_override):
    ragchat_settings_override(PROFILES={"default": openai_profile(openai_server, {"batch_size": 2})})
    embedder = components_for(get_profile()).embedder
    texts = ["Aurora X2 price", "Nimbus Tab", "", "Zephyr Buds warranty", "battery"]

    vectors = embedder.embed(texts)
    assert embedder.space == "openai/text-embedding-3-small-64"
    assert vectors.dtype == np.float32 and vectors.shape == (5, 64)
    assert openai_server.count("embeddings") == 3
    assert all(r.json["dimensions"] == 64 and r.json["model"] == "text-embedding-3-small"
               for r in openai_server.requests)
    assert openai_server.requests[1].json["input"] == [" ", "Zephyr Buds warranty"]  # never an empty string
    np.testing.assert_allclose(vectors[0], embed("Aurora X2 price", 64), atol=1e-6)
    np.testing.assert_allclose(async_to_sync(embedder.aembed)(texts), vectors, atol=1e-6)
    assert openai_server.count("embeddings") == 6
    assert embedder.embed([]).shape == (0, 64)


def test_a_model_without_a_known_size_sends_no_dimensions(openai_server, ragchat_settings_override):
    ragchat_settings_override(PROFILES={"default": openai_profile(
        openai_server, {"embedding_model": "nomic-embed-text", "embedding_dimensions": 64})})
    embedder = components_for(get_profile()).embedder

    assert embedder.embed(["hello"]).shape == (1, 64)
    assert "dimensions" not in openai_server.last("embeddings").json
    assert embedder.space == "openai/nomic-embed-text-64"


def test_a_model_of_unknown_size_learns_it_from_the_first_reply(openai_server, ragchat_settings_override):
    from django_ragchat.stages.embedders import OpenAIEmbedder

    OpenAIEmbedder.learnt_dimensions.clear()
    ragchat_settings_override(PROFILES={"default": openai_profile(
        openai_server, {"embedding_model": "nomic-embed-text", "embedding_dimensions": None})})
    embedder = components_for(get_profile()).embedder
    assert embedder.dimension is None
    assert embedder.embed(["hello", "world"]).shape == (2, 64)
    assert embedder.space == "openai/nomic-embed-text-64"
    assert "dimensions" not in openai_server.last("embeddings").json
    assert openai_server.count("embeddings") == 1

    # Reading the space first asks the server once; a later embedder of the process knows it.
    OpenAIEmbedder.learnt_dimensions.clear()
    fresh = OpenAIEmbedder(get_profile(), **openai_profile(openai_server, {
        "embedding_model": "nomic-embed-text", "embedding_dimensions": None})["options"]["openai"])
    assert fresh.space == "openai/nomic-embed-text-64" and openai_server.count("embeddings") == 2
    again = OpenAIEmbedder(get_profile(), **openai_profile(openai_server, {
        "embedding_model": "nomic-embed-text", "embedding_dimensions": None})["options"]["openai"])
    assert again.dimension == 64 and again.embed([]).shape == (0, 64)
    assert openai_server.count("embeddings") == 2
    OpenAIEmbedder.learnt_dimensions.clear()


def test_vectors_of_the_wrong_size_are_a_bad_response(openai_server, ragchat_settings_override):
    from django_ragchat.exceptions import LLMError

    # The server answers 64 dimensions; the profile claims 32 and does not ask for them.
    ragchat_settings_override(PROFILES={"default": openai_profile(
        openai_server, {"embedding_model": "nomic-embed-text", "embedding_dimensions": 32})})

    with pytest.raises(LLMError) as caught:
        components_for(get_profile()).embedder.embed(["hello"])
    assert caught.value.code == "bad_response"


def test_a_profile_embedded_in_another_space_names_the_reembed_command(
    openai_server, ragchat_settings_override, product_corpus, conversation,
):
    # product_corpus is embedded by the offline hashing embedder; the profile now uses openai.
    ragchat_settings_override(PROFILES={"default": openai_profile(openai_server)})

    result = run_turn_sync(conversation, QUESTION)

    assert result.error.code == "embedding_space_mismatch"
    assert "ragchat_reembed" in result.error.message
    assert openai_server.count("chat/completions") == 0


# --- The demo's configuration by environment -----------------------------------------------------


@pytest.mark.parametrize("env,expected", [
    ({}, None),
    ({"OPENAI_API_KEY": "sk-demo"}, {"base_url": None, "model": "gpt-4o-mini",
                                     "embedding_model": "text-embedding-3-small"}),
    ({"RAGCHAT_LLM_BASE_URL": "http://127.0.0.1:11434/v1", "RAGCHAT_CHAT_MODEL": "llama3.2",
      "RAGCHAT_EMBEDDING_MODEL": "nomic-embed-text", "RAGCHAT_EMBEDDING_DIMENSIONS": "768"},
     {"base_url": "http://127.0.0.1:11434/v1", "model": "llama3.2", "embedding_model": "nomic-embed-text",
      "embedding_dimensions": 768}),
])
def test_the_demo_uses_a_model_server_only_when_the_environment_names_one(env, expected):
    root = Path(__file__).resolve().parent.parent
    clean = {k: v for k, v in os.environ.items()
             if k not in ("OPENAI_API_KEY", "RAGCHAT_LLM_BASE_URL", "RAGCHAT_CHAT_MODEL",
                          "RAGCHAT_EMBEDDING_MODEL", "RAGCHAT_EMBEDDING_DIMENSIONS")}
    code = "import json, example_project.settings as s; print(json.dumps(s.RAGCHAT['PROFILES']['default']))"
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env={**clean, "DJANGO_DEBUG": "1", **env}, check=True,
                         capture_output=True, text=True).stdout
    profile = json.loads(out)
    if expected is None:
        assert profile.get("llm", "extractive") == "extractive" and profile.get("embedder", "hashing") == "hashing"
    else:
        assert profile["llm"] == "openai" and profile["embedder"] == "openai"
        assert {k: profile["options"]["openai"].get(k) for k in expected} == expected


# --- The overhead benchmark -----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)  # its event loop queries from asgiref's thread
def test_the_overhead_benchmark_runs_and_counts_the_requests_each_profile_implies():
    from bench import bench_openai_overhead

    results = bench_openai_overhead.run(chunks=60, histories=(2, 12), turns=2, warmup=1)

    cells = results["cells"]
    assert len(cells) == 2 * 2 * 4 and all(len(c["ms"]) == 2 for c in cells)
    for cell in cells:
        expected = (1, 1) if cell["profile"] == "plain" else (3, 1)
        assert set(cell["requests"]) == {expected}
        assert len(cell["stages"]["llm"]) == 2
    text = bench_openai_overhead.report(results, "test db")
    assert "median ms" in text and "1 chat + 1 emb" in text and "3 chat + 1 emb" in text
