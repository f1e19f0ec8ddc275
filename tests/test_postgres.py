"""PostgreSQL + pgvector only: HNSW indexes per embedding space (and the plans that use them),
``ef_search``, halfvec and unindexable spaces, the migration's full-text column, COPY, the
server-side-binding path, and the database system checks.

Skipped on SQLite; an error there when RAGCHAT_REQUIRE_POSTGRES=1 (tests/pg.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

from django_ragchat import search
from django_ragchat.access import UNRESTRICTED
from django_ragchat.checks import check_search_indexes, check_vector_indexes
from django_ragchat.models import Chunk, Document
from django_ragchat.search import postgres
from tests.pg import postgres_only  # noqa: F401  (fixture)

pytestmark = [pytest.mark.postgres, pytest.mark.usefixtures("postgres_only")]

WORDS = ("battery screen price warranty camera tablet phone stylus charger cable speaker display "
         "storage memory audio wireless pricing shipping refund colour").split()


def clustered(n: int, dimensions: int, *, clusters: int = 20, seed: int = 0) -> np.ndarray:
    """Unit vectors around ``clusters`` centres, like real embeddings (not uniform noise). The
    centres depend on ``dimensions`` only, so vectors of another ``seed`` (queries) come from
    the same distribution as the stored ones."""
    centres = np.random.default_rng(dimensions).standard_normal((clusters, dimensions)).astype(np.float32)
    rng = np.random.default_rng(seed)
    vectors = centres[rng.integers(0, clusters, n)] + 0.35 * rng.standard_normal((n, dimensions)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def fill(space: str, vectors: np.ndarray, *, documents: int = 10) -> None:
    """Store ``vectors`` as chunks of ``space`` spread over ``documents`` documents."""
    rng = np.random.default_rng(len(vectors))
    docs = [Document.objects.get_or_create(source=f"doc-{i}.md", defaults={"checksum": "x"})[0]
            for i in range(documents)]
    search.store_chunks(
        Chunk(document=docs[i % documents], ordinal=i, space=space, embedding=vector,
              text=" ".join(rng.choice(WORDS, 12)), metadata={"lang": "en", "n": i % 7})
        for i, vector in enumerate(vectors)
    )


def explain(settings: list[str], sql: str, params: list) -> str:
    with connection.cursor() as cursor:
        for statement in settings:
            cursor.execute(statement)
        cursor.execute("EXPLAIN " + sql, params)
        return "\n".join(row[0] for row in cursor.fetchall())


@pytest.fixture
def indexed(db):
    """5,000 chunks of 64 dimensions in space "test-64" with its HNSW index, and 300 of 32
    dimensions in "test-32" (which the 64-dimension cast must never touch), analysed."""
    vectors = clustered(5000, 64)
    fill("test-64", vectors)
    fill("test-32", clustered(300, 32, seed=1))
    for space in ("test-64", "test-32"):
        status, created = postgres.create_hnsw_index(space)
        assert created and status.ok, status
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE django_ragchat_chunk")
    return vectors


def test_the_vector_query_uses_the_spaces_hnsw_index(indexed):
    query = clustered(1, 64, seed=9)[0]
    plan = explain(*postgres.vector_query("test-64", query, 10, ef_search=40))
    assert f"Index Scan using {postgres.hnsw_index_name('test-64')}" in plan, plan
    # With a filter too: pgvector 0.8 scans the index iteratively until 10 rows pass.
    settings, sql, params = postgres.vector_query("test-64", query, 10, filters=search.SearchFilters.parse(
        {"metadata": {"lang": "en"}}))
    assert "SET LOCAL hnsw.iterative_scan = relaxed_order" in settings
    plan = explain(settings, sql, params)
    assert f"Index Scan using {postgres.hnsw_index_name('test-64')}" in plan, plan
    # The exact query matches no index expression.
    plan = explain(*postgres.vector_query("test-64", query, 10, exact=True))
    assert "hnsw" not in plan and "Seq Scan" in plan, plan
    # The other space has its own index.
    plan = explain(*postgres.vector_query("test-32", clustered(1, 32, seed=9)[0], 10))
    assert f"Index Scan using {postgres.hnsw_index_name('test-32')}" in plan, plan


def test_hnsw_results_agree_with_exact_search(indexed):
    queries = clustered(20, 64, seed=5)
    recall = []
    for query in queries:
        exact = [cid for cid, _ in search.vector_ids("test-64", query, 10, exact=True)]
        approximate = search.vector_search("test-64", query, 10, ef_search=100)
        assert [h.score for h in approximate] == sorted((h.score for h in approximate), reverse=True)
        recall.append(len(set(exact) & {h.chunk_id for h in approximate}) / 10)
    assert np.mean(recall) >= 0.95, recall
    # Filtered HNSW search still returns k rows, every one passing the filter.
    hits = search.vector_search("test-64", queries[0], 10, filters={"metadata": {"n": 3}})
    assert len(hits) == 10 and {h.metadata["n"] for h in hits} == {3}


def test_ef_search_is_set_for_the_query_alone_and_never_below_k(indexed):
    query = clustered(1, 64, seed=3)[0]
    with CaptureQueriesContext(connection) as captured:
        search.vector_search("test-64", query, 10, ef_search=100, principals=UNRESTRICTED)
        search.vector_search("test-64", query, 10, ef_search=100)
    assert captured.captured_queries[0]["sql"].startswith("SET LOCAL hnsw.ef_search = 100; SELECT")
    # A search that reads as someone (here, outside a turn, the public) keeps scanning the index
    # until k rows they may read are found.
    assert captured.captured_queries[1]["sql"].startswith(
        "SET LOCAL hnsw.ef_search = 100; SET LOCAL hnsw.iterative_scan = relaxed_order; SELECT")
    # The index yields at most ef_search rows: asking for 60 raises it to 60.
    assert len(search.vector_search("test-64", query, 60, ef_search=20)) == 60
    assert len(search.vector_ids("test-64", query, 60)) == 60


@pytest.mark.django_db(transaction=True)
def test_set_local_does_not_outlive_the_query():
    fill("test-8", clustered(50, 8))
    for ef_search in (7, 300):
        assert len(search.vector_search("test-8", clustered(1, 8, seed=2)[0], 5, ef_search=ef_search)) == 5
        with connection.cursor() as cursor:
            cursor.execute("SHOW hnsw.ef_search")
            assert cursor.fetchone()[0] == "40"


@pytest.mark.django_db(transaction=True)
def test_server_side_binding_connections_take_the_transaction_path():
    fill("test-8", clustered(50, 8))
    settings = {**connection.settings_dict, "OPTIONS": {**connection.settings_dict["OPTIONS"],
                                                        "server_side_binding": True}}
    other = connections["default"].__class__(settings, alias="server_side")
    connections["server_side"] = other
    try:
        query = clustered(1, 8, seed=4)[0]
        expected = search.vector_search("test-8", query, 5, ef_search=64)
        assert search.vector_search("test-8", query, 5, ef_search=64, using="server_side") == expected
        with other.cursor() as cursor:
            assert not type(cursor.cursor).__name__.startswith("Client")
            cursor.execute("SHOW hnsw.ef_search")
            assert cursor.fetchone()[0] == "40"
    finally:
        other.close()
        del connections["server_side"]


def test_spaces_above_2000_dimensions_are_indexed_as_halfvec(db):
    vectors = clustered(200, 2048)
    fill("big-2048", vectors)
    status, created = postgres.create_hnsw_index("big-2048")
    assert created and status.ok and "halfvec(2048)) halfvec_cosine_ops" in status.definition
    settings, sql, params = postgres.vector_query("big-2048", vectors[17], 5)
    plan = explain(["SET LOCAL enable_sort = off", *settings], sql, params)  # 200 rows: force the plan
    assert f"Index Scan using {status.name}" in plan, plan
    hits = search.vector_search("big-2048", vectors[17], 5)
    assert hits[0].ordinal == 17 and hits[0].score == pytest.approx(1.0, abs=1e-3)  # halfvec precision


def test_spaces_above_4000_dimensions_are_searched_exactly(db):
    vectors = clustered(5, 4096)
    fill("huge-4096", vectors)
    assert postgres.hnsw_index_status("huge-4096").state == "unindexable"
    with pytest.raises(ValueError, match="at most 4000"):
        postgres.create_hnsw_index("huge-4096")
    assert [h.ordinal for h in search.vector_search("huge-4096", vectors[3], 2)][0] == 3
    call_command("ragchat_index", stdout=(out := _Buffer()))
    assert "huge-4096: 5 chunks, 4096 dimensions: too many dimensions for HNSW; searched exactly" in out.text


def test_a_mismatched_or_invalid_index_is_rebuilt(db):
    fill("test-8", clustered(50, 8))
    connection.check_constraints()  # the rows' deferred checks, which CREATE INDEX refuses to run with
    with connection.cursor() as cursor:  # an index of the right name built for another dimension
        cursor.execute(postgres.hnsw_index_sql("test-8", 8).replace("vector(8)", "vector(9)").replace(
            "WHERE space = 'test-8'", "WHERE space = 'none'"))
    assert postgres.hnsw_index_status("test-8").state == "mismatch"
    status, created = postgres.create_hnsw_index("test-8")
    assert created and status.ok
    assert postgres.create_hnsw_index("test-8") == (status, False)
    assert postgres.create_hnsw_index("test-8", rebuild=True)[1] is True


class _Buffer:
    def __init__(self):
        self.text = ""

    def write(self, value):
        self.text += value

    def flush(self):
        pass


def test_ragchat_index_creates_verifies_and_reports(db, ragchat_settings_override):
    ragchat_settings_override(PROFILES={"default": {}, "plain": {"retrievers": ["fulltext"],
                                                                 "options": {"fulltext": {"config": "simple"}}}})
    fill("test-64", clustered(300, 64))
    sapphire = Chunk.objects.create(document=Document.objects.first(), ordinal=999, space="test-64",
                                    text="A sapphire display", embedding=clustered(1, 64)[0])
    with pytest.raises(CommandError, match=r"2 index\(es\) missing"):
        call_command("ragchat_index", "--check", stdout=_Buffer())
    out = _Buffer()
    call_command("ragchat_index", stdout=out)
    assert f"test-64: 301 chunks, 64 dimensions: HNSW index {postgres.hnsw_index_name('test-64')} (vector) built" in out.text
    assert "full text (english): GIN index ragchat_chunk_search_vector ok" in out.text
    assert "full text (simple): GIN index ragchat_fts_simple ok" in out.text
    out = _Buffer()
    call_command("ragchat_index", "--check", stdout=out)
    assert f"HNSW index {postgres.hnsw_index_name('test-64')} ok" in out.text
    with pytest.raises(CommandError, match="No chunks in space"):
        call_command("ragchat_index", "--space", "nope", stdout=_Buffer())
    # The "simple" configuration's searches use its expression index.
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE django_ragchat_chunk")
    plan = explain([], *postgres.fulltext_query("test-64", ["sapphire"], 5, config="simple"))
    assert "Bitmap Index Scan on ragchat_fts_simple" in plan, plan
    assert [h.chunk_id for h in search.fulltext_search("test-64", "sapphire", 3, config="simple")] == [sapphire.pk]


def test_checks_report_a_space_without_index_until_ragchat_index(db):
    fill("test-64", clustered(100, 64))
    warnings = [w for w in check_vector_indexes(databases=["default"]) if w.id == "ragchat.W011"]
    assert len(warnings) == 1 and "'test-64' has 100 chunks but its HNSW index is missing" in warnings[0].msg
    assert "ragchat_index" in warnings[0].hint
    call_command("ragchat_index", stdout=_Buffer())
    assert check_vector_indexes(databases=["default"]) == []
    assert check_search_indexes(databases=["default"]) == []


def test_this_server_passes_the_pgvector_check(db):
    available, installed = postgres.pgvector_versions()
    assert postgres.parse_version(installed) >= postgres.MIN_PGVECTOR_VERSION and available
    assert [e for e in check_search_indexes(databases=["default"]) if e.id == "ragchat.E010"] == []


def test_migration_adds_the_fulltext_column_and_storage_settings(db):
    fill("test-8", clustered(3, 8))
    with connection.cursor() as cursor:
        cursor.execute("SELECT search_vector::text FROM django_ragchat_chunk ORDER BY id LIMIT 1")
        assert cursor.fetchone()[0].startswith("'")  # a tsvector, filled by the server
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = 'django_ragchat_chunk'")
        assert "toast_tuple_target=8160" in cursor.fetchone()[0]
        cursor.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'django_ragchat_chunk'")
        names = {row[0] for row in cursor.fetchall()}
    assert {"ragchat_chunk_search_vector", "ragchat_chunk_metadata"} <= names


def test_copy_errors_are_django_errors_and_roll_back(db):
    from django.db import DataError, transaction

    document = Document.objects.create(source="a.md", checksum="x")
    with pytest.raises(DataError):
        with transaction.atomic():
            search.store_chunks([Chunk(document=document, ordinal=0, text="ok", space="s",
                                       embedding=np.array([np.nan, 1], np.float32))])
    assert not Chunk.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_the_pgvector_benchmark_runs():
    """bench/bench_pgvector.py at a tiny size (its raw connection needs committed rows)."""
    from bench import bench_pgvector

    results = bench_pgvector.run(chunks=600, queries=6, hybrid_queries=6, ingest_sample=200, sqlite=False)
    assert results["chunks"] == 600 and results["build_s"] > 0
    assert [row[1] for row in results["ingestion"]] == [600, 200, 200, 200, 200, 200]
    assert len(results["vector"]) == 8 and all(0 <= row[-1] <= 1 for row in results["vector"])
    assert len(results["text"]) == 4
    text = bench_pgvector.report(results, "test db")
    assert "search.vector_search (retriever)" in text and "HNSW index build" in text
    assert not Chunk.objects.filter(space__startswith="scratch-").exists()


@pytest.mark.django_db(transaction=True)
def test_the_access_benchmark_runs():
    """bench/bench_access_pgvector.py at a tiny size: every reader gets its k results."""
    from bench import bench_access_pgvector

    results = bench_access_pgvector.run(chunks=600, queries=6)
    labels = [row[0] for row in results["rows"]]
    assert labels == ["unfiltered (UNRESTRICTED)", "1% readable", "10% readable", "50% readable", "100% readable"]
    assert all(row[6] == "100%" for row in results["rows"]), results["rows"]  # k results for every query
    assert "recall@10" in bench_access_pgvector.report(results, "test db")


def test_a_selective_reader_still_gets_k_results_in_order(indexed):
    """A reader who may read 1 chunk in 16 gets 10 results, the right ones, whichever plan
    PostgreSQL chooses (the HNSW index scanned iteratively, or the access index and a sort)."""
    from django_ragchat.access import Principals

    ids = list(Chunk.objects.filter(space="test-64").order_by("pk").values_list("pk", flat=True))
    readable = set(ids[::16])
    Chunk.objects.filter(space="test-64").exclude(pk__in=readable).update(access=["group:2"])
    Chunk.objects.filter(pk__in=readable).update(access=["group:1"])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE django_ragchat_chunk")
    reader = Principals(frozenset({"public", "group:1"}))
    for query in clustered(5, 64, seed=21):
        exact = search.vector_ids("test-64", query, 10, exact=True, principals=reader)
        found = search.vector_ids("test-64", query, 10, principals=reader)
        assert len(found) == 10 and {cid for cid, _ in found} <= readable
        assert len({cid for cid, _ in found} & {cid for cid, _ in exact}) >= 8
    assert search.vector_ids("test-64", query, 10, principals=Principals(frozenset({"public"}))) == []
