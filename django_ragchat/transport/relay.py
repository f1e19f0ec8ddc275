"""Relaying one turn's events to websockets: the socket that sent the message and the other
sockets watching the conversation (``transport.consumers``).

Per delta, a turn costs as little as the relay can make it:

* **Coalescing.** The turn hands each frame to ``TurnRelay.push`` without waiting for the
  socket. A delta pushed while the relay is idle is written at once, inside ``push`` (no loop
  iteration between the model's piece and the socket); a writer task then sends what is pushed
  after it. The turn's other frames (its ``ack``, stages, sources, ``done``) go to the writer
  task, which writes them when the turn next waits: a frame's write costs the worker a tenth
  of a millisecond or more, which before the first token was spent ahead of the model's
  request instead of while the model works. Deltas that pile up while the writer is behind
  (the turn reading more of the model's pieces in the same loop tick, the worker busy with
  other turns, a slow socket) go out as one ``delta`` frame carrying their concatenated text.
  A socket that keeps up gets one frame per piece, as soon as it is written. The relay numbers
  the deltas it sends (``index`` from 0, with no gap, again from 0 after a ``retry``), so the
  protocol is unchanged: what a client assembles is the same text.
* **One encode.** Each frame is encoded to JSON once; the same text goes to the sender's
  socket and, through the channel layer, to every watching socket.
* **No publish unwatched.** The conversation's group is sent to only while another socket
  is in it (``GroupRelay``).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from channels.layers import InMemoryChannelLayer

logger = logging.getLogger(__name__)

# The longest a group_send may take (they take milliseconds).
LAYER_CALL_SECONDS = 5.0

_encode = json.JSONEncoder().encode  # json.dumps' own output, without its per-call checks


def encode(frame: dict) -> str:
    """A frame's wire text (as ``json.dumps`` writes it)."""
    return _encode(frame)


class GroupRelay:
    """Publishes one turn's frames, already encoded, to its conversation's group, in order, in
    batches, while another socket is in the group.

    The group (the other sockets on the conversation, and the sending socket's own channel,
    which ignores it) gets what accumulated over ``window`` seconds in one message,
    ``{"type": "ragchat.events", "origin": ..., "texts": [...], "ack": bool}``, one
    ``group_send`` at a time. A model writing thousands of tokens a second then costs the
    channel layer tens of messages a second, not thousands, at the price of ``window`` seconds
    of delay for the watching tabs.

    Whether another socket is in the group is read from the in-memory layer at each frame; on
    another layer (Redis) it is asked before a batch is sent, at most once every
    ``watchers_recheck`` seconds, and assumed when the layer cannot tell. A tab that opens the
    conversation while an answer streams receives the answer from then on.
    """

    window = 0.02
    watchers_recheck = 1.0

    def __init__(self, channel_layer, group: str, origin: str | None):
        self.channel_layer, self.group, self.origin = channel_layer, group, origin
        self.pending: list[str] = []
        self.ack = False
        self.sending: asyncio.Task | None = None
        self.watched: bool | None = None  # another layer's answer, and when it was asked
        self.watched_at = 0.0

    def others_here(self) -> bool | None:
        """Whether another socket is in the group, when the layer tells at no cost; else ``None``."""
        if isinstance(self.channel_layer, InMemoryChannelLayer):
            members = self.channel_layer.groups.get(self.group)
            return bool(members) and any(channel != self.origin for channel in members)
        return None

    def publish(self, text: str, ack: bool = False) -> None:
        if self.channel_layer is None or self.others_here() is False:
            return  # no layer, or nobody else watching: no other socket to tell
        self.pending.append(text)
        self.ack = self.ack or ack
        if self.sending is None:
            self.sending = asyncio.create_task(self._send())

    async def _send(self) -> None:
        try:
            while self.pending:
                await asyncio.sleep(self.window)  # let the batch fill
                texts, ack, self.pending, self.ack = self.pending, self.ack, [], False
                if not await self._watched():
                    continue
                await asyncio.wait_for(self.channel_layer.group_send(
                    self.group, {"type": "ragchat.events", "origin": self.origin, "texts": texts, "ack": ack}),
                    LAYER_CALL_SECONDS)
        except Exception:
            logger.exception("ragchat: could not publish to channel layer group %s", self.group)
        finally:
            self.sending = None  # no await since the loop's test: publish() starts a new one

    async def _watched(self) -> bool:
        known = self.others_here()
        if known is not None:
            return known
        now = time.monotonic()
        if self.watched is None or now - self.watched_at >= self.watchers_recheck:
            self.watched, self.watched_at = await _others_in_group(self.channel_layer, self.group, self.origin), now
        return self.watched

    async def flush(self) -> None:
        """Wait until every frame published so far has been sent."""
        while self.sending is not None:
            await asyncio.shield(self.sending)


async def _others_in_group(layer, group: str, origin: str | None) -> bool:
    """Whether ``group`` has a member other than ``origin`` on a ``channels_redis`` layer (its
    sorted set of members); True for a layer that cannot tell, or when asking fails."""
    try:
        key = layer._group_key(group)
        connection = layer.connection(layer.consistent_hash(group))
        members = await asyncio.wait_for(connection.zrange(key, 0, -1), LAYER_CALL_SECONDS)
    except Exception:  # not channels_redis, or it failed: publish, as before
        return True
    return any(member.decode() != origin for member in members)


class TurnRelay:
    """One turn's frames to the socket that sent the message (``send``) and to the group.

    ``push`` queues a frame and returns at once: a delta written within ``push`` when the relay
    is idle, anything else by the writer task when the turn next yields, coalescing the deltas
    pending together into one (module docstring). ``flush`` waits until all is sent.
    """

    def __init__(self, send: Callable[[str], Awaitable[None]], group: GroupRelay):
        self.send, self.group = send, group
        self.pending: deque[dict] = deque()
        self.index = 0  # the next delta's index on the wire
        self.writing: asyncio.Task | None = None

    def push(self, frame: dict) -> None:
        """Queue ``frame`` (owned by the relay from now on: a delta may be extended)."""
        if self.writing is None and frame["type"] == "delta":
            # Idle: this piece goes out now, not one loop iteration later (the turn may read
            # more of the model before it yields). The writer, started after it, sends (and
            # coalesces) what is pushed before its first step.
            self.writing = asyncio.ensure_future(self._write(started(self._sent(frame))))
        elif self.writing is None:
            # Not the model's text: written when the turn next waits (for the database, for the
            # model's answer), not ahead of what the turn does next.
            self.pending.append(frame)
            self.writing = asyncio.ensure_future(self._write(None))
        elif frame["type"] == "delta" and self.pending and self.pending[-1]["type"] == "delta":
            self.pending[-1]["text"] += frame["text"]
        else:
            self.pending.append(frame)

    async def _sent(self, frame: dict) -> None:
        """Send one frame (numbered, encoded, published); on a failure, drop what is pending."""
        kind = frame["type"]
        if kind == "delta":
            frame["index"], self.index = self.index, self.index + 1
        elif kind == "retry":
            self.index = 0
        text = encode(frame)
        self.group.publish(text, ack=kind == "ack")
        try:
            await self.send(text)
        except Exception:
            logger.exception("ragchat: could not relay a turn's frame")
            self.pending.clear()

    async def _write(self, first: Awaitable[None] | None) -> None:
        try:
            if first is not None:  # the frame written in push() is still going out
                await first
            while self.pending:
                await self._sent(self.pending.popleft())
        finally:
            self.writing = None

    async def flush(self) -> None:
        """Wait until every frame pushed so far has been sent, to the socket and the group."""
        while self.writing is not None:
            await asyncio.shield(self.writing)
        await self.group.flush()


def started(coro: Coroutine) -> Awaitable | None:
    """Run ``coro`` now, up to its first suspension (what Python 3.12's eager tasks do): ``None``
    when it finished (its result is dropped), else a task that finishes it."""
    try:
        waiting = coro.send(None)
    except StopIteration:
        return None
    return asyncio.ensure_future(_finish(coro, waiting))


async def _finish(coro: Coroutine, waiting: Any) -> Any:
    return await _Resumed(coro, waiting)


class _Resumed:
    """Awaits what a coroutine, already started and suspended on ``waiting`` (a future, or
    ``None`` for a bare yield), waits for, then drives it on: ``yield from`` for a coroutine
    that has already taken its first step. Cancellation is passed to it."""

    def __init__(self, coro: Coroutine, waiting: Any):
        self.coro, self.waiting = coro, waiting

    def __await__(self):
        coro, waiting = self.coro, self.waiting
        while True:
            try:
                value = yield waiting
            except BaseException as exc:  # thrown in by the task (a cancellation): the coroutine's to handle
                step = functools.partial(coro.throw, exc)
            else:
                step = functools.partial(coro.send, value)
            try:
                waiting = step()
            except StopIteration as stop:
                return stop.value
