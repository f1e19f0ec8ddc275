"""pytest fixtures around :class:`~django_ragchat.testing.openai_server.FakeOpenAIServer`.

Enable in a root ``conftest.py``::

    pytest_plugins = ["django_ragchat.testing.pytest_plugin"]

One server is started per test session (starting is cheap, but sharing keeps
keep-alive connections and ports stable); ``openai_server`` resets it around
every test so scripts, rules, faults and records never leak between tests.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from django_ragchat.testing.openai_server import FakeOpenAIServer

__all__ = ["openai_server", "openai_server_session"]


@pytest.fixture(scope="session")
def openai_server_session() -> Iterator[FakeOpenAIServer]:
    """The session-wide server, started once and stopped at the end. Not reset."""
    with FakeOpenAIServer() as server:
        yield server


@pytest.fixture
def openai_server(openai_server_session: FakeOpenAIServer) -> Iterator[FakeOpenAIServer]:
    """The session server, freshly reset for this test; use ``.base_url`` to connect."""
    openai_server_session.reset()
    yield openai_server_session
    openai_server_session.reset()
