"""The start gate (django_ragchat.turn.start_gate): at most ``STARTING_TURNS`` turns of a process
before their model at once, let through in arrival order; a place is given back at the model
call or when the turn ends before it."""

from __future__ import annotations

import asyncio
import threading

import pytest
from asgiref.sync import async_to_sync

from django_ragchat.checks import check_settings
from django_ragchat.events import Delta
from django_ragchat.models import Conversation, Message
from django_ragchat.transport.turns import TurnRefused, turn_events
from django_ragchat.turn import start_gate
from django_ragchat.turn.pipeline import run_turn_sync
from django_ragchat.turn.sync_bridge import background_loop

QUESTION = "How much does the Aurora X2 cost?"


async def _through_the_gate(count: int, *, call_model: bool) -> tuple[list[int], int]:
    """``count`` turns arriving one after the other: the order they passed in and the most that
    were between the gate and their model at once."""
    order: list[int] = []
    inside = most = 0

    async def turn(i: int) -> None:
        nonlocal inside, most
        async with start_gate.passing():
            order.append(i)
            inside += 1
            most = max(most, inside)
            await asyncio.sleep(0.01)  # the work before the model
            inside -= 1
            if call_model:
                start_gate.model_called()
                await asyncio.sleep(0.05)  # the model writes; the place is already back

    tasks = []
    for i in range(count):
        tasks.append(asyncio.ensure_future(turn(i)))
        await asyncio.sleep(0)  # arrives after the one before
    await asyncio.gather(*tasks)
    return order, most


@pytest.mark.parametrize("call_model", [True, False], ids=["model called", "ended before the model"])
def test_turns_pass_in_arrival_order_and_at_most_the_setting_at_once(ragchat_settings_override, call_model):
    ragchat_settings_override(STARTING_TURNS=3)
    order, most = asyncio.run(_through_the_gate(12, call_model=call_model))
    assert order == list(range(12))
    assert most == 3


def test_a_place_comes_back_at_the_model_call_not_at_the_end_of_the_turn(ragchat_settings_override):
    ragchat_settings_override(STARTING_TURNS=1)

    async def main() -> list[str]:
        seen: list[str] = []
        model_may_end = asyncio.Event()

        async def first() -> None:
            async with start_gate.passing():
                start_gate.model_called()
                seen.append("first at its model")
                await model_may_end.wait()  # a long answer
            seen.append("first ended")

        async def second() -> None:
            async with start_gate.passing():
                seen.append("second passed")
                model_may_end.set()

        await asyncio.wait_for(asyncio.gather(first(), second()), timeout=5)
        return seen

    assert asyncio.run(main()) == ["first at its model", "second passed", "first ended"]


def test_zero_is_no_gate(ragchat_settings_override):
    ragchat_settings_override(STARTING_TURNS=0)
    order, most = asyncio.run(_through_the_gate(12, call_model=False))
    assert most == 12 and sorted(order) == list(range(12))


@pytest.mark.parametrize("value", [-1, "8", True, 2.5])
def test_a_bad_setting_is_a_check_error_and_turns_still_run(ragchat_settings_override, value):
    ragchat_settings_override(STARTING_TURNS=value)
    errors = check_settings()
    assert [e.id for e in errors] == ["ragchat.E007"]
    assert "STARTING_TURNS" in errors[0].msg
    assert start_gate.size() == 0  # no gate until it is fixed


def test_zero_and_the_default_pass_the_check(ragchat_settings_override):
    assert start_gate.size() == 8 and check_settings() == []
    ragchat_settings_override(STARTING_TURNS=0)
    assert check_settings() == []


# --- real turns, in-process, against the loopback model server ---------------------------------


def within(coroutine, seconds: float):
    async def run():
        return await asyncio.wait_for(coroutine, timeout=seconds)

    return run


@pytest.mark.django_db
def test_a_turn_lets_the_next_one_start_while_its_model_still_writes(
    ragchat_settings_override, product_corpus, user, openai_server
):
    """With one place, a second turn reaches the model while the first one's answer is held
    half-written: the first gave its place back when it called the model."""
    ragchat_settings_override(STARTING_TURNS=1, PROFILES={"default": {"llm": "openai", "options": {"openai": {
        "base_url": openai_server.base_url, "max_retries": 0, "timeout": 10}}}})
    openai_server.when("", " ".join(f"word{i}" for i in range(20)))
    openai_server.hold_streams(after_tokens=2)
    first, second = (Conversation.objects.create(owner=user) for _ in range(2))

    async def main() -> tuple[list, list]:
        first_events: list = []
        second_events: list = []

        async def run(conversation, events) -> None:
            async for event in turn_events(conversation, QUESTION, user=user, session_key=None, stream=True):
                events.append(event)

        one = asyncio.ensure_future(run(first, first_events))
        while not any(isinstance(e, Delta) for e in first_events):
            await asyncio.sleep(0.01)
        two = asyncio.ensure_future(run(second, second_events))
        while not any(isinstance(e, Delta) for e in second_events):  # it got past the gate
            await asyncio.sleep(0.01)
            assert not one.done() and not two.done()
        openai_server.release_streams()
        await asyncio.wait_for(asyncio.gather(one, two), timeout=10)
        return first_events, second_events

    first_events, second_events = async_to_sync(within(main(), 20))()
    assert first_events[-1].type == "done" and second_events[-1].type == "done"
    assert openai_server.count("chat/completions") == 2


@pytest.mark.django_db
def test_a_refused_turn_gives_its_place_back(ragchat_settings_override, product_corpus, user):
    ragchat_settings_override(STARTING_TURNS=1)
    conversation = Conversation.objects.create(owner=user)

    async def main() -> list:
        for _ in range(3):
            with pytest.raises(TurnRefused):
                async for _event in turn_events(conversation, "", user=user, session_key=None):
                    pass
        return [event async for event in turn_events(conversation, QUESTION, user=user, session_key=None)]

    events = async_to_sync(within(main(), 20))()
    assert events[-1].type == "done"



@pytest.mark.django_db(transaction=True)
def test_a_whole_answer_turn_waits_at_the_gate_of_its_loop(ragchat_settings_override, product_corpus, conversation):
    """``run_turn_sync`` (the REST API's whole answers, management commands) passes the gate of
    the process's background loop, as the streamed turns on that loop do."""
    ragchat_settings_override(STARTING_TURNS=1)
    held, release = threading.Event(), threading.Event()

    async def another_turn_before_its_model() -> None:
        async with start_gate.passing():
            held.set()
            while not release.is_set():
                await asyncio.sleep(0.01)

    holder = asyncio.run_coroutine_threadsafe(another_turn_before_its_model(), background_loop())
    assert held.wait(5)
    results = []
    turn = threading.Thread(target=lambda: results.append(run_turn_sync(conversation, QUESTION)))
    turn.start()
    turn.join(0.5)
    assert turn.is_alive() and not Message.objects.exists()  # waiting at the gate: nothing saved yet
    release.set()
    holder.result(5)
    turn.join(20)
    assert results and results[0].status == "complete" and "$699" in results[0].answer
