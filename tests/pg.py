"""PostgreSQL-only tests: skipped on SQLite, but an error when ``RAGCHAT_REQUIRE_POSTGRES=1``.

CI runs the suite a second time with ``DATABASE_URL=postgres://...`` and
``RAGCHAT_REQUIRE_POSTGRES=1`` (scripts/test.sh): there a PostgreSQL test that would skip
fails instead, so a misconfigured run cannot pass by skipping them. Mark a test (or module)
with ``@pytest.mark.postgres`` and use the ``postgres_only`` fixture, or call
``require_postgres()`` at its start; a conftest can call ``check_postgres_marker(item)`` from
``pytest_runtest_setup`` to apply the marker suite-wide.
"""

from __future__ import annotations

import os

import pytest
from django.db import connection

REQUIRE_ENV = "RAGCHAT_REQUIRE_POSTGRES"


def postgres_required() -> bool:
    return os.environ.get(REQUIRE_ENV) == "1"


def require_postgres() -> None:
    """Skip the calling test unless the tests run on PostgreSQL (fail instead when required)."""
    if connection.vendor == "postgresql":
        return
    reason = "needs PostgreSQL with pgvector (DATABASE_URL=postgres://...)"
    if postgres_required():
        pytest.fail(f"{REQUIRE_ENV}=1 but the tests run on {connection.vendor}: this test {reason}.", pytrace=False)
    pytest.skip(reason)


def check_postgres_marker(item) -> None:
    """``require_postgres()`` for a test item marked ``postgres``."""
    if item.get_closest_marker("postgres") is not None:
        require_postgres()


@pytest.fixture
def postgres_only(request):
    check_postgres_marker(request.node)
    require_postgres()
