"""The plugin of bench/bench_tools.py: its tools and a model backend that notes when each
model call has fully arrived. Loaded by the benchmark's settings (``RAGCHAT["PLUGINS"]``)."""

from __future__ import annotations

import time

from django_ragchat import hookimpl
from django_ragchat.stages.llms import OpenAIChatBackend
from django_ragchat.tools import tool

#: (perf_counter as each model call of a turn ended, ...) per finished turn, in order.
TURN_ENDS: list[tuple[float, ...]] = []
ORDERS = {f"ORD-{n}": {"number": f"ORD-{n}", "status": "shipped", "carrier": "PostNord",
                       "estimated_delivery": "2026-05-02", "items": ["Aurora X2, 128 GB"]} for n in range(100)}
@tool(label="Looking up order {order_number}…")
def order_status(turn, order_number: str) -> dict:
    """The status of one of the customer's orders.

    Args:
        order_number: The number on the receipt, such as ORD-17.
    """
    return ORDERS.get(order_number, {"error": "no such order"})


@tool
async def order_status_async(turn, order_number: str) -> dict:
    """The status of one of the customer's orders (async).

    Args:
        order_number: The number on the receipt, such as ORD-17.
    """
    return ORDERS.get(order_number, {"error": "no such order"})


@hookimpl
def register_tools(register):
    register(order_status)
    register(order_status_async)


class TimedOpenAI(OpenAIChatBackend):
    """The ``openai`` backend, noting when each model call has fully arrived."""

    name = "timed_openai"

    async def complete(self, prompt, turn):
        response = await super().complete(prompt, turn)
        turn.state.setdefault("bench_ends", []).append(time.perf_counter())
        return response

    async def stream(self, prompt, turn):
        async for delta in super().stream(prompt, turn):
            yield delta
        turn.state.setdefault("bench_ends", []).append(time.perf_counter())


@hookimpl
def register_llm_backends(register):
    register(TimedOpenAI)


@hookimpl
def on_turn_completed(turn, message):
    TURN_ENDS.append(tuple(turn.state.get("bench_ends", ())))


