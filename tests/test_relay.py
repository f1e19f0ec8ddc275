"""The websocket relay of a turn's frames (``django_ragchat.transport.relay``), on real channel
layers (in-memory, and Redis as the suite's two-worker tests run it): deltas that pile up behind a slow socket go out as
one frame with the same text; a socket that keeps up gets one frame per delta; the group is
not sent to while no other socket is in it; each frame is encoded once, the same text for the
sender and the watchers; a delta pushed while the relay is idle is written within ``push``, the
other frames when the turn next waits."""

from __future__ import annotations

import asyncio
import json
import os
import secrets

from channels.layers import InMemoryChannelLayer

from django_ragchat.transport.relay import GroupRelay, TurnRelay, _others_in_group

PIECES = [f" t{i}" for i in range(50)]


class Socket:
    """What a websocket is given to send, in order; ``delay``: each send waits that long (a
    socket whose writes wait for a slow network)."""

    def __init__(self, delay: float = 0.0):
        self.delay, self.texts = delay, []

    async def send(self, text: str) -> None:
        if self.delay:
            await asyncio.sleep(self.delay)
        self.texts.append(text)

    def frames(self) -> list[dict]:
        return [json.loads(t) for t in self.texts]


async def stream_a_turn(relay: TurnRelay, pieces: list[str], *, retry_after: int | None = None) -> None:
    """A turn's frames as the consumer pushes them, each delta in a loop tick of its own."""
    relay.push({"type": "ack", "conversation_id": "c"})
    for i, piece in enumerate(pieces):
        if i == retry_after:
            relay.push({"type": "retry", "attempt": 1, "guardrail": "g", "conversation_id": "c"})
        relay.push({"type": "delta", "text": piece, "index": i, "conversation_id": "c"})
        await asyncio.sleep(0)
    relay.push({"type": "done", "message": {"content": "".join(pieces)}, "conversation_id": "c"})
    await relay.flush()


def test_deltas_that_pile_up_behind_a_slow_socket_go_out_as_one_frame_with_the_same_text():
    socket = Socket(delay=0.01)
    asyncio.run(stream_a_turn(TurnRelay(socket.send, GroupRelay(None, "g", None)), PIECES))
    frames = socket.frames()
    deltas = [f for f in frames if f["type"] == "delta"]
    assert frames[0]["type"] == "ack" and frames[-1]["type"] == "done"
    assert 1 <= len(deltas) < len(PIECES) / 5  # coalesced: far fewer frames than pieces
    assert [d["index"] for d in deltas] == list(range(len(deltas)))  # no gap on the wire
    assert "".join(d["text"] for d in deltas) == "".join(PIECES) == frames[-1]["message"]["content"]
    assert all(d["conversation_id"] == "c" for d in deltas)


def test_a_socket_that_keeps_up_gets_one_frame_per_delta():
    socket = Socket()
    asyncio.run(stream_a_turn(TurnRelay(socket.send, GroupRelay(None, "g", None)), PIECES))
    deltas = [f for f in socket.frames() if f["type"] == "delta"]
    assert [d["text"] for d in deltas] == PIECES and [d["index"] for d in deltas] == list(range(len(PIECES)))


def test_after_a_retry_the_coalesced_deltas_count_from_zero_again():
    socket = Socket(delay=0.01)
    asyncio.run(stream_a_turn(TurnRelay(socket.send, GroupRelay(None, "g", None)), PIECES, retry_after=25))
    frames = socket.frames()
    at = [f["type"] for f in frames].index("retry")
    before, after = ([f for f in part if f["type"] == "delta"] for part in (frames[:at], frames[at:]))
    assert "".join(d["text"] for d in before) == "".join(PIECES[:25])
    assert "".join(d["text"] for d in after) == "".join(PIECES[25:])
    assert [d["index"] for d in after] == list(range(len(after))) and after


def test_a_frame_pushed_while_the_relay_is_idle_is_written_within_push_and_the_rest_of_the_tick_coalesced():
    """The model's first piece reaches the socket before the turn reads on: no loop iteration
    between ``push`` and the write. The pieces pushed in the same tick follow as one frame."""
    async def scenario():
        socket = Socket()
        relay = TurnRelay(socket.send, GroupRelay(None, "g", None))
        relay.push({"type": "ack", "conversation_id": "c"})
        await relay.flush()  # idle again, as when the model's first piece arrives
        for piece in PIECES[:3]:  # read from the model in one go, with no await between them
            relay.push({"type": "delta", "text": piece, "index": 0, "conversation_id": "c"})
        written_within_push = socket.frames()
        await relay.flush()
        return written_within_push, socket.frames()

    within, frames = asyncio.run(scenario())
    assert [f["type"] for f in within] == ["ack", "delta"] and within[1]["text"] == PIECES[0]
    assert [(f["text"], f["index"]) for f in frames[1:]] == [(PIECES[0], 0), ("".join(PIECES[1:3]), 1)]


def test_the_frames_before_the_first_delta_are_written_when_the_turn_next_waits_and_the_delta_within_push():
    """The ack, stages and sources do not delay the turn's next step (its database work, its
    model request): they go out when it waits. The model's first piece still goes out at once."""
    async def scenario():
        socket = Socket()
        relay = TurnRelay(socket.send, GroupRelay(None, "g", None))
        relay.push({"type": "ack", "conversation_id": "c"})
        relay.push({"type": "stage", "stage": "retrieving", "conversation_id": "c"})
        within_push = list(socket.texts)
        await asyncio.sleep(0)  # the turn waits (a thread hop, the model's response)
        after_waiting = socket.frames()
        relay.push({"type": "delta", "text": PIECES[0], "index": 0, "conversation_id": "c"})
        first_delta = socket.frames()
        relay.push({"type": "done", "message": {"content": PIECES[0]}, "conversation_id": "c"})
        await relay.flush()
        return within_push, after_waiting, first_delta, socket.frames()

    within, waited, delta, frames = asyncio.run(scenario())
    assert within == [] and [f["type"] for f in waited] == ["ack", "stage"]
    assert [f["type"] for f in delta] == ["ack", "stage", "delta"]
    assert [f["type"] for f in frames] == ["ack", "stage", "delta", "done"]


def test_a_coroutine_started_now_that_suspends_is_finished_by_a_task_which_passes_cancellation_to_it():
    from django_ragchat.transport.relay import started

    async def scenario():
        steps, gate = [], asyncio.Event()

        async def send(result):
            steps.append("started")
            try:
                await gate.wait()
            except asyncio.CancelledError:
                steps.append("cancelled")
                raise
            await asyncio.sleep(0)  # a bare yield too
            return result

        async def done_at_once():
            return "unused"

        assert started(done_at_once()) is None
        going = started(send("sent"))
        assert steps == ["started"] and not going.done()  # its first step ran within started()
        gate.set()
        result = await going
        gate.clear()
        stopped = started(send("never"))
        await asyncio.sleep(0)
        stopped.cancel()
        await asyncio.gather(stopped, return_exceptions=True)
        return steps, result, stopped.cancelled()

    steps, result, cancelled = asyncio.run(scenario())
    assert result == "sent" and cancelled and steps == ["started", "started", "cancelled"]


async def pending(layer: InMemoryChannelLayer, channel: str) -> list[dict]:
    messages = []
    while not layer.channels.get(channel, asyncio.Queue()).empty():
        messages.append(await layer.receive(channel))
    return messages


def test_nothing_is_published_while_no_other_socket_watches_then_the_watcher_gets_the_senders_texts():
    async def scenario():
        layer = InMemoryChannelLayer()
        sender, watcher = await layer.new_channel(), await layer.new_channel()
        await layer.group_add("conv", sender)  # the sending socket is in its conversation's group
        alone = Socket()
        await stream_a_turn(TurnRelay(alone.send, GroupRelay(layer, "conv", sender)), PIECES)
        unwatched = await pending(layer, sender)

        await layer.group_add("conv", watcher)  # a second tab opens the conversation
        watched = Socket(delay=0.001)
        await stream_a_turn(TurnRelay(watched.send, GroupRelay(layer, "conv", sender)), PIECES)
        return alone, unwatched, watched, await pending(layer, watcher), await pending(layer, sender)

    alone, unwatched, watched, to_watcher, to_sender = asyncio.run(scenario())
    assert unwatched == [] and len(alone.texts) == len(PIECES) + 2  # no group_send at all
    assert to_watcher and all(m["type"] == "ragchat.events" for m in to_watcher)
    # The same encoded texts, in the same order, as the sender's socket got; the ack flagged.
    assert [t for m in to_watcher for t in m["texts"]] == watched.texts
    assert to_watcher[0]["ack"] is True and len(to_sender) == len(to_watcher)  # its own copy, ignored


def test_on_the_redis_layer_the_group_is_asked_whether_another_socket_watches():
    from channels_redis.core import RedisChannelLayer

    async def scenario():
        layer = RedisChannelLayer(hosts=[os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")],
                                  prefix=f"ragchat-test-{secrets.token_hex(4)}")
        sender, watcher = await layer.new_channel(), await layer.new_channel()
        try:
            await layer.group_add("conv", sender)
            alone = await _others_in_group(layer, "conv", sender)
            await layer.group_add("conv", watcher)
            watched = await _others_in_group(layer, "conv", sender)
            await layer.group_discard("conv", watcher)
            await layer.group_discard("conv", sender)
            return alone, watched
        finally:
            await layer.flush()
            await layer.close_pools()

    assert asyncio.run(scenario()) == (False, True)


def test_every_event_has_the_wire_form_dataclasses_asdict_gave():
    """``TurnEvent.to_dict`` reads the fields without copying them recursively: the wire form
    (docs/protocol.md) is the one ``dataclasses.asdict`` gave, for every kind of event."""
    import dataclasses

    from django_ragchat import events

    payload = {"id": 7, "content": "An answer [1].", "sources": [{"index": 1, "title": "Aurora"}],
               "citations": [{"index": 1, "chunk_id": 3}], "status": "complete"}
    samples = [
        events.Accepted(conversation_id="c", user_message_id=1, user_seq=1, assistant_message_id=2),
        events.Accepted(conversation_id="c", user_message_id=1, user_seq=1, assistant_message_id=2, replayed=True),
        events.StageChanged(stage="retrieving"),
        events.SourcesFound(sources=[{"index": 1, "title": "Aurora", "metadata": {"page": [1, 2]}}]),
        events.Delta(text=" t0", index=0),
        events.Retry(attempt=1, guardrail="grounded"),
        events.Replace(text="Another answer."),
        events.Completed(message=payload),
        events.Failed(code="cancelled", message="Stopped.", assistant_message=payload, retry_after=1),
        events.ToolCallUpdate(id="call_1", name="order_status", arguments={"order": "ORD-17"}, label="Looking",
                              step=1, status="awaiting_confirmation", confirmation_id=4),
        events.ToolCallFinished(id="call_1", name="order_status", status="error", content="",
                                error={"code": "timeout", "message": "Too slow."}, ms=12.5),
    ]
    for event in samples:
        expected = {"type": event.type, **dataclasses.asdict(event)}
        if isinstance(event, events.Accepted) and not event.replayed:
            del expected["replayed"]
        assert event.to_dict() == expected
        assert json.dumps(event.to_dict()) == json.dumps(expected)  # the same keys in the same order
    assert {type(e) for e in samples} == set(events.TurnEvent.__subclasses__())
