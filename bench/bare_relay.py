"""The floor of ``bench_streaming.py``: a bare Channels websocket consumer relaying an answer.

    uvicorn bench.bare_relay:application     (DJANGO_SETTINGS_MODULE=bench.streaming_settings)

It speaks the part of docs/protocol.md the benchmark's websocket client reads: ``ready`` on
connect; for a ``message``, ``ack``, then the same 200 one-word tokens the model server
streams (``RAGCHAT_BENCH_TOKENS``), one ``delta`` frame (``send_json``) per token, then
``done``. No database, no model, no channel-layer group: what Channels and uvicorn cost per
frame, the most a relay could do on this machine. With ``RAGCHAT_BENCH_TOKEN_DELAY`` (seconds)
it waits that long before each token, like a model streaming at its own pace
(``bench_memory.py``: the memory of an open stream on a bare consumer).
"""

import asyncio
import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.streaming_settings")
django.setup()

from channels.generic.websocket import AsyncJsonWebsocketConsumer  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import path  # noqa: E402

TOKENS = int(os.environ.get("RAGCHAT_BENCH_TOKENS", "200"))
DELAY = float(os.environ.get("RAGCHAT_BENCH_TOKEN_DELAY", "0"))
PIECES = [("" if i == 0 else " ") + f"t{i}" for i in range(TOKENS)]


class BareRelay(AsyncJsonWebsocketConsumer):
    async def connect(self):
        await self.accept()
        await self.send_json({"type": "ready"})

    async def receive_json(self, content, **kwargs):
        conversation_id = content.get("conversation_id")
        await self.send_json({"type": "ack", "conversation_id": conversation_id})
        for index, text in enumerate(PIECES):
            if DELAY:
                await asyncio.sleep(DELAY)
            await self.send_json({"type": "delta", "text": text, "index": index,
                                  "conversation_id": conversation_id})
        await self.send_json({"type": "done", "message": {"content": "".join(PIECES)},
                              "conversation_id": conversation_id})


application = ProtocolTypeRouter({"websocket": URLRouter([path("ws/ragchat/", BareRelay.as_asgi())])})
