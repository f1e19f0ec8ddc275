"""Settings of the demo site. Runs on the embedded defaults (SQLite, offline embedder and
answerer) unless DATABASE_URL names another database.

Production-safe by default: DEBUG is off and the site refuses to start without its own
``DJANGO_SECRET_KEY``. ``scripts/demo.sh`` sets ``DJANGO_DEBUG=1``, which allows the demo key
and plain HTTP. docs/deployment.md has the production checklist; ``manage.py check --deploy``
passes with the environment it gives.
"""

import os
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
DEBUG = os.environ.get("DJANGO_DEBUG", "0") == "1"
_DEMO_SECRET_KEY = "demo-only-not-secret"
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY") or (_DEMO_SECRET_KEY if DEBUG else "")
# Compared without surrounding white space: "demo-only-not-secret " is still the demo's key.
if not SECRET_KEY.strip() or (SECRET_KEY.strip() == _DEMO_SECRET_KEY and not DEBUG):
    raise ImproperlyConfigured(
        "Set DJANGO_SECRET_KEY to a long random value (python -c 'from django.core.management.utils "
        "import get_random_secret_key as k; print(k())'), or DJANGO_DEBUG=1 to run the demo "
        "(scripts/demo.sh does)."
    )
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",")
CSRF_TRUSTED_ORIGINS = [o for o in os.environ.get("DJANGO_CSRF_TRUSTED_ORIGINS", "").split(",") if o]



def _whole_number(name: str, default: int, unit: str = "seconds") -> int:
    """The environment variable ``name`` as a whole number (0 or more), or ImproperlyConfigured."""
    value = os.environ.get(name, "").strip() or str(default)
    if not value.isdigit():
        raise ImproperlyConfigured(f"{name} must be a whole number of {unit} (0 or more), not {value!r}.")
    return int(value)


if not DEBUG:
    # Behind HTTPS (docs/deployment.md, "Production checklist"). A proxy that terminates TLS
    # sets X-Forwarded-Proto; DJANGO_SECURE_PROXY_SSL_HEADER=1 trusts it.
    SECURE_SSL_REDIRECT = os.environ.get("DJANGO_SECURE_SSL_REDIRECT", "1") == "1"
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = _whole_number("DJANGO_SECURE_HSTS_SECONDS", 60 * 60 * 24 * 365)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    if os.environ.get("DJANGO_SECURE_PROXY_SSL_HEADER") == "1":
        SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI and Redoc as static files (offline)
    "channels",
    "servestatic",  # ServeStatic's system checks (its middleware serves the static files)
    "django_ragchat",
    "example_project.shop",  # products the assistant answers from (shop/ragchat.py)
    "example_project.orders",  # the shop's orders and the assistant's tools over them
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # The page's script and styles under any server, uvicorn and gunicorn included (README's
    # snippet does the same; ServeStatic serves them asynchronously under ASGI). The demo serves
    # them from the apps' folders (no collectstatic); a copy of this site would run
    # collectstatic into STATIC_ROOT instead.
    "servestatic.middleware.ServeStaticMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"
ASGI_APPLICATION = "example_project.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "example_project" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "example_project.context_processors.demo",  # the "answers are extractive" line
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.config(
        default=f"sqlite:///{BASE_DIR / 'var' / 'demo.sqlite3'}", conn_max_age=0
    )
}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    (BASE_DIR / "var").mkdir(exist_ok=True)
    # WAL: readers never wait for the writer, and a commit is one append instead of a rewrite
    # of the journal (synchronous=NORMAL is durable across application crashes in WAL mode).
    DATABASES["default"].setdefault("OPTIONS", {}).update({
        "timeout": 20, "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL",
    })
    # Connections kept (docs/deployment.md): a SQLite connection holds nothing on a server, and
    # Channels' AuthMiddlewareStack would otherwise open the file again (and parse its schema)
    # for every websocket handshake, about 1.3 ms of the worker's CPU per socket.
    DATABASES["default"]["CONN_MAX_AGE"] = None

CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
if os.environ.get("REDIS_URL"):
    # Several worker processes: the per-user limits are counted in one cache for all of them.
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                          "LOCATION": os.environ["REDIS_URL"]}}
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # capacity: room for a whole streamed answer per watching socket (docs/deployment.md).
            # socket_timeout 30: redis-py 8 defaults it to 5 s, which ends the layer's blocking
            # receive of an idle socket with a TimeoutError and closes it (channels_redis #422).
            "CONFIG": {"hosts": [{"address": os.environ["REDIS_URL"], "socket_timeout": 30}], "capacity": 1000},
        }
    }

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "var" / "static"
SERVESTATIC_USE_FINDERS = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
LOGIN_URL = "ragchat:login"  # the chat's own sign-in page, for any user (README)

# No REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"]: the API views set their schema class themselves.
SPECTACULAR_SETTINGS = {"TITLE": "django-ragchat demo API", "VERSION": "1"}

# The demo lets visitors chat without an account (bound to their session).
RAGCHAT = {
    "ALLOW_ANONYMOUS": True,
    "PROFILES": {
        "default": {},
    },
    # The shop's products, through model sources (docs/sources.md), and the tools over its
    # orders (example_project/orders/ragchat.py, docs/tools.md).
    "PLUGINS": ["example_project.shop.ragchat", "example_project.orders.ragchat"],
    # How long signed-in users' chat data is kept (ragchat_purge, daily): your privacy policy's
    # number of days. Unset, it is kept forever and `check --deploy` says so (ragchat.W033).
    "USER_RETENTION_DAYS": _whole_number("RAGCHAT_USER_RETENTION_DAYS", 0, "days") or None,
}
# With a model server named by the environment, the demo answers and embeds through it
# (OpenAI, or any OpenAI-compatible server: Ollama, vLLM, llama.cpp; see docs/openai.md).
# Documents ingested with the offline embedder then need `manage.py ragchat_reembed`.
if os.environ.get("OPENAI_API_KEY") or os.environ.get("RAGCHAT_LLM_BASE_URL"):
    _openai = {
        "base_url": os.environ.get("RAGCHAT_LLM_BASE_URL") or None,
        "model": os.environ.get("RAGCHAT_CHAT_MODEL", "gpt-4o-mini"),
        "embedding_model": os.environ.get("RAGCHAT_EMBEDDING_MODEL", "text-embedding-3-small"),
    }
    # Optional: the size is learnt from the model's first reply; set it to ask OpenAI's
    # text-embedding-3 models for shorter vectors.
    if os.environ.get("RAGCHAT_EMBEDDING_DIMENSIONS"):
        _openai["embedding_dimensions"] = int(os.environ["RAGCHAT_EMBEDDING_DIMENSIONS"])
    # A model calls tools: signed-in customers can ask about their orders ("Where is ORD-17?").
    RAGCHAT["PROFILES"]["default"] = {"llm": "openai", "embedder": "openai", "options": {"openai": _openai},
                                      "tools": ["order_status", "cancel_order"]}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_ragchat": {"handlers": ["console"], "level": "INFO"}},
}
