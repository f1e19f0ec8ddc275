"""Settings for the test suite. DATABASE_URL selects PostgreSQL (with pgvector); the default
is SQLite."""

import os

import dj_database_url

SECRET_KEY = "tests"
DEBUG = False
ALLOWED_HOSTS = ["*"]
INSTALLED_APPS = [
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
    "django_ragchat",
    "tests.sources_app",  # models of the model-source tests (tests/sources_plugin.py)
    # The example's orders app: its tools are exercised for real (tests/test_tools*.py).
    "example_project.orders",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]
DATABASES = {
    "default": dj_database_url.config(default="sqlite:///:memory:")
}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # A file, not :memory:, so concurrent-write tests and server processes started by tests
    # (which read RAGCHAT_TEST_SQLITE) share one database with real locking. One file per
    # pytest process, so parallel runs don't collide. In the project's var/ (ignored by git),
    # not the system's temp folder: Django deletes it at the end, and a killed run leaves it here.
    _test_db_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "var", "test-db")
    os.makedirs(_test_db_dir, exist_ok=True)
    DATABASES["default"]["TEST"] = {
        "NAME": os.environ.setdefault(
            "RAGCHAT_TEST_SQLITE", os.path.join(_test_db_dir, f"ragchat-tests-{os.getpid()}.sqlite3")
        )
    }
    # IMMEDIATE: a write transaction takes the lock up front, so concurrent turns wait
    # (busy timeout) instead of failing on a read-to-write lock upgrade.
    DATABASES["default"].setdefault("OPTIONS", {}).update({"timeout": 20, "transaction_mode": "IMMEDIATE"})
else:
    # A test database of its own per run (inherited by the server processes the tests start),
    # so two runs on one PostgreSQL server never collide.
    DATABASES["default"]["TEST"] = {
        "NAME": os.environ.setdefault(
            "RAGCHAT_TEST_PG_NAME", f"test_{DATABASES['default']['NAME']}_{os.getpid()}"
        )
    }
# Django's tasks framework (django.tasks on Django 6, the django-tasks backport on 5.2):
# the immediate backend by default, as on a site that configures nothing; "database" for the
# tests of work done by a worker (django-tasks-db's db_worker); "dummy" keeps tasks unrun.
try:
    import django.tasks  # noqa: F401

    _TASK_BACKENDS = "django.tasks.backends"
except ImportError:
    _TASK_BACKENDS = "django_tasks.backends"
TASKS = {
    "default": {"BACKEND": f"{_TASK_BACKENDS}.immediate.ImmediateBackend"},
    "dummy": {"BACKEND": f"{_TASK_BACKENDS}.dummy.DummyBackend"},
    "database": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": ["default"]},
}
INSTALLED_APPS.append("django_tasks_db")
CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
ASGI_APPLICATION = "tests.asgi.application"
LOGIN_URL = "admin:login"  # resolves (ragchat.W031)
STATIC_URL = "static/"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# No REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"]: the API views set their schema class themselves.
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
RAGCHAT = {
    # Tests never load whatever plugins happen to be installed; the entry-point test turns
    # this on for itself.
    "LOAD_ENTRY_POINTS": False,
}
# The profile of the isolation tests (tests/test_isolation.py; tests/isolation_plugin.py): the
# built-in retrievers, two plugin retrievers and query expansion, answered by the extractive
# answerer (whose answers quote what it was given).
ISOLATION_PROFILE = {
    "retrievers": ["vector", "hybrid", "raw_words", "plugin_fulltext"],
    "query_expanders": ["code_expander"],
}
