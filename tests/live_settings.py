"""Settings of the server processes the streaming tests start (uvicorn, daphne, gunicorn).

The test settings, pointed at the *test* database the pytest process created (a SQLite file or
``test_<name>`` on PostgreSQL), with what a real multi-process deployment shares through Redis:
the cache (so the per-user limits are counted across processes, and the tests can reset them)
and, when ``RAGCHAT_LIVE_CHANNEL_LAYER`` is ``redis``, the channel layer. The environment
variables are set by ``tests/live_servers.py``.
"""

import os

from tests.settings import *  # noqa: F403  (these settings extend the tests')
from tests.settings import DATABASES, ISOLATION_PROFILE, RAGCHAT

_database = DATABASES["default"]
if _database["ENGINE"].endswith("sqlite3"):
    _database["NAME"] = os.environ["RAGCHAT_TEST_SQLITE"]
else:
    _database["NAME"] = (_database.get("TEST") or {}).get("NAME") or f"test_{_database['NAME']}"

ALLOWED_HOSTS = ["127.0.0.1", "localhost"]

_redis_url = os.environ.get("RAGCHAT_LIVE_REDIS_URL", "redis://127.0.0.1:6379/0")
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": _redis_url,
        "KEY_PREFIX": os.environ.get("RAGCHAT_LIVE_PREFIX", "ragchat-live"),
    }
}
_layer = os.environ.get("RAGCHAT_LIVE_CHANNEL_LAYER")
if _layer == "none":
    CHANNEL_LAYERS = {}  # the consumer works on its own (ragchat.W030)
elif _layer in ("redis", "broken-redis"):
    if _layer == "broken-redis":  # nothing listens there: every call to the layer fails
        _redis_url = f"redis://127.0.0.1:{os.environ['RAGCHAT_LIVE_DEAD_PORT']}/0"
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {
                # As docs/deployment.md writes it: a socket timeout longer than the layer's
                # 5-second blocking read, or every idle socket's read times out.
                "hosts": [{"address": _redis_url,
                           "socket_timeout": float(os.environ.get("RAGCHAT_LIVE_REDIS_SOCKET_TIMEOUT", 30))}],
                "prefix": os.environ.get("RAGCHAT_LIVE_PREFIX", "ragchat-live") + ":layer",
                # Room for a whole streamed answer in a watcher's channel (see docs/deployment.md).
                "capacity": 1000,
            },
        }
    }

RAGCHAT = {
    **RAGCHAT,
    "PLUGINS": ["tests.streaming_plugin", "tests.isolation_plugin", "tests.tool_plugins", "example_project.orders.ragchat"],
    "ALLOW_ANONYMOUS": True,
    # The browser tests read every passage an answer was given (their visitors are anonymous,
    # who see only the cited ones by default); tests/test_browser.py checks that default apart.
    "CITED_SOURCES_ONLY": False,
    "TURNS_PER_MINUTE": 25,
    "MAX_CONCURRENT_STREAMS": 3,
    "PROFILES": {
        # An input guardrail that refuses what a helpdesk's visitor must not paste (tests/test_browser.py).
        "default": {"options": {"blocked_phrases": {"phrases": ["password:"]}}},
        # Answers come from the loopback OpenAI-compatible server of the pytest process.
        "fake": {
            "title": "Written answers",  # what the chat page shows for it (its name: "fake")
            "llm": "openai",
            "options": {"openai": {
                "base_url": os.environ.get("RAGCHAT_FAKE_OPENAI_URL", "http://127.0.0.1:9/v1"),
                "model": "gpt-4o-mini",
                "max_retries": 0,
                "timeout": 10,
            }},
        },
        # The fake model, reprompted when it cites nothing, with a streamed footer (the chat
        # widget's browser tests: the retry event, text after the last token).
        "fake_cited": {
            "llm": "openai",
            "guardrails": ["require_citation"],
            "response_augmenters": ["citations", "footer"],
            "options": {"openai": {
                "base_url": os.environ.get("RAGCHAT_FAKE_OPENAI_URL", "http://127.0.0.1:9/v1"),
                "model": "gpt-4o-mini",
                "max_retries": 0,
                "timeout": 10,
            }},
        },
        # The fake model with tools: the example's order tools and the tests' (tests/test_browser_tools.py).
        "fake_tools": {
            "llm": "openai",
            "tools": ["order_status", "cancel_order", "slow"],
            "empty_context": "answer",
            "options": {"openai": {
                "base_url": os.environ.get("RAGCHAT_FAKE_OPENAI_URL", "http://127.0.0.1:9/v1"),
                "model": "gpt-4o-mini",
                "max_retries": 0,
                "timeout": 10,
            }},
        },
        # The default profile plus a streamed response augmenter (tests/streaming_plugin.py).
        "shouting": {"response_augmenters": ["citations", "shout"]},
        # Every way a private row could leak into a turn (tests/test_isolation.py).
        "isolation": ISOLATION_PROFILE,
    },
}

# Servers that must notice a client gone within a second or two (tests/test_stops.py) beat faster.
if os.environ.get("RAGCHAT_LIVE_HEARTBEAT_SECONDS"):
    RAGCHAT["STREAM_HEARTBEAT_SECONDS"] = float(os.environ["RAGCHAT_LIVE_HEARTBEAT_SECONDS"])

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
}
