"""Settings of ``bench/bench_streaming.py``: the demo site's, on the benchmark's database, with
the per-user limits off (the benchmark opens up to 100 answers at once) and the ``default``
profile answering through the loopback OpenAI-compatible server the benchmark starts. Used by
the benchmark process and by the server processes it starts; the environment variables are
set by the benchmark."""

import importlib.util
import os

# The demo's settings refuse to load without a key of their own unless in demo mode; the
# benchmark runs on plain HTTP with the demo key, and turns DEBUG off again below.
os.environ.setdefault("DJANGO_DEBUG", "1")

from example_project.settings import *  # noqa: E402, F403  (these settings extend the demo's)

DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]

DATABASES = {"default": {
    "ENGINE": os.environ["RAGCHAT_BENCH_DB_ENGINE"],
    "NAME": os.environ["RAGCHAT_BENCH_DB_NAME"],
    "HOST": os.environ.get("RAGCHAT_BENCH_DB_HOST", ""),
    "PORT": os.environ.get("RAGCHAT_BENCH_DB_PORT", ""),
    "USER": os.environ.get("RAGCHAT_BENCH_DB_USER", ""),
    "PASSWORD": os.environ.get("RAGCHAT_BENCH_DB_PASSWORD", ""),
    # SQLite as the demo runs it (example_project/settings.py): WAL, synchronous=NORMAL,
    # connections kept (below).
    # PostgreSQL with Django's psycopg pool (docs/deployment.md): each turn takes a connection
    # from the pool instead of opening one (CONN_MAX_AGE is 0, as in the demo).
    "OPTIONS": ({"timeout": 20, "transaction_mode": "IMMEDIATE",
                 "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL"}
                if os.environ["RAGCHAT_BENCH_DB_ENGINE"].endswith("sqlite3")
                else {"pool": {"min_size": 2, "max_size": 16, "timeout": 30}}
                if os.environ.get("RAGCHAT_BENCH_PG_POOL", "1") == "1" else {}),
}}
if os.environ["RAGCHAT_BENCH_DB_ENGINE"].endswith("sqlite3"):  # kept, as the demo keeps them
    DATABASES["default"]["CONN_MAX_AGE"] = None
# One worker process: the in-memory layer (the benchmark measures the transport, not Redis).
CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
if os.environ.get("RAGCHAT_BENCH_REDIS_PREFIX"):  # --workers 2 and more
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {
        # socket_timeout 30: redis-py 8 defaults it to 5 s, which ends the layer's blocking
        # receive (BZPOPMIN, 5 s) of an idle socket with a TimeoutError (channels_redis #422).
        "hosts": [{"address": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"), "socket_timeout": 30}],
        "prefix": os.environ["RAGCHAT_BENCH_REDIS_PREFIX"], "capacity": 1000,
    }}}
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

_llm = os.environ.get("RAGCHAT_BENCH_LLM", "openai")
# The model client's HTTP library: aiohttp when installed (docs/deployment.md recommends it),
# else httpx; RAGCHAT_BENCH_HTTP_CLIENT=httpx measures the other one.
_http_client = os.environ.get("RAGCHAT_BENCH_HTTP_CLIENT") or (
    "aiohttp" if importlib.util.find_spec("aiohttp") else "httpx")
RAGCHAT = {
    "ALLOW_ANONYMOUS": False,
    "LOAD_ENTRY_POINTS": False,
    "TURNS_PER_MINUTE": 0,
    "MAX_CONCURRENT_STREAMS": 0,
    # RAGCHAT_BENCH_DB_THREADS=1: every turn's database work on one thread, as before lanes.
    **({"DATABASE_THREADS": int(os.environ["RAGCHAT_BENCH_DB_THREADS"])}
       if os.environ.get("RAGCHAT_BENCH_DB_THREADS") else {}),
    # RAGCHAT_BENCH_STARTING_TURNS=0: every turn of a burst starts at once, as before the gate.
    **({"STARTING_TURNS": int(os.environ["RAGCHAT_BENCH_STARTING_TURNS"])}
       if os.environ.get("RAGCHAT_BENCH_STARTING_TURNS") else {}),
    "PROFILES": {
        "default": {"llm": _llm, "options": {"openai": {
            "base_url": os.environ.get("RAGCHAT_BENCH_MODEL_URL", "http://127.0.0.1:9/v1"),
            "model": "gpt-4o-mini", "max_retries": 0, "timeout": 60, "http_client": _http_client,
        }}} if _llm == "openai" else {"llm": _llm},
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
}
