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


@pytest.mark.django_db(transaction=True)
def test_a_turn_keeps_its_lanes_connection_while_other_turns_use_the_lane(ragchat_settings_override):
    """A burst: more turns than lanes. A turn starting on a lane that other turns are using
    (``transport.close_stale_connections``) keeps the lane's connection instead of opening one
    per turn; alone on its lane it closes it by ``CONN_MAX_AGE`` (0 here), as Django does at the
    end of a request, except a SQLite connection, which holds nothing on a server and is kept."""
    from django.db import connection

    from django_ragchat.models import Conversation
    from django_ragchat.transport.turns import close_stale_connections

    ragchat_settings_override(DATABASE_THREADS=2)

    def start_turn() -> tuple[bool, bool]:
        Conversation.objects.count()  # this lane's connection is open
        before = connection.connection
        close_stale_connections()
        return lanes.shared(), connection.connection is before

    async def turns(count: int) -> list[tuple[bool, bool]]:
        inside, done = asyncio.Barrier(count), asyncio.Barrier(count)

        async def turn():
            async with database_lane():
                await inside.wait()  # every turn holds its lane now...
                found = await sync_to_async(start_turn)()
                await done.wait()  # ...until every turn has started
            return found

        return list(await asyncio.gather(*(turn() for _ in range(count))))

    try:
        assert asyncio.run(turns(4)) == [(True, True)] * 4  # two turns on each lane
        assert asyncio.run(turns(1)) == [(False, connection.vendor == "sqlite")]
        assert not lanes.shared()  # not a lane's thread
    finally:
        lanes.close_connections()
