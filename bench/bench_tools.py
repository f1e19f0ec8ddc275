"""What a tool round trip costs in a turn, beside the same loop written directly with the
``openai`` client, against the same loopback model server, in one run.

    .venv/bin/python bench/bench_tools.py            # 300 rounds per cell
    .venv/bin/python bench/bench_tools.py --quick    # a few seconds

A tool round trip: the model's answer asks for a tool, the call is parsed and validated, the
tool runs, and the model is asked again with the result. The model server is the loopback
``FakeOpenAIServer`` in this process, answering at once, so what is measured is the software.

The tools and the timed backend are in ``bench/tools_plugin.py`` (a plugin the benchmark's
settings load).

* **ragchat**: whole turns (``run_turn``, or ``stream_turn`` consumed) on one event loop, with a
  profile that offers the tool: a turn whose model answers at once, and a turn whose model
  calls the tool first. The difference is the round trip as the turn does it: the second model
  request, the tool call's validation against its schema, the ``tool_call``/``tool_result``
  events, the run (a sync tool in a thread of its own, an async one awaited), the trace, and
  saving the call (``ToolInvocation``).
* **direct**: the same two shapes written with ``openai.AsyncOpenAI`` and nothing else: one
  ``chat.completions.create`` with the same ``tools``; or a first one, the call parsed from it
  (streamed: its fragments joined by index), the function called, the ``assistant`` and
  ``tool`` messages appended, and a second ``create``. The difference is the round trip at its
  bare minimum, written as the client's documentation writes it.
* **same path**: the direct loop again, but sending and reading as the turn's ``openai``
  backend does (``ChatModel``: the body posted as is, stream chunks read as plain JSON rather
  than typed models, which costs the client ~0.3 ms a chunk). Against it, what is left is the
  turn's tool loop alone.

Two measures of the round trip, each in both:

* **in the turn**: from the moment the model's first answer (the one asking for the tool) has
  arrived to the moment its second has: parsing, validating, running, the events, building the
  next request and the second request itself. The turns' model backend is the ``openai`` one
  with a timestamp taken as each model call ends (``tools_plugin.TimedOpenAI``); the direct loop takes
  the same two timestamps. Precise: it leaves out everything else a turn does.
* **whole turns**: a turn (or direct exchange) that calls the tool minus one whose model answers
  at once: adds what happens once per turn because of the call (saving the ``ToolInvocation``
  with the answer), but the difference of two medians of ~15 ms turns is noisy on a loaded
  machine.

**Added** is ragchat's round trip minus the direct one: what the turn's tool loop costs beyond
the HTTP request and the tool itself. Cells run round-robin (every shape once per round) so the
machine's other load spreads over all of them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._setup import bench_database, machine, median, percentile, table

QUESTION = "Where is my order ORD-17?"
ANSWER = "Your order ORD-17 has shipped with PostNord and should arrive on 2 May."


def _reply(tool_name: str):
    """The model: asks for the tool when the question names "tool", else answers."""
    from django_ragchat.testing.openai_server import call, tool_calls

    def reply(body: dict):
        messages = body["messages"]
        if messages[-1]["role"] == "tool" or "[no tool]" in str(messages[-1].get("content")):
            return ANSWER
        return tool_calls(call(tool_name, order_number="ORD-17"))

    return reply


# --- direct: the loop with the openai client and nothing else ------------------------------------


async def direct(client, tools: list[dict], *, with_tool: bool, streamed: bool, function,
                 ends: list[float]) -> str:
    """One question answered with the bare client: with ``with_tool``, a tool round trip.
    ``ends`` gets the time each model answer has fully arrived."""
    messages = [{"role": "system", "content": "You answer questions about orders."},
                {"role": "user", "content": QUESTION if with_tool else QUESTION + " [no tool]"}]
    text, calls = await _create(client, messages, tools, streamed)
    ends.append(time.perf_counter())
    if not calls:
        return text
    messages.append({"role": "assistant", "content": text or None, "tool_calls": calls})
    for found in calls:
        result = function(None, **json.loads(found["function"]["arguments"]))
        if asyncio.iscoroutine(result):
            result = await result
        messages.append({"role": "tool", "tool_call_id": found["id"], "content": json.dumps(result)})
    text, _ = await _create(client, messages, tools, streamed)
    ends.append(time.perf_counter())
    return text


async def _create(client, messages, tools, streamed: bool) -> tuple[str, list[dict]]:
    if not streamed:
        completion = await client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=tools)
        message = completion.choices[0].message
        calls = [{"id": c.id, "type": "function", "function": {"name": c.function.name,
                                                               "arguments": c.function.arguments}}
                 for c in message.tool_calls or ()]
        return message.content or "", calls
    parts, calls = [], {}
    stream = await client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=tools, stream=True)
    async for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        parts.append(delta.content or "")
        for fragment in delta.tool_calls or ():
            entry = calls.setdefault(fragment.index, {"id": "", "type": "function",
                                                      "function": {"name": "", "arguments": ""}})
            entry["id"] = fragment.id or entry["id"]
            entry["function"]["name"] += fragment.function.name or ""
            entry["function"]["arguments"] += fragment.function.arguments or ""
    return "".join(parts), [calls[i] for i in sorted(calls)]


async def same_path(chat, tools: list[dict], *, with_tool: bool, streamed: bool, function,
                    ends: list[float]) -> str:
    """The direct loop on the turn's own HTTP path (``ChatModel``: the requests the turn's
    ``openai`` backend sends, the responses read as it reads them): what is left of the
    difference to a turn is the turn's tool loop itself."""
    messages = [{"role": "system", "content": "You answer questions about orders."},
                {"role": "user", "content": QUESTION if with_tool else QUESTION + " [no tool]"}]

    async def ask():
        if not streamed:
            response = await chat.complete(messages, tools=tools)
            return response.text, response.tool_calls
        parts, calls = [], ()
        async for delta in chat.stream(messages, tools=tools):
            parts.append(delta.text)
            calls = delta.tool_calls or calls
        return "".join(parts), calls

    text, calls = await ask()
    ends.append(time.perf_counter())
    if not calls:
        return text
    messages.append({"role": "assistant", "content": text or None, "tool_calls": [c.as_openai() for c in calls]})
    for found in calls:
        result = function(None, **json.loads(found.arguments))
        if asyncio.iscoroutine(result):
            result = await result
        messages.append({"role": "tool", "tool_call_id": found.id, "content": json.dumps(result)})
    text, _ = await ask()
    ends.append(time.perf_counter())
    return text


# --- ragchat: whole turns ------------------------------------------------------------------------


async def ragchat_turn(conversation, text: str, *, streamed: bool) -> dict:
    from django_ragchat.events import Completed, Failed
    from django_ragchat.turn.pipeline import stream_turn

    async with contextlib.aclosing(stream_turn(conversation, text, stream=streamed)) as events:
        async for event in events:
            if isinstance(event, Failed):
                raise RuntimeError(f"turn failed: {event.code} {event.message}")
            if isinstance(event, Completed):
                return event.message
    raise RuntimeError("the turn ended without a final event")


# --- the run ---------------------------------------------------------------------------------------

CELLS = [(kind, tool_name, mode, with_tool)
         for tool_name in ("order_status", "order_status_async")
         for mode in ("whole", "streamed")
         for kind in ("ragchat", "direct", "same path")
         for with_tool in (False, True)]


def run(*, rounds: int = 300, warmup: int = 20) -> dict:
    """Measure every cell ``rounds`` times, round-robin. Returns {"cells": {cell: [ms]} (whole
    turns), "round_trips": {cell: [ms]} (in the turn, cells with a call), "requests": {cell: chat
    requests per question}, "traces": {tool: {"tools stage": [ms], "call": [ms]}}}."""
    import importlib

    import openai
    from asgiref.sync import sync_to_async
    from django.contrib.auth import get_user_model
    from django.db import connections
    from django.test import override_settings

    from django_ragchat.backends.openai import ChatModel, OpenAIConnection
    from django_ragchat.models import Conversation
    from django_ragchat.testing.openai_server import FakeOpenAIServer

    with FakeOpenAIServer() as server, asyncio.Runner() as runner:
        plugin = importlib.import_module("bench.tools_plugin")  # the module the plugin manager loads
        base = {"llm": "timed_openai", "empty_context": "answer", "retrievers": [], "query_transformers": [],
                "options": {"timed_openai": {"base_url": server.base_url, "max_retries": 0, "timeout": 10}}}
        settings = override_settings(RAGCHAT={
            "LOAD_ENTRY_POINTS": False, "PLUGINS": ["bench.tools_plugin"], "TURNS_PER_MINUTE": 0,
            "PROFILES": {"default": base, **{name: {**base, "tools": [name]} for name in
                                             ("order_status", "order_status_async")}}})
        settings.enable()
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="bench", max_retries=0)
        chat = ChatModel(OpenAIConnection(base_url=server.base_url, max_retries=0), model="gpt-4o-mini")
        owner = get_user_model().objects.create_user(f"bench-{time.time_ns()}")
        found: dict = {cell: [] for cell in CELLS}
        round_trips: dict = {cell: [] for cell in CELLS if cell[3]}
        requests: dict = {cell: set() for cell in CELLS}
        functions = {"order_status": plugin.order_status.function,
                     "order_status_async": plugin.order_status_async.function}
        specs = {name: [tool.spec()] for name, tool in (("order_status", plugin.order_status),
                                                       ("order_status_async", plugin.order_status_async))}
        try:
            for round_number in range(warmup + rounds):
                for cell in CELLS:
                    kind, tool_name, mode, with_tool = cell
                    server.reset()
                    server.when("", _reply(tool_name))
                    ends: list[float] = []
                    if kind == "ragchat":
                        conversation = Conversation.objects.create(owner=owner, profile=tool_name)
                        text = QUESTION if with_tool else QUESTION + " [no tool]"
                        started = time.perf_counter()
                        message = runner.run(ragchat_turn(conversation, text, streamed=mode == "streamed"))
                        elapsed = (time.perf_counter() - started) * 1000
                        ends = list(plugin.TURN_ENDS.pop())
                    else:
                        loop = direct(client, specs[tool_name], with_tool=with_tool, streamed=mode == "streamed",
                                      function=functions[tool_name], ends=ends) if kind == "direct" else \
                            same_path(chat, specs[tool_name], with_tool=with_tool, streamed=mode == "streamed",
                                      function=functions[tool_name], ends=ends)
                        started = time.perf_counter()
                        message = {"content": runner.run(loop)}
                        elapsed = (time.perf_counter() - started) * 1000
                    if message["content"] != ANSWER or len(ends) != 1 + with_tool:
                        raise RuntimeError(f"{cell}: unexpected answer {message['content']!r} ({len(ends)} calls)")
                    if round_number >= warmup:
                        found[cell].append(elapsed)
                        requests[cell].add(server.count("/chat/completions"))
                        if with_tool:
                            round_trips[cell].append((ends[1] - ends[0]) * 1000)
            traces = _traces()
        finally:
            runner.run(client.close())
            runner.run(sync_to_async(connections.close_all)())
            settings.disable()
    return {"cells": found, "round_trips": round_trips, "requests": requests, "traces": traces, "rounds": rounds}


def _traces() -> dict:
    """The turns' own timings of their tool steps: the tools stage and each call's run."""
    from django_ragchat.models import TurnTrace

    timings: dict = {}
    for data in TurnTrace.objects.values_list("data", flat=True):
        for call in data.get("tools") or ():
            entry = timings.setdefault(call["name"], {"tools stage": [], "call": []})
            entry["call"].append(call["ms"])
            entry["tools stage"].append(data["timings"].get("tools", 0.0))
    return timings


def _paired(cells: dict, kind: str, tool_name: str, mode: str) -> float:
    """The median, over rounds, of (with a call - without) measured in the same round: the
    machine's load drifts less within a round than over the run."""
    plain, tooled = (cells[(kind, tool_name, mode, w)] for w in (False, True))
    return median([t - p for t, p in zip(tooled, plain, strict=True)])


def report(results: dict, database: str) -> str:
    cells, trips = results["cells"], results["round_trips"]
    in_turn = []
    for tool_name in ("order_status", "order_status_async"):
        for mode in ("whole", "streamed"):
            ours, bare, path = (trips[(kind, tool_name, mode, True)] for kind in ("ragchat", "direct", "same path"))
            in_turn.append([f"{tool_name} ({'sync' if tool_name == 'order_status' else 'async'})", mode, median(ours),
                            percentile(ours, 90), median(bare), percentile(bare, 90), median(ours) - median(bare),
                            median(path), percentile(path, 90), median(ours) - median(path)])
    rows = []
    for tool_name in ("order_status", "order_status_async"):
        for mode in ("whole", "streamed"):
            plain, tooled = (median(cells[("ragchat", tool_name, mode, w)]) for w in (False, True))
            bare_plain, bare_tooled = (median(cells[("direct", tool_name, mode, w)]) for w in (False, True))
            ours, bare = (_paired(cells, kind, tool_name, mode) for kind in ("ragchat", "direct"))
            rows.append([f"{tool_name} ({'sync' if tool_name == 'order_status' else 'async'})", mode, plain, tooled,
                         ours, bare_plain, bare_tooled, bare, ours - bare, f"{tooled / bare_tooled:.2f}x"])
    any_cell = next(iter(cells.values()))
    lines = [
        f"A tool round trip in a turn vs the same loop with the bare openai client; {len(any_cell)} rounds per cell",
        f"{database}; {machine()}; load average {os.getloadavg()[0]:.2f}",
        "",
        "The round trip in the turn (ms): from the model's first answer to its second, the tool in between:",
        table(["tool", "mode", "ragchat median", "p90", "direct median", "p90", "added ms", "same path median", "p90",
               "added ms"], in_turn),
        "",
        "Whole turns (ms, medians); round trip = the median over rounds of (1 call - no call) in the same round:",
        table(["tool", "mode", "turn, no call", "turn, 1 call", "round trip", "direct, no call", "direct, 1 call",
               "round trip", "added ms", "turn/direct"], rows),
        "",
        "p99 (ms) of each cell:",
        table(["cell", "n", "median", "p99", "chat requests"],
              [[" ".join(str(x) for x in cell[:3]) + (" +call" if cell[3] else ""), len(ms), median(ms),
                percentile(ms, 99), "/".join(map(str, sorted(results["requests"][cell])))]
               for cell, ms in cells.items()]),
        "",
        "The turns' own timings (ms, medians from the traces): offering the tools (permission checks, "
        "schemas) and the call itself (validation, run, serialisation):",
        table(["tool", "tools stage", "call"],
              [[name, median(t["tools stage"]), median(t["call"])] for name, t in results["traces"].items()]),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=300, help="measured rounds (every cell once per round)")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run in seconds")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.warmup = 5, 2
    with bench_database() as database:
        print(report(run(rounds=args.rounds, warmup=args.warmup), database))


if __name__ == "__main__":
    main()
