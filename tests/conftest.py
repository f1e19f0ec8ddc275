"""Shared fixtures: a small product corpus, users, conversations, and a clean plugin state."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from django.test import override_settings

from django_ragchat import plugins
from django_ragchat.search import postgres
from django_ragchat.search.vectorindex import vector_index

# Nothing in the system's temp folder (README): pytest's own directories (tmp_path, the
# servers' logs) go to var/pytest-of-<user>/ in the checkout (pytest keeps the last three runs
# there, as it would in /tmp), and what anything else writes to TMPDIR (this process, the
# servers, browsers and tools the tests start) to var/tmp/. Set before pytest makes its first
# temporary directory (``--basetemp`` still chooses another place for pytest's own).
VAR = Path(__file__).resolve().parent.parent / "var"
(VAR / "tmp").mkdir(parents=True, exist_ok=True)
os.environ["PYTEST_DEBUG_TEMPROOT"] = str(VAR)
os.environ["TMPDIR"] = str(VAR / "tmp")
tempfile.tempdir = None  # read TMPDIR again

# The loopback OpenAI-compatible server fixtures (openai_server, openai_server_session), and
# the server processes of the streaming tests (asgi, wsgi, redis_workers).
pytest_plugins = ["django_ragchat.testing.pytest_plugin", "tests.live_servers"]

PRODUCT_DOCS = {
    "products/aurora-x2.md": """# Aurora X2

## Overview
The Aurora X2 is a 6.1-inch phone with a titanium frame, a 48 MP camera and a battery that lasts two days.

## Pricing
The Aurora X2 costs $699 with 128 GB of storage. The 256 GB model costs $799.
""",
    "products/nimbus-tab.md": """# Nimbus Tab

## Overview
The Nimbus Tab is an 11-inch tablet for drawing and reading, with a matte screen.

## Pricing
How much does it cost? The Nimbus Tab costs $449; the bundle with the stylus costs $529.
""",
    "products/zephyr-buds.md": """# Zephyr Buds

## Overview
Zephyr Buds are wireless earbuds with noise cancelling and eight hours of playback.

## Warranty
Zephyr Buds come with a two-year warranty that covers battery failure.
""",
}


# What a test may not ask for when it says its database is its own.
DATABASE_FIXTURES = {"db", "transactional_db", "live_server"}


def pytest_collection_modifyitems(config, items):
    """On SQLite, PostgreSQL-only tests are deselected (they run in the PostgreSQL pass of
    scripts/test.sh), so the SQLite pass reports no skips. With RAGCHAT_REQUIRE_POSTGRES=1 they
    are kept, and fail if the database is not PostgreSQL (tests/pg.py).

    On PostgreSQL, ``own_database`` tests are deselected: their sites run on SQLite files of
    their own whatever the pass, so the PostgreSQL pass would run them a second time for
    nothing. A test marked so that touches the pass's database is a collection error."""
    from django.conf import settings

    for item in items:
        if item.get_closest_marker("own_database") is not None:
            used = DATABASE_FIXTURES.intersection(getattr(item, "fixturenames", ()))
            if used or item.get_closest_marker("django_db") is not None:
                raise pytest.UsageError(f"{item.nodeid} is marked own_database but uses the test database "
                                        f"({', '.join(sorted(used)) or 'django_db'})")
    on_postgres = "postgresql" in settings.DATABASES["default"]["ENGINE"]
    _deselect_pairwise_elsewhere(config, items, on_postgres)
    if on_postgres or os.environ.get("RAGCHAT_REQUIRE_POSTGRES") == "1":
        left_out = "own_database" if on_postgres else None
    else:
        left_out = "postgres"
    if left_out is None:
        return
    deselected = [item for item in items if item.get_closest_marker(left_out) is not None]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item.get_closest_marker(left_out) is None]


def _deselect_pairwise_elsewhere(config, items, on_postgres: bool) -> None:
    """With RAGCHAT_TEST_PAIRWISE=1 (scripts/test.sh), a test marked ``pairwise`` runs in two of
    the four passes, Django 5.x on PostgreSQL and Django 6.x on SQLite: each Django version and
    each database once. ``pairwise(crossed=True)`` runs in the other two (Django 5.x on SQLite,
    6.x on PostgreSQL), so the heavy tests are shared out over all four passes instead of
    lengthening two of them. Without it (a developer's own run) every pairwise test runs."""
    import django

    if os.environ.get("RAGCHAT_TEST_PAIRWISE") != "1":
        return
    crossed_here = (django.VERSION[0] >= 6) == on_postgres

    def elsewhere(item) -> bool:
        marker = item.get_closest_marker("pairwise")
        return marker is not None and bool(marker.kwargs.get("crossed")) != crossed_here

    deselected = [item for item in items if elsewhere(item)]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if not elsewhere(item)]


@pytest.fixture(autouse=True)
def _fresh_plugin_state():
    """Every test starts with plugins and component instances built from its own settings, and
    looks at the vector indexes of its spaces afresh (``postgres.index_when_committed``)."""
    plugins.reset()
    vector_index.clear()
    postgres.forget_indexes_looked_at()
    yield
    plugins.reset()
    vector_index.clear()
    postgres.forget_indexes_looked_at()


@pytest.fixture
def ragchat_settings_override():
    """``ragchat_settings_override(**RAGCHAT)``: run the test with these RAGCHAT settings."""
    overrides = []

    def apply(**values):
        from django.conf import settings

        merged = {**getattr(settings, "RAGCHAT", {}), **values}
        override = override_settings(RAGCHAT=merged)
        override.enable()
        overrides.append(override)
        return merged

    yield apply
    for override in reversed(overrides):
        override.disable()


class LimitsClock:
    """The clock ``limits`` reads, stopped at ``now`` (seconds since the epoch) until moved."""

    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def at(self, minute: int, second: float) -> LimitsClock:
        """Set the clock ``second`` seconds into ``minute`` (minutes since the epoch)."""
        self.now = minute * 60 + second
        return self

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def limits_clock(monkeypatch):
    """Stop the limits' clock (``limits.clock``) at the start of a minute, to move it by hand:
    the rate limit's tests need not wait for, nor race, the minute boundaries."""
    from django_ragchat.turn import limits

    clock = LimitsClock(29_000_000 * 60)
    monkeypatch.setattr(limits, "clock", clock)
    return clock


@pytest.fixture
def product_corpus(db):
    """The three product documents, ingested with the default profile's embedder."""
    from django_ragchat.ingestion.pipeline import ingest_text

    return [ingest_text(source, text, content_type="markdown") for source, text in PRODUCT_DOCS.items()]


@pytest.fixture
def user(django_user_model):
    return django_user_model.objects.create_user("alice", password="pw")


@pytest.fixture
def other_user(django_user_model):
    return django_user_model.objects.create_user("bob", password="pw")


@pytest.fixture
def staff_user(django_user_model):
    return django_user_model.objects.create_user("staff", password="pw", is_staff=True)


@pytest.fixture
def reviewer(staff_user):
    """``staff_user`` in the group ``ragchat_admin_group`` makes: staff who may read other users'
    conversations, memory and feedback (being staff alone does not)."""
    import io

    from django.core.management import call_command

    call_command("ragchat_admin_group", "--add", staff_user.username, stdout=io.StringIO())
    return type(staff_user).objects.get(pk=staff_user.pk)  # no permission cache from before


def grant_document_permissions(user):
    """``user`` with ``django_ragchat.add_document`` and ``delete_document`` (what
    ``ragchat_admin_group --documents`` adds), fetched again: no permission cache from before."""
    from django.apps import apps
    from django.contrib.auth.management import create_permissions
    from django.contrib.auth.models import Permission

    create_permissions(apps.get_app_config("django_ragchat"), verbosity=0)  # after a flush too
    permissions = Permission.objects.filter(content_type__app_label="django_ragchat",
                                            codename__in=["add_document", "delete_document"])
    assert len(permissions) == 2
    user.user_permissions.add(*permissions)
    return type(user).objects.get(pk=user.pk)


@pytest.fixture
def uploader(staff_user):
    """``staff_user`` with the admin's document permissions: may upload and delete documents
    over the API (``DOCUMENT_PERMISSION``'s default, ``may_manage_documents``)."""
    return grant_document_permissions(staff_user)


@pytest.fixture
def conversation(user):
    from django_ragchat.models import Conversation

    return Conversation.objects.create(owner=user)


@pytest.fixture(scope="session", autouse=True)
def lane_connections_closed(django_db_setup, django_db_blocker):
    """Close the database lanes' connections (``django_ragchat.turn.lanes``) at the end of the
    session, before the test database is dropped: PostgreSQL refuses to drop a database that
    a lane thread is still connected to. The connections of threads a test started and that
    ended without closing theirs (a reader thread signing a user in) are freed too: a dead
    thread's DatabaseWrapper sits in a reference cycle, so its connection stays open until the
    cyclic garbage collector runs."""
    yield
    import gc

    from django_ragchat.turn import lanes

    with django_db_blocker.unblock():
        lanes.close_connections()
    gc.collect()
    # A thread still alive holds its connection too: asgiref's executor thread that served a
    # streamed response to the test client (the server-sent events refusal in
    # test_wrong_results). Its driver connection is closed under it; Django's close() would refuse
    # from another thread.
    import threading

    from django.db.backends.base.base import BaseDatabaseWrapper

    for wrapper in [o for o in gc.get_objects() if type(o).__mro__.count(BaseDatabaseWrapper)]:
        raw = wrapper.__dict__.get("connection")
        if raw is not None and wrapper.vendor == "postgresql" and wrapper._thread_ident != threading.get_ident():
            raw.close()
