"""Database lanes (django_ragchat.turn.lanes): concurrent blocks get different threads, one block
keeps one thread, and an outer ``async_to_sync`` (a test's transaction, WSGI) keeps its own."""

import asyncio
import threading

import pytest
from asgiref.sync import async_to_sync, sync_to_async

from django_ragchat.turn import lanes
from django_ragchat.turn.lanes import database_lane

pytestmark = pytest.mark.skipif(not lanes.SUPPORTED, reason="asgiref < 3.13: lanes are off by design")


async def _blocks(count: int) -> list[set[int]]:
    """Run ``count`` lanes at once, each making three thread-sensitive calls while all are
    open; return the threads each block's calls ran on."""
    inside = asyncio.Barrier(count)

    async def block() -> set[int]:
        seen = set()
        async with database_lane():
            seen.add(await sync_to_async(threading.get_ident)())
            await inside.wait()  # every block is open now: none can reuse a finished one's lane
            seen.add(await sync_to_async(threading.get_ident)())
            seen.add(await sync_to_async(threading.get_ident)())
        return seen

    return list(await asyncio.gather(*(block() for _ in range(count))))


def test_concurrent_blocks_run_on_different_threads_and_each_block_on_one(ragchat_settings_override):
    ragchat_settings_override(DATABASE_THREADS=3)
    threads = asyncio.run(_blocks(3))
    assert all(len(seen) == 1 for seen in threads), threads
    used = {t for seen in threads for t in seen}
    assert len(used) == 3
    assert threading.get_ident() not in used


def test_more_blocks_than_lanes_share_the_lanes(ragchat_settings_override):
    ragchat_settings_override(DATABASE_THREADS=2)
    threads = asyncio.run(_blocks(4))
    assert all(len(seen) == 1 for seen in threads), threads
    assert len({t for seen in threads for t in seen}) == 2


def test_one_thread_when_lanes_are_off(ragchat_settings_override):
    ragchat_settings_override(DATABASE_THREADS=1)
    threads = asyncio.run(_blocks(3))
    assert len({t for seen in threads for t in seen}) == 1


def test_an_outer_async_to_sync_keeps_the_work_on_its_thread(ragchat_settings_override):
    """Tests run turns in their own thread and transaction (``db`` fixture), and WSGI's
    ``run_turn_sync`` relies on the same: lanes must not move that work elsewhere."""
    ragchat_settings_override(DATABASE_THREADS=4)
    threads = async_to_sync(_blocks)(2)
    assert {t for seen in threads for t in seen} == {threading.get_ident()}


def test_a_failing_block_gives_its_lane_back(ragchat_settings_override):
    ragchat_settings_override(DATABASE_THREADS=2)

    async def failing():
        async with database_lane():
            await sync_to_async(threading.get_ident)()
            raise ValueError("boom")

    with pytest.raises(ValueError):
        asyncio.run(failing())
    assert lanes._lanes.busy[:2] == [0, 0]
