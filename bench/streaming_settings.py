"""Settings of ``bench/bench_streaming.py``: the demo site's, on the benchmark's database, with
the per-user limits off (the benchmark opens up to 100 answers at once) and the ``default``
profile answering through the loopback OpenAI-compatible server the benchmark starts. Used by
the benchmark process and by the server processes it starts; the environment variables are
set by the benchmark."""

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
    "OPTIONS": ({"timeout": 20, "transaction_mode": "IMMEDIATE"}
                if os.environ["RAGCHAT_BENCH_DB_ENGINE"].endswith("sqlite3") else {}),
}}
# One worker process: the in-memory layer (the benchmark measures the transport, not Redis).
CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

_llm = os.environ.get("RAGCHAT_BENCH_LLM", "openai")
RAGCHAT = {
    "ALLOW_ANONYMOUS": False,
    "LOAD_ENTRY_POINTS": False,
    "TURNS_PER_MINUTE": 0,
    "MAX_CONCURRENT_STREAMS": 0,
    "PROFILES": {
        "default": {"llm": _llm, "options": {"openai": {
            "base_url": os.environ.get("RAGCHAT_BENCH_MODEL_URL", "http://127.0.0.1:9/v1"),
            "model": "gpt-4o-mini", "max_retries": 0, "timeout": 60,
        }}} if _llm == "openai" else {"llm": _llm},
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
}
