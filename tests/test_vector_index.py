"""The HNSW index of a space written by small writes (live sync, an upload, a sync of given
objects), not by a command that builds it at the end of a load (docs/postgresql.md).

A new user's trial (F9): a site that only ever saved objects (live sync, the normal path for
model sources) never got the index of its space: ``check`` warned ``ragchat.W011`` and every
vector search scanned the whole space until someone ran ``ragchat_sync`` or ``ragchat_index``.
Now the first small write of a space builds it after its transaction commits, while the space is
small, once per process; what a later save costs does not change. On SQLite nothing changes.

These tests commit (``transactional_db``): the index is built after the commit.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from django_ragchat import search
from django_ragchat.checks import check_vector_indexes
from django_ragchat.models import Chunk, Document, SourceState
from django_ragchat.plugins import embedder_for
from django_ragchat.profiles import get_profile
from django_ragchat.search import postgres
from django_ragchat.sources import get_source, paused, sync
from tests.conftest import grant_document_permissions
from tests.pg import postgres_only  # noqa: F401  (fixture)
from tests.sources_app.models import Article

pytestmark = pytest.mark.django_db(transaction=True)
on_postgres = pytest.mark.usefixtures("postgres_only")


@pytest.fixture
def sources_on(ragchat_settings_override):
    """The test sources, in a space with no index yet: a flush between tests empties the table
    but keeps its indexes."""
    ragchat_settings_override(PLUGINS=["tests.sources_plugin"], PROFILES={"default": {"embedder": "counting"}})
    if connection.vendor == "postgresql":
        postgres.drop_hnsw_index(space())


def space() -> str:
    return embedder_for(get_profile(None)).space


def index_statements(queries) -> list[str]:
    """What a write asked the database about vector indexes."""
    words = ("pg_index", "vector_dims", "CREATE INDEX", "hnsw", "lock_timeout", "maintenance_work_mem")
    return [q["sql"] for q in queries.captured_queries if any(word in q["sql"] for word in words)]


def w011() -> list:
    return [w for w in check_vector_indexes(databases=["default"]) if w.id == "ragchat.W011"]


@pytest.mark.postgres
@on_postgres
def test_live_sync_alone_gives_the_space_its_index_after_the_commit(sources_on):
    with transaction.atomic():
        Article.objects.create(title="Heron lamp", body="The Heron lamp folds flat for travel.")
        assert postgres.hnsw_index_status(space()).state == "missing"  # live sync waits for the commit
    status = postgres.hnsw_index_status(space())
    assert status.ok, status  # the index the vector query's plan uses (tests/test_postgres.py)
    assert w011() == []


def test_a_save_after_the_first_asks_nothing_about_indexes(sources_on):
    """On both databases: the first save of a space in a process may look at (and build) its
    index; every later save issues the statements it issued before this existed."""
    Article.objects.create(title="Ibis lamp", body="The Ibis lamp has three brightness levels.")
    counts = []
    for title in ("Jacana lamp", "Kestrel lamp"):
        with CaptureQueriesContext(connection) as queries:
            Article.objects.create(title=title, body=f"The {title} has three brightness levels.")
        assert index_statements(queries) == []
        counts.append(len(queries.captured_queries))
    assert counts[0] == counts[1]


@pytest.mark.postgres
@on_postgres
def test_a_sync_inside_the_sites_transaction_builds_the_index_after_its_commit(sources_on):
    """Never DDL inside the site's own transaction (a view under ATOMIC_REQUESTS that syncs)."""
    with paused():
        article = Article.objects.create(title="Lark kettle", body="The Lark kettle whistles.")
    with transaction.atomic():
        with CaptureQueriesContext(connection) as queries:
            report = sync(get_source("articles"), pks=[article.pk])
        assert report.counts["created"] == 1 and index_statements(queries) == []
        assert postgres.hnsw_index_status(space()).state == "missing"
    assert postgres.hnsw_index_status(space()).ok


@pytest.mark.postgres
@on_postgres
def test_an_upload_into_a_new_space_gives_it_its_index(sources_on, staff_user):
    client = APIClient()
    client.force_authenticate(grant_document_permissions(staff_user))
    text = b"# Orion Watch\n\nThe Orion Watch costs $249.\n"
    response = client.post("/api/ragchat/documents/", {"file": SimpleUploadedFile("orion.md", text)},
                           format="multipart")
    assert response.status_code == 201, response.json()
    assert postgres.hnsw_index_status(space()).ok and w011() == []


@pytest.mark.postgres
@on_postgres
def test_the_admins_resync_builds_the_index_at_the_end_as_ragchat_sync_does(sources_on, client,
                                                                             django_user_model):
    with paused():
        for n in range(3):
            Article.objects.create(title=f"Atlas {n}", body=f"Atlas volume {n} maps the coast.")
    client.force_login(django_user_model.objects.create_superuser("root", password="pw"))
    client.get("/admin/django_ragchat/sourcestate/")  # lists (and records) the registered sources
    state = SourceState.objects.get(name="articles")
    response = client.post("/admin/django_ragchat/sourcestate/", {"action": "resync", "_selected_action": [state.pk]},
                           follow=True)
    assert "Resynced articles" in response.content.decode()
    assert Chunk.objects.filter(space=space()).count() >= 3
    assert postgres.hnsw_index_status(space()).ok and w011() == []


@pytest.mark.postgres
@on_postgres
def test_a_large_space_without_its_index_is_left_to_ragchat_index(sources_on, caplog):
    """A space that grew without its index (live sync before this change, or chunks written
    another way) is not built in a request: a warning, once per process, and W011 say what to run."""
    embedder = embedder_for(get_profile(None))
    document = Document.objects.create(source="filler.md", checksum="x")
    vectors = np.random.default_rng(5).standard_normal((postgres.AUTO_INDEX_MAX_CHUNKS + 1, embedder.dimension))
    search.store_chunks(Chunk(document=document, ordinal=i, space=space(), embedding=vector, text="filler")
                        for i, vector in enumerate(vectors))
    with caplog.at_level(logging.WARNING, logger="django_ragchat.search.postgres"):
        Article.objects.create(title="Magpie clock", body="The Magpie clock chimes at noon.")
    assert postgres.hnsw_index_status(space()).state == "missing"
    assert "ragchat_index" in caplog.text and space() in caplog.text
    (warning,) = w011()
    assert "ragchat_index" in warning.hint
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="django_ragchat.search.postgres"), \
            CaptureQueriesContext(connection) as queries:
        Article.objects.create(title="Nightjar clock", body="The Nightjar clock glows.")
    assert caplog.text == "" and index_statements(queries) == []
    # ragchat_index, once, and the space is indexed.
    assert postgres.build_missing_hnsw_indexes() == [(space(), pytest.approx(0, abs=60))]
    assert w011() == []


@pytest.mark.postgres
@on_postgres
def test_a_build_that_would_wait_for_a_long_transaction_gives_up_and_the_save_stands(sources_on, caplog):
    """The build waits at most AUTO_INDEX_LOCK_TIMEOUT for the chunk table (here held by another
    connection's open transaction), then leaves the space to ragchat_index; the save is not failed."""
    other = connection.get_new_connection(connection.get_connection_params())
    try:
        with other.cursor() as cursor:  # a transaction that writes chunks, still open
            cursor.execute(f"LOCK TABLE {Chunk._meta.db_table} IN ROW EXCLUSIVE MODE")
        with caplog.at_level(logging.WARNING, logger="django_ragchat.search.postgres"):
            started = time.monotonic()
            article = Article.objects.create(title="Osprey kettle", body="The Osprey kettle pours without drips.")
            waited = time.monotonic() - started
    finally:
        other.rollback()
        other.close()
    assert 1.5 < waited < 10, waited
    assert Document.objects.filter(origin="articles", object_pk=str(article.pk)).exists()
    assert postgres.hnsw_index_status(space()).state == "missing"
    assert "lock timeout" in caplog.text and "ragchat_index" in caplog.text
    assert [w.id for w in w011()] == ["ragchat.W011"]
