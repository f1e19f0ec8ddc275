"""The benchmarks run (tiny sizes, seconds) so they cannot rot between releases.

Each test calls a benchmark's ``run`` on the test database and renders its report; the full
sizes run with ``.venv/bin/python bench/<name>.py`` (see bench/README.md).
"""

import pytest

from bench import bench_answers, bench_canard, bench_pipeline, bench_vector_sqlite
from bench._setup import percentile, table
from django_ragchat.search.vectorindex import vector_index

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh_vector_index():
    # Rolled-back tests can leave a (count, max id) stamp that matches new rows; start clean.
    vector_index.clear()
    yield
    vector_index.clear()


def test_pipeline_bench_runs_and_query_count_is_flat():
    results = bench_pipeline.run(chunks=120, histories=(2, 30), turns=2, warmup=1, query_turns=1)

    assert results["chunks"] == 120
    cells = {(c["history"], c["mode"]): c for c in results["cells"]}
    assert set(cells) == {(h, m) for h in (2, 30) for m in ("whole", "streamed")}
    for cell in cells.values():
        assert len(cell["ms"]) == 2 and all(ms > 0 for ms in cell["ms"])
        assert len(cell["stages"]["retrieval"]) == 2
    for mode in ("whole", "streamed"):
        assert cells[(2, mode)]["queries"] == cells[(30, mode)]["queries"]
    text = bench_pipeline.report(results, "test db")
    assert "median ms" in text and "query transformers" in text


def test_vector_bench_runs():
    [result] = bench_vector_sqlite.run([150], queries=3, warmup=1, k=5)

    assert result["chunks"] == 150 and result["dimension"] == 256  # the default embedder's (wordllama)
    assert result["cold_ms"] > 0
    assert all(len(ms) == 3 for ms in result["rows"].values())
    assert "VectorRetriever.retrieve" in bench_vector_sqlite.report([result], "test db", 5)


@pytest.mark.parametrize("index", ["heading", "bare"])
def test_canard_bench_runs(index):
    dialogs = bench_canard.load_dialogs(limit=5)
    expected = sum(1 for d in dialogs for t in d["turns"] if t["turn"] >= 2 and bench_canard.is_passage(t))

    results = bench_canard.run(dialogs=5, tune_dialogs=3, index=index)

    assert len(results["items"]) == expected > 0
    for item in results["items"]:
        assert item.texts["transformed"] is not None
        assert all(len(ids) <= 5 for ids in item.ranked.values())
    assert 0 <= bench_canard.recall(results["items"], "gold", 5) <= 1
    # The passages are removed again, so runs in one database do not see each other's.
    from django_ragchat.models import Document
    assert not Document.objects.filter(source__startswith="canard/").exists()
    assert "gap closed @5" in bench_canard.report(results, "test db")


def test_canard_history_is_title_then_turns():
    dialog = bench_canard.load_dialogs(limit=1)[0]
    history = bench_canard.history_of(dialog, 3)

    assert [m.role for m in history] == ["user", "user", "assistant", "user", "assistant"]
    assert history[0].content == f"{dialog['title']}: {dialog['section']}"
    assert history[1].content == dialog["turns"][0]["question"]
    assert history[4].content == dialog["turns"][1]["answer"]


def test_helpers():
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 99) == 5.0
    assert table(["name", "ms"], [["a", 1.234]]).splitlines()[-1] == "a     1.23"


def test_answers_bench_runs():
    rows = bench_answers.builder_cost(rounds=2, per_round=5)
    assert [r[0] for r in rows] == ["default", "acm", "xml"]
    rows, note = bench_answers.turn_cost(chunks=60, turns=1, warmup=0)
    assert [r[0] for r in rows] == ["whole", "streamed"] and "sources kept" in note


@pytest.mark.django_db(transaction=True)
def test_sources_bench_runs(ragchat_settings_override, settings):
    """bench/bench_sources.py at a tiny size (live sync acts after commits: a committed database)."""
    from bench import bench_sources

    ragchat_settings_override(PLUGINS=["bench.bench_sources.plugin"], PROFILES={"default": {"embedder": "precomputed"}})
    settings.ROOT_URLCONF = "bench.bench_sources"
    results = bench_sources.run(objects=30, saves=10)
    assert [row[1] for row in results["bulk"]] == [30, 30, 30, 1]
    assert results["bulk"][2][2] == 0  # the second sync writes nothing
    saves = {row[0].split(",")[1].strip(): row for row in results["save"]}
    assert saves["live sync paused (the site without sources)"][2] == 2  # the SELECT and the UPDATE
    # With a worker, the request that saves pays one query more: the enqueue.
    assert saves["live sync on the database task backend (worker)"][2] == 3
    assert "objects/s" in bench_sources.report(results, "test db")


@pytest.mark.django_db(transaction=True)  # the tools run in threads of their own
def test_tools_bench_runs_every_cell_with_the_requests_it_should():
    from bench import bench_tools

    results = bench_tools.run(rounds=2, warmup=1)
    assert all(len(ms) == 2 for ms in results["cells"].values())
    for (kind, tool, mode, with_tool), requests in results["requests"].items():
        assert requests == {2 if with_tool else 1}, (kind, tool, mode)
    assert all(len(ms) == 2 and min(ms) > 0 for ms in results["round_trips"].values())
    assert set(results["traces"]) == {"order_status", "order_status_async"}
    text = bench_tools.report(results, "test db")
    assert "added ms" in text and "order_status_async (async)" in text
