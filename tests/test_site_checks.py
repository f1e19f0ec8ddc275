"""The system checks that tell a site what it is missing, each with its id and a hint:
ragchat.W030 (ASGI without a channel layer), ragchat.W031 (LOGIN_URL does not resolve),
ragchat.W011 on a plain ``manage.py check`` (a PostgreSQL space without its HNSW index),
ragchat.W032 (a per-process layer or cache for several workers), ragchat.W033 (chat data
kept forever) and ragchat.W034 (several workers on SQLite)."""

from __future__ import annotations

import re
from io import StringIO

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.test import override_settings

from django_ragchat.search import postgres
from tests.pg import postgres_only  # noqa: F401  (fixture)


def ids(messages) -> list[str]:
    return [m.id for m in messages if m.id.startswith("ragchat.")]


def by_id(messages, check_id: str):
    found = [m for m in messages if m.id == check_id]
    assert len(found) == 1, ids(messages)
    assert found[0].hint, "every warning says how to fix it"
    return found[0]


# Django 6 runs the model checks against the databases: plain check needs database access there.
pytestmark = pytest.mark.django_db


@override_settings(CHANNEL_LAYERS={}, ASGI_APPLICATION="tests.asgi.application")
def test_an_asgi_site_without_a_channel_layer_is_told_what_is_off():
    warning = by_id(run_checks(), "ragchat.W030")
    assert "second tab" in warning.msg and "CHANNEL_LAYERS" in warning.hint


@pytest.mark.parametrize("overrides", [
    {"CHANNEL_LAYERS": {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}},
    {"CHANNEL_LAYERS": {}, "ASGI_APPLICATION": None},  # WSGI only: no websocket at all
])
def test_no_channel_layer_warning_when_there_is_one_or_no_asgi(overrides):
    with override_settings(**overrides):
        assert "ragchat.W030" not in ids(run_checks())


@override_settings(LOGIN_URL="/no-such-page/login/")  # (a new site's default, /accounts/login/, is a 404 there)
def test_a_login_url_this_site_does_not_serve_is_a_warning():
    warning = by_id(run_checks(), "ragchat.W031")
    assert "/no-such-page/login/" in warning.msg and "LOGIN_URL" in warning.hint
    err = StringIO()
    call_command("check", stderr=err, stdout=StringIO())  # a warning: check still passes
    assert "ragchat.W031" in err.getvalue()


@pytest.mark.parametrize("login_url", ["admin:login", "/admin/login/", "https://sso.example.com/login"])
def test_a_login_url_that_resolves_or_is_another_site_is_fine(login_url):
    with override_settings(LOGIN_URL=login_url):
        assert "ragchat.W031" not in ids(run_checks())


def test_no_login_url_warning_when_anonymous_chat_is_on(ragchat_settings_override):
    ragchat_settings_override(ALLOW_ANONYMOUS=True)
    with override_settings(LOGIN_URL="/no-such-page/login/"):
        assert "ragchat.W031" not in ids(run_checks())


@pytest.mark.postgres
@pytest.mark.usefixtures("postgres_only")
def test_ragchat_ingest_builds_the_index_and_plain_check_warns_when_it_is_gone(tmp_path):
    (tmp_path / "aurora.md").write_text("# Aurora X2\n\nThe Aurora X2 costs $699.\n")
    out = StringIO()
    call_command("ragchat_ingest", str(tmp_path), "--no-progress", stdout=out)
    (space,) = postgres.spaces()
    assert f"Built the HNSW index of space {space!r}" in out.getvalue()
    assert postgres.hnsw_index_status(space).ok
    assert "ragchat.W011" not in ids(run_checks())  # plain check: no databases asked for

    postgres.drop_hnsw_index(space)
    warning = by_id(run_checks(), "ragchat.W011")
    assert space in warning.msg and "ragchat_index" in warning.hint
    # A second ingestion (nothing new) puts it back.
    call_command("ragchat_ingest", str(tmp_path), "--no-progress", stdout=StringIO())
    assert postgres.hnsw_index_status(space).ok


def test_every_check_id_is_in_the_documented_table():
    from pathlib import Path

    import django_ragchat

    package = Path(django_ragchat.__file__).parent
    code = "".join(p.read_text() for p in package.rglob("*.py"))
    documented = (package.parent / "docs" / "settings.md").read_text()
    check_ids = set(re.findall(r'id="(ragchat\.[EW]\d{3})"', code))
    assert {"ragchat.W011", "ragchat.W030", "ragchat.W031"} <= check_ids
    assert [i for i in sorted(check_ids) if f"`{i}`" not in documented] == []


def test_several_workers_with_a_per_process_layer_or_cache_and_data_kept_forever(monkeypatch,
                                                                                 ragchat_settings_override):
    """The tests' settings: the in-memory layer, the local-memory cache, USER_RETENTION_DAYS None."""
    assert "ragchat.W032" not in ids(run_checks())  # one worker: nothing to say
    deploy = run_checks(include_deployment_checks=True)
    warning = by_id(deploy, "ragchat.W032")
    assert "InMemoryChannelLayer" in warning.msg and "LocMemCache" in warning.msg and "Redis" in warning.hint
    assert "kept forever" in by_id(deploy, "ragchat.W033").msg
    monkeypatch.setenv("WEB_CONCURRENCY", "4")
    assert "4 worker processes" in by_id(run_checks(), "ragchat.W032").msg
    with override_settings(CHANNEL_LAYERS={"default": {"BACKEND": "channels_redis.core.RedisChannelLayer"}},
                           CACHES={"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                                               "LOCATION": "redis://127.0.0.1:6379/0"}}):
        assert "ragchat.W032" not in ids(run_checks(include_deployment_checks=True))
    ragchat_settings_override(USER_RETENTION_DAYS=365)
    assert "ragchat.W033" not in ids(run_checks(include_deployment_checks=True))


def test_several_workers_on_sqlite(monkeypatch):
    """W034: only with several workers, only on SQLite."""
    from django.db import connections

    assert "ragchat.W034" not in ids(run_checks(include_deployment_checks=True))  # one worker
    monkeypatch.setenv("WEB_CONCURRENCY", "2")
    if connections["default"].vendor == "sqlite":
        warning = by_id(run_checks(), "ragchat.W034")
        assert "2 worker processes" in warning.msg and "PostgreSQL" in warning.hint
        monkeypatch.setattr(connections["default"], "vendor", "postgresql")
    assert "ragchat.W034" not in ids(run_checks())
