"""``ragchat_reembed`` (changing the embedding model without a migration), ``ragchat_index``
and the search system checks, on both databases."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from django_ragchat import search
from django_ragchat.checks import check_search_indexes, check_vector_indexes, pgvector_problem
from django_ragchat.models import Chunk, Conversation, MessageSource
from django_ragchat.turn.pipeline import run_turn_sync

pytestmark = pytest.mark.django_db

# An install of before issue 25 (the hashing embedder) moving to the semantic default.
OLD, NEW = "hashing-v1-384", "wordllama-l2-supercat-256"
QUESTION = "How much does the Aurora X2 cost?"


def run(*args) -> str:
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO())
    return out.getvalue()


def spaces_of(trace) -> set[str]:
    ids = [hit["chunk_id"] for hit in trace["retrieval"][0]["hits"]]
    return set(Chunk.objects.filter(pk__in=ids).values_list("space", flat=True))


@pytest.fixture
def hashing_corpus(db, ragchat_settings_override):
    """The product documents as an install of before issue 25 stored them: the hashing embedder."""
    from django_ragchat.ingestion.pipeline import ingest_text

    from .conftest import PRODUCT_DOCS

    ragchat_settings_override(PROFILES={"default": {"embedder": "hashing"}})
    return [ingest_text(source, text, content_type="markdown") for source, text in PRODUCT_DOCS.items()]


def test_reembed_fills_a_new_space_while_the_old_one_serves_then_switches(hashing_corpus, ragchat_settings_override,
                                                                          user):
    conversation = Conversation.objects.create(owner=user)
    count = Chunk.objects.filter(space=OLD).count()
    assert count > 0

    out = run("ragchat_reembed", "--embedder", "wordllama", "--no-progress")
    assert f"Embedding into space {NEW} (now 0 chunks); other spaces keep serving: {OLD}" in out
    assert "3 created" in out and f"Space {NEW} is complete. Next: point the profile(s)" in out
    assert Chunk.objects.filter(space=NEW).count() == count
    assert sorted(Chunk.objects.filter(space=NEW).values_list("document__source", "ordinal", "text")) == sorted(
        Chunk.objects.filter(space=OLD).values_list("document__source", "ordinal", "text"))
    if connection.vendor == "postgresql":
        assert "HNSW index ragchat_hnsw_wordllama_l2_supercat_256_" in out and search.postgres.hnsw_index_status(NEW).ok

    # The profile still answers from the old space, and its space cannot be dropped.
    before = run_turn_sync(conversation, QUESTION)
    assert spaces_of(before.trace) == {OLD} and "$699" in before.answer
    with pytest.raises(CommandError, match=f"Profile\\(s\\) default still search space {OLD}"):
        run("ragchat_reembed", "--drop-space", OLD)
    assert f"{NEW}: {count} chunks" in run("ragchat_reembed", "--list")

    # Switch: the settings now name the new model (here: name none, the default); no migration.
    ragchat_settings_override(PROFILES={"default": {}})
    after = run_turn_sync(conversation, QUESTION)
    assert spaces_of(after.trace) == {NEW} and "$699" in after.answer
    listing = run("ragchat_reembed", "--list")
    assert f"{OLD}: {count} chunks" in listing and "used by no profile" in listing and "used by default" in listing

    out = run("ragchat_reembed", "--drop-space", OLD)
    assert f"Deleted {count} chunk{'s' if count != 1 else ''} of space {OLD}" in out
    assert not Chunk.objects.filter(space=OLD).exists()
    # Answers that cited the old chunks keep their sources' labels.
    kept = MessageSource.objects.filter(message__conversation=conversation, chunk__isnull=True)
    assert kept.exists() and all(s.source for s in kept)
    if connection.vendor == "postgresql":
        assert search.postgres.hnsw_index_status(OLD, dimensions=384).state == "missing"
    # Running again changes nothing.
    assert "0 created" in run("ragchat_reembed", "--no-progress")


@pytest.mark.parametrize(("args", "message"), [
    (("--options", "{}"), "--options goes with --embedder"),
    (("--embedder", "hashing", "--options", "[1]"), "--options must be a JSON object"),
    (("--embedder", "hashing", "--options", "{"), "--options is not valid JSON"),
    (("--embedder", "hashing", "--options", '{"dimension": 4}'), "dimension must be at least 16"),
    (("--embedder", "nope"), "No embedder named 'nope'"),
    (("--profile", "nope"), "No profile named 'nope'"),
    (("--batch-size", "0"), "--batch-size must be at least 1"),
])
def test_reembed_rejects_bad_arguments(args, message):
    with pytest.raises(CommandError, match=message):
        run("ragchat_reembed", *args)


def test_ragchat_index_repairs_what_this_database_needs(hashing_corpus):
    if connection.vendor == "sqlite":
        # A migration that rebuilds the chunk table (SQLite's ALTER TABLE) drops the triggers.
        with connection.cursor() as cursor:
            cursor.execute('DROP TRIGGER "django_ragchat_chunk_fts_insert"')
        warnings = check_search_indexes(databases=["default"])
        assert [w.id for w in warnings] == ["ragchat.W012"] and "ragchat_index" in warnings[0].hint
        with pytest.raises(CommandError, match="1 index"):
            run("ragchat_index", "--check")
        out = run("ragchat_index")
        assert "no vector index to build" in out and "FTS5 index ok (built from the chunks)" in out
    else:
        assert [w.id for w in check_vector_indexes(databases=["default"])] == ["ragchat.W011"]
        out = run("ragchat_index")
        assert f"{OLD}: " in out and "HNSW index" in out and "built in" in out
    assert check_search_indexes(databases=["default"]) == []
    assert run("ragchat_index", "--check").rstrip().endswith(" ok")
    # New chunks reach the full-text index again.
    document = Chunk.objects.first().document
    Chunk.objects.create(document=document, ordinal=99, space=OLD, text="A sapphire lens.")
    assert [h.ordinal for h in search.fulltext_search(OLD, "sapphire", 3)] == [99]


def test_the_pgvector_check_names_the_install_script():
    assert pgvector_problem(None).startswith("PostgreSQL has no pgvector extension available")
    assert "needs 0.8.0 or later" in pgvector_problem("0.7.4")
    assert pgvector_problem("0.8.0") == "" and pgvector_problem("0.10.1") == ""


def test_a_count_of_chunks_is_said_in_the_singular_or_the_plural():
    # An outside user's trial read "Deleted 1 chunks".
    from django_ragchat.management.commands.ragchat_reembed import _chunks

    assert (_chunks(0), _chunks(1), _chunks(1204)) == ("0 chunks", "1 chunk", "1,204 chunks")
