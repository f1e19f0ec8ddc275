"""``bench/bench_streaming.py --quick`` (and ``--scaleout``), ``bench/bench_memory.py`` and
``bench/bench_openai_endpoint.py --quick`` run end to end (their own processes and database) and
every answer arrives whole on every path, so the benchmarks cannot rot."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# pairwise, crossed: on Django 5.x with SQLite and 6.x with PostgreSQL in scripts/test.sh (pyproject.toml).
pytestmark = pytest.mark.pairwise(crossed=True)


def run_bench(script: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """``bench/<script> args`` in its own process, outside the tests' Django settings."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    return subprocess.run([sys.executable, f"bench/{script}", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


@pytest.mark.slow
def test_the_streaming_benchmark_runs_and_loses_no_token():
    result = run_bench("bench_streaming.py", "--quick", "--paths",
                       "model,bare relay,pipeline,websocket,sse asgi,sse wsgi")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.split() for line in result.stdout.splitlines() if line[:1].isdigit()]
    paths = {re.match(r"\S+\s+(\D+?)\s+\d", line).group(1) for line in result.stdout.splitlines()
             if line[:1].isdigit()}
    assert paths == {"model", "bare relay", "pipeline", "websocket", "sse asgi", "sse wsgi"}, result.stdout
    # No token lost, duplicated or reordered; every saved answer is the text streamed.
    assert len(rows) == 12 and all(row[-3:] == ["0/0/0", "0", "0/0"] for row in rows), result.stdout


@pytest.mark.slow
def test_a_baseline_of_the_same_code_with_a_setting_changed_runs_beside_it():
    """``--baseline . --baseline-env KEY=VALUE``: the A/B of one setting (the start gate off)."""
    result = run_bench("bench_streaming.py", "--quick", "--paths", "websocket,websocket before", "--baseline", ".",
                       "--baseline-env", "RAGCHAT_BENCH_STARTING_TURNS=0")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "websocket before: the app from . with RAGCHAT_BENCH_STARTING_TURNS=0" in result.stdout
    rows = [line.split() for line in result.stdout.splitlines() if line[:1].isdigit()]
    assert len(rows) == 4 and all(row[-3:] == ["0/0/0", "0", "0/0"] for row in rows), result.stdout
    refused = run_bench("bench_streaming.py", "--baseline-env", "NOEQUALS", timeout=60)
    assert refused.returncode == 2 and "--baseline-env takes KEY=VALUE" in refused.stderr


@pytest.mark.slow
def test_the_server_sent_events_paths_of_a_baseline_run_beside_these():
    """``--baseline DIR`` serves 'sse asgi before' and 'sse wsgi before' from DIR's own uvicorn and
    gunicorn, beside this checkout's, every answer whole; ``--token-delay`` paces the model."""
    paths = ["sse asgi", "sse asgi before", "sse wsgi", "sse wsgi before"]
    result = run_bench("bench_streaming.py", "--quick", "--loads", "3", "--paths", ",".join(paths), "--baseline", ".",
                       "--token-delay", "0.002")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "sse asgi before, sse wsgi before: the app from ." in result.stdout
    assert "20-token answers (openai, a token every 2 ms)" in result.stdout
    rows = [re.split(r"\s{2,}", line.strip()) for line in result.stdout.splitlines() if line[:1].isdigit()]
    assert [row[1] for row in rows] == paths, result.stdout
    # No token lost, duplicated or reordered; every saved answer is the text streamed.
    assert all(row[-3:] == ["0/0/0", "0", "0/0"] for row in rows), result.stdout
    # The server CPU table has a row per path, each its own server's processes, which did work.
    cpu = {row[0]: float(row[2]) for row in (re.split(r"\s{2,}", line.strip()) for line in result.stdout.splitlines())
           if row[0] in paths and len(row) == 5}
    assert set(cpu) == set(paths) and all(seconds > 0 for seconds in cpu.values()), result.stdout
    refused = run_bench("bench_streaming.py", "--paths", "sse wsgi before", timeout=60)
    assert refused.returncode == 2 and "need --baseline DIR" in refused.stderr


@pytest.mark.slow
def test_two_workers_on_the_redis_layer_lose_no_token():
    """``--workers 2``: two uvicorn processes on the Redis channel layer, the clients split."""
    result = run_bench("bench_streaming.py", "--quick", "--workers", "2", "--paths", "websocket,sse asgi")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2 uvicorn workers (Redis layer)" in result.stdout
    rows = [line.split() for line in result.stdout.splitlines() if line[:1].isdigit()]
    assert len(rows) == 4 and all(row[-3:] == ["0/0/0", "0", "0/0"] for row in rows), result.stdout


@pytest.mark.slow
def test_the_openai_endpoint_benchmark_runs_every_path():
    """``bench/bench_openai_endpoint.py --quick``: every path answers every turn whole (the
    benchmark raises otherwise), beside the websocket."""
    result = run_bench("bench_openai_endpoint.py", "--quick")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {line.split("  ")[0] for line in result.stdout.splitlines()
            if line.startswith(("websocket", "openai", "sse", "model"))}
    assert rows == {"websocket", "openai stream asgi", "openai httpx asgi", "openai whole asgi", "openai stream wsgi",
                    "sse asgi", "model openai", "model httpx"}, result.stdout


@pytest.mark.slow
def test_the_scaleout_table_has_every_configuration_and_loses_no_token():
    """``--scaleout``: the model alone, then one and two workers on Redis, one after the other; the
    ratios are to one worker, and the CPU time of each process group is read."""
    result = run_bench("bench_streaming.py", "--quick", "--scaleout", "0,1,2", "--loads", "4")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {line.split("  ")[0]: line.split() for line in result.stdout.splitlines()
            if line.startswith(("model alone", "1 (redis)", "2 (redis)"))}
    assert set(rows) == {"model alone", "1 (redis)", "2 (redis)"}, result.stdout
    one, two = rows["1 (redis)"], rows["2 (redis)"]
    assert one[2] == "4" and one[9:11] == ["1.00x", "1.00"], result.stdout
    # No token lost, duplicated or reordered; every saved answer is the text streamed.
    assert one[11:14] == two[11:14] == ["0/0/0", "0", "0/0"], result.stdout
    # CPU cores busy: clients / model / workers / redis / database, then their sum; the workers did work.
    cores = [float(x) for x in two[14:23:2]]
    assert cores[2] > 0 and abs(sum(cores) - float(two[23])) < 0.03, result.stdout
    assert 0 < float(two[24]) <= float(two[26]), result.stdout  # CPU ms per answer: the workers' within all
    assert "took" in result.stdout


@pytest.mark.slow
def test_the_memory_benchmark_reads_the_workers_rss():
    """``bench/bench_memory.py``: idle sockets and open streams on the app and on a bare consumer,
    each worker's RSS read before and after; every streamed answer whole."""
    result = run_bench("bench_memory.py", "--sockets", "20", "--streams", "4", "--tokens", "10", "--token-delay",
                       "0.1", "--settle", "0.3")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [re.split(r"\s{2,}", line.strip()) for line in result.stdout.splitlines()
            if line.startswith(("app (chat consumer)", "bare Channels consumer"))]
    assert [(r[0], r[1], r[2]) for r in rows] == [
        ("app (chat consumer)", "idle sockets", "20"), ("bare Channels consumer", "idle sockets", "20"),
        ("app (chat consumer)", "open streams", "4"), ("bare Channels consumer", "open streams", "4")], result.stdout
    for row in rows:
        before, after, each = float(row[3]), float(row[4]), float(row[5])
        assert 50 < before < 1000 and after >= before - 5, result.stdout  # a worker's RSS in MB
        # KB each is the growth / count (the MB columns are rounded to 0.1 MB).
        assert abs((after - before) * 1024 - each * int(row[2])) <= 0.1 * 1024 + 1, result.stdout
    # 20 sockets each hold buffers in the worker: its resident set grows.
    assert float(rows[0][5]) > 0 and float(rows[1][5]) > 0, result.stdout
    assert all(re.fullmatch(r"\d+ -> \d+", row[6]) for row in rows), result.stdout  # the worker's threads
    assert rows[2][8] == rows[3][8] == "0/0/0/0" and rows[2][9] == "0", result.stdout
