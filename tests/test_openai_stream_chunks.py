"""Streamed chunks are read from their JSON (not typed models): every field the backend used
to read still counts, and chunks of another shape are skipped or refused, never a crash.
Served by a real loopback HTTP server writing exactly the given server-sent events."""

import asyncio
import contextlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from django_ragchat.backends.openai import ChatModel, OpenAIConnection
from django_ragchat.exceptions import LLMError


@contextlib.contextmanager
def sse_server(*chunks, together=False, pause=0.0, hold=None):
    """A server answering every POST with ``chunks`` as server-sent events, then [DONE]: one
    write per event, ``pause`` seconds apart, or all in one write (``together``); ``hold``: an
    event set when the stream may go on after its first event."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            events = [f"data: {json.dumps(chunk)}\n\n".encode() for chunk in chunks] + [b"data: [DONE]\n\n"]
            if together:
                self.wfile.write(b"".join(events))
                return
            with contextlib.suppress(ConnectionError):  # a client that closed early
                for position, event in enumerate(events):
                    self.wfile.write(event)
                    if hold is not None and position == 0:
                        hold.wait(10)
                    time.sleep(pause)

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
    assert "".join(p.text for p in pieces[:-1]) == "Hello no"
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


TEXT_CHUNKS = [{"choices": [{"delta": {"content": word}}]} for word in ("Hel", "lo", " no")]


def test_chunks_one_read_brings_are_one_piece_and_chunks_written_apart_stay_apart():
    with sse_server(*TEXT_CHUNKS, together=True) as url:
        pieces = stream(url)
    assert [p.text for p in pieces] == ["Hello no", ""]
    with sse_server(*TEXT_CHUNKS, pause=0.05) as url:
        pieces = stream(url)
    assert [p.text for p in pieces] == ["Hel", "lo", " no", ""]


def test_closing_a_stream_early_stops_its_reader_and_closes_the_response():
    hold = threading.Event()
    model = None

    async def first_then_close():
        async with asyncio.timeout(5):
            pieces = model.stream([{"role": "user", "content": "hi"}])
            first = await pieces.__anext__()
            await pieces.aclose()  # the model has not written the rest: the reader waits on the socket
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        return first.text, others

    with sse_server(*TEXT_CHUNKS, hold=hold) as url:
        model = ChatModel(OpenAIConnection.from_options({"base_url": url, "max_retries": 0}), model="m")
        try:
            text, others = asyncio.run(first_then_close())
        finally:
            hold.set()
    assert text == "Hel" and others == []


def sse_events(decoder_events):
    return [(e.event, e.data) for e in decoder_events]


@pytest.mark.parametrize("body", [
    b"data: a\n\ndata: b\n\n",
    b"data: a\r\n\r\ndata: b\r\rdata: c\r\n\r\n",
    b": comment\ndata: x\ndata: y\n\nevent: thread.run\ndata: {}\n\n\n\ndata:z\n\n",
    b"id: 7\ndata: a\n\nretry: 10\n\ndata: b\n\nfield: v\n\ndata: partial",
    "data: caf\u00e9 \u2014 \U0001f600\n\n".encode(),
])
def test_events_are_read_as_the_openai_client_reads_them_however_the_body_is_split(body):
    from openai._streaming import SSEDecoder

    from django_ragchat.backends.openai import _Events

    def expected(pieces):
        async def read():
            async def source():
                for piece in pieces:
                    yield piece
            return [e async for e in SSEDecoder().aiter_bytes(source())]
        return sse_events(asyncio.run(read()))

    def ours(pieces, group):
        events, out = _Events(), []
        for start in range(0, len(pieces), group):
            for item in events.feed(pieces[start:start + group]):
                out.append(item if isinstance(item, tuple) else (None, item))
        return out

    whole = expected([body])
    for cut in range(1, len(body)):
        pieces = [body[:cut], body[cut:]]
        assert expected(pieces) == whole
        assert ours(pieces, 1) == whole, cut
        assert ours(pieces, 2) == whole, cut
    assert ours([bytes([b]) for b in body], 1) == whole
    assert ours([bytes([b]) for b in body], 3) == whole


def test_the_reader_hands_over_each_piece_until_the_first_words_then_what_came_meanwhile_at_once():
    from django_ragchat.backends.openai import _Reader

    async def body():
        for piece in (b"a", b"b", b"c", b"d"):
            yield piece  # all there at once: no wait between them

    async def read():
        reader = _Reader(body())
        first = await reader.take()
        reader.eager = False  # the first words are out
        return first, await reader.take()

    first, rest = asyncio.run(read())
    assert first == ([b"a"], None)
    assert rest == ([b"b", b"c", b"d"], True)


@pytest.mark.parametrize("text", [
    '{"choices": [{"delta": {"content": "caf\\u00e9 \\ud83d\\ude00"}}], "n": 1.5e3}', "[1, 2]", '"s"', "NaN", "-0",
    "12345678901234567890", " {} ", "{}\n", "\t[]", "{} {}", "{} x", "", "   ", "{", '{"a": }', "\ufeff{}",
    '"\x01"', "[1,]", "nul", "[NaN, Infinity, -Infinity]",
])
def test_a_chunk_s_json_is_read_as_json_loads_reads_it(text):
    from django_ragchat.backends.openai import _json_value

    try:
        expected = json.loads(text)
    except json.JSONDecodeError as exc:
        with pytest.raises(json.JSONDecodeError) as raised:
            _json_value(text)
        assert (raised.value.msg, raised.value.pos) == (exc.msg, exc.pos)
    else:
        got = _json_value(text)
        assert got == expected or (got != got and expected != expected)
        assert type(got) is type(expected)


def _chunk_text(delta: dict, **fields) -> str:
    return json.dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                       "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}], **fields})


_SAME = _chunk_text({"content": "x"})
_AROUND = _SAME.partition('"x"')


@pytest.mark.parametrize("stream", [
    # the usual stream: a role chunk, text chunks, the finish chunk
    [_chunk_text({"role": "assistant", "content": ""}), _chunk_text({"content": "a"}),
     _chunk_text({"content": 'caf\u00e9 "q" \\ \n \ud83d\ude00 "content": "no"'}), _chunk_text({"content": ""}),
     _chunk_text({}, finish_reason="stop"), _chunk_text({"content": "b"})],
    # what is around the string differs, or the string is no one JSON string
    [_SAME, _chunk_text({"content": "y"}, usage=None), _chunk_text({"content": None}), _chunk_text({"content": 3}),
     _AROUND[0] + '"a" "b"' + _AROUND[2], _AROUND[0] + '"a\\"' + _AROUND[2], _AROUND[0] + '"a\\q"' + _AROUND[2],
     _AROUND[0] + '"a\x01"' + _AROUND[2], _AROUND[0] + '"a' + _AROUND[2], _AROUND[0] + '""' + _AROUND[2],
     _AROUND[0] + '"\\ud800"' + _AROUND[2], _AROUND[0] + '"a", "content": "b"' + _AROUND[2],
     _SAME + " ", " " + _SAME, _SAME + "x", _SAME[:-1], _SAME.replace('"x"', '"a\"b"'), _SAME],
    # a content key elsewhere, duplicated keys, other values that are no scalars, spaces around the colon
    ['{"choices": [{"delta": {"content": "a", "content": "b"}}]}', '{"choices": [{"delta": {"content": "a", "content": "c"}}]}',
     '{"choices": [{"delta": {"content": "a"}}], "content": "z"}', '{"choices": [{"delta": {"content": "q"}}], "content": "z"}',
     '{"choices": [{"delta": {"content": "a"}}], "content": "a"}', '{"choices": [{"delta": {"content": "a"}}], "content": "b"}',
     '{"choices": [{"delta": {"content" :  "a"}}]}', '{"choices": [{"delta": {"content" :  "b"}}]}',
     '{"choices": [{"delta": {"content": "a"}, "logprobs": {"p": 1}}]}', '{"choices": [{"delta": {"content": "b"}, "logprobs": {"p": 1}}]}',
     '{"choices": [{"delta": {"content": "a"}}, {"delta": {"content": "a"}}]}', '{"n": NaN, "choices": [{"delta": {"content": "a"}}]}',
     '{"n": NaN, "choices": [{"delta": {"content": "b"}}]}', '{"choices": [{"delta": {"content": "a"}}], "n": 1.5e3}',
     '{"choices": [{"delta": {"content": "b"}}], "n": 1.5e3}'],
])
def test_text_chunks_are_read_as_json_loads_reads_them(stream):
    """A stream's chunks read by ``_TextChunks`` (by their string alone, ``text``, once it kept
    what is around it; else whole, ``read``) are what ``json.loads`` reads, or refuses with the
    same error, in any order; each a chunk of its own (no dict or list shared with another)."""
    from django_ragchat.backends.openai import _TextChunks

    for order in (stream, stream[::-1], stream + stream):
        reader, seen, alive = _TextChunks(), set(), []  # alive: so that their ids are not reused
        for text in order:
            try:
                expected = json.loads(text)
            except json.JSONDecodeError as exc:
                assert reader.text(text) is None
                with pytest.raises(json.JSONDecodeError) as raised:
                    reader.read(text)
                assert (raised.value.msg, raised.value.pos) == (exc.msg, exc.pos)
                continue
            content = reader.text(text)
            got = reader.read(text) if content is None else reader.with_text(reader.chunk, content)
            assert json.dumps(got) == json.dumps(expected), text  # NaN, key order and types too
            if isinstance(got, dict) and isinstance(got.get("choices"), list):
                objects = [o for o in (got, got["choices"], *got["choices"], *(c.get("delta") for c in got["choices"]))
                           if isinstance(o, dict | list)]
                assert not seen & {id(o) for o in objects}
                seen |= {id(o) for o in objects}
                alive.append(objects)
        assert reader.learnt <= reader.learn_limit


def test_text_chunks_read_the_usual_stream_by_its_string():
    """The usual stream's text chunks are read by their string alone (the kept text around it),
    and a stream whose chunks differ elsewhere stops looking after a few kept shapes."""
    from django_ragchat.backends import openai as backend

    reader = backend._TextChunks()
    for text in [_chunk_text({"role": "assistant", "content": ""})] + [_chunk_text({"content": f"w{i} "}) for i in range(5)]:
        if reader.text(text) is None:
            reader.read(text)
    assert reader.learnt == 2 and reader.prefix.endswith('"delta": {"content": "')
    assert reader.text(_chunk_text({"content": "z"})) == "z"
    varying = backend._TextChunks()
    for i in range(10):
        assert varying.text(_chunk_text({"content": "w"}, obfuscation="x" * i)) is None
        varying.read(_chunk_text({"content": "w"}, obfuscation="x" * i))
    assert varying.learnt == varying.learn_limit


def _loaded(events: list) -> tuple[list, str | None]:
    """``events`` read by ``json.loads`` up to ``[DONE]``, a chunk ``json`` refuses or an error
    chunk (listed then as what failed)."""
    chunks = []
    for data in events:
        if data.startswith("[DONE]"):
            return chunks, None
        try:
            chunk = json.loads(data)
        except ValueError as exc:
            return chunks, repr(exc)
        if isinstance(chunk, dict) and chunk.get("error"):
            return chunks, "error chunk"
        chunks.append(chunk)
    return chunks, None


def _read_as_before(events: list) -> tuple:
    """What ``ChatModel.stream`` read of ``events`` (chunk texts) before ``_TextChunks``: every
    chunk through ``json.loads``."""
    from django_ragchat.backends.openai import _StreamRead

    read, texts = _StreamRead("asked"), []
    chunks, error = _loaded(events)
    bad = read.chunks(chunks, texts)
    return texts, bad, error if bad is None else None, read.model, read.usage, read.finish, read.calls.result()


def _read_now(events: list, per: int) -> tuple:
    """The same, through ``ChunkLists._chunks`` (``per`` events at a time) and ``_StreamRead``;
    whether each list has words (``_has_words``, the reader's eager start) as before."""
    import openai

    from django_ragchat.backends.openai import ChunkLists, _has_words, _http, _StreamRead, _TextChunks

    stream = object.__new__(ChunkLists)
    stream.response = type("Response", (), {"request": _http.Request("POST", "http://model/")})()
    read, texts, bad, error, reader = _StreamRead("asked"), [], None, None, _TextChunks()
    for start in range(0, len(events), per):
        chunks, done, failed = stream._chunks(events[start:start + per], reader)
        assert _has_words(chunks) == _has_words(_loaded(events[start:start + per])[0])
        bad = read.chunks(chunks, texts)
        if failed is not None and bad is None:
            error = "error chunk" if isinstance(failed, openai.APIError) else repr(failed)
        if bad is not None or done or failed is not None:
            break
    return texts, bad, error, read.model, read.usage, read.finish, read.calls.result()


@pytest.mark.parametrize("per", [1, 3, 100])
def test_a_stream_read_with_text_runs_says_what_it_said_before(per):
    """``ChatModel.stream``'s reading (the text, whether each chunk has words, the model, usage,
    finish reason, tool calls, a bad chunk, an error) is the same with the text chunks read by
    their string and listed as runs as with every chunk read by ``json.loads``."""
    text = _chunk_text
    call = {"index": 0, "id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    streams = [
        [text({"role": "assistant", "content": ""})] + [text({"content": f"w{i} "}) for i in range(7)]
        + [text({}, finish_reason="stop"), json.dumps({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 8}}),
           "[DONE]", text({"content": "after"})],
        [text({"content": "a"}), text({"content": ""}), text({"content": "b"}, model="other"), text({"content": "c"}),
         text({"content": "d"}, finish_reason="length"), text({"content": "e"}), text({"refusal": "no", "content": "f"}),
         text({"content": "g"}), text({"content": "h", "tool_calls": [call]}), text({"content": "i"}),
         text({"content": "j"}, usage=None), text({"content": "k"}, usage=5), text({"content": "l"})],
        [text({"content": "a"}), text({"content": "b"}), text({"content": "c"}, error={"message": "boom"}), text({"content": "d"})],
        [text({"content": "a"}), text({"content": "b"}), _AROUND[0] + '"bad \\q"' + _AROUND[2], text({"content": "c"})],
        [text({"content": "a"}), text({"content": "b"}), '"just a string"', text({"content": "c"})],
        [text({"content": "a"}), text({"content": "b"}, error=""), text({"content": "c"}, error=None)],
        [text({"content": ""}), text({"content": ""}), text({"content": "x"})],
        # a chunk of another shape between those of a run's: the run's fields are its chunks' again
        [text({"content": "a"}), text({"content": "b"}), text({}, model="other"), text({"content": "c"})],
        [text({"content": "a"}, finish_reason="stop"), text({"content": "b"}, finish_reason="stop"),
         text({}, finish_reason="length"), text({"content": "c"}, finish_reason="stop")],
        # a refusal or tool calls in every chunk: no run
        [text({"content": "a", "refusal": "r"}), text({"content": "b", "refusal": "r"}), text({"content": "c", "refusal": "r"})],
        [text({"content": "a", "tool_calls": 1}), text({"content": "", "tool_calls": 1}), text({"content": "", "tool_calls": 1})],
    ]
    for events in streams:
        assert _read_now(events, per) == _read_as_before(events), events


@contextlib.contextmanager
def raw_server(headers: dict, body: bytes, stall: float = 0.0):
    """A server answering every POST with ``headers`` and ``body``, then ``stall`` seconds of
    silence before it closes."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            for name, value in {"Content-Type": "text/event-stream", **headers}.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()
            time.sleep(stall)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def test_a_compressed_stream_is_read_through_its_decoder():
    import gzip

    events = b"".join(f"data: {json.dumps(chunk)}\n\n".encode() for chunk in TEXT_CHUNKS) + b"data: [DONE]\n\n"
    body = gzip.compress(events)
    with raw_server({"Content-Encoding": "gzip", "Content-Length": str(len(body))}, body) as url:
        pieces = stream(url)
    assert "".join(p.text for p in pieces) == "Hello no"


def test_a_stream_that_stalls_is_a_timeout_whose_cause_names_the_request():
    first = f"data: {json.dumps(TEXT_CHUNKS[0])}\n\n".encode()
    with raw_server({}, first, stall=1.5) as url:
        model = ChatModel(OpenAIConnection.from_options({"base_url": url, "max_retries": 0, "timeout": 0.3}), model="m")
        texts = []

        async def collect():
            async for piece in model.stream([{"role": "user", "content": "hi"}]):
                texts.append(piece.text)

        with pytest.raises(LLMError) as raised:
            asyncio.run(collect())
    assert raised.value.code == "timeout" and texts == ["Hel"]
    cause = raised.value.__cause__.__cause__  # LLMError <- APITimeoutError <- the HTTP library's timeout
    assert cause.request.url.path.endswith("/chat/completions")
