"""``bench/bench_streaming.py --quick`` and ``bench/bench_openai_endpoint.py --quick`` run end to end
(their own processes and database) and every answer arrives whole on every path, so the
benchmarks cannot rot."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_streaming_benchmark_runs_and_loses_no_token():
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    result = subprocess.run([sys.executable, "bench/bench_streaming.py", "--quick", "--paths",
                             "model,bare relay,pipeline,websocket,sse asgi,sse wsgi"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.split() for line in result.stdout.splitlines() if line[:1].isdigit()]
    paths = {re.match(r"\S+\s+(\D+?)\s+\d", line).group(1) for line in result.stdout.splitlines()
             if line[:1].isdigit()}
    assert paths == {"model", "bare relay", "pipeline", "websocket", "sse asgi", "sse wsgi"}, result.stdout
    # No token lost, duplicated or reordered; every saved answer is the text streamed.
    assert len(rows) == 12 and all(row[-3:] == ["0/0/0", "0", "0/0"] for row in rows), result.stdout


@pytest.mark.slow
def test_two_workers_on_the_redis_layer_lose_no_token():
    """``--workers 2``: two uvicorn processes on the Redis channel layer, the clients split."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    result = subprocess.run([sys.executable, "bench/bench_streaming.py", "--quick", "--workers", "2",
                             "--paths", "websocket,sse asgi"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2 uvicorn workers (Redis layer)" in result.stdout
    rows = [line.split() for line in result.stdout.splitlines() if line[:1].isdigit()]
    assert len(rows) == 4 and all(row[-3:] == ["0/0/0", "0", "0/0"] for row in rows), result.stdout


@pytest.mark.slow
def test_the_openai_endpoint_benchmark_runs_every_path():
    """``bench/bench_openai_endpoint.py --quick``: every path answers every turn whole (the
    benchmark raises otherwise), beside the websocket."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    result = subprocess.run([sys.executable, "bench/bench_openai_endpoint.py", "--quick"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {line.split("  ")[0] for line in result.stdout.splitlines()
            if line.startswith(("websocket", "openai", "sse", "model"))}
    assert rows == {"websocket", "openai stream asgi", "openai httpx asgi", "openai whole asgi", "openai stream wsgi",
                    "sse asgi", "model openai", "model httpx"}, result.stdout
