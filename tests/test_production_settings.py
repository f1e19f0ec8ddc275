"""The example project is production-safe by default: DEBUG off, no demo key, and
``check --deploy`` passes with the environment docs/deployment.md's checklist gives."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# Its sites run on SQLite files of their own: the PostgreSQL pass leaves it out (tests/conftest.py).
pytestmark = pytest.mark.own_database

ROOT = Path(__file__).resolve().parent.parent
DJANGO_VARS = ("DJANGO_DEBUG", "DJANGO_SECRET_KEY", "DJANGO_ALLOWED_HOSTS", "DATABASE_URL", "OPENAI_API_KEY",
               "RAGCHAT_LLM_BASE_URL", "DJANGO_SETTINGS_MODULE", "REDIS_URL", "RAGCHAT_USER_RETENTION_DAYS",
               "WEB_CONCURRENCY", "DJANGO_SECURE_HSTS_SECONDS")
# The checklist's environment (docs/deployment.md, "Production checklist").
PRODUCTION = {"DJANGO_SECRET_KEY": "k7#qZ9-wP2!mXv4@rT8^yN1&bL6*cF3(hJ0)dG5_sA7+eU2=oI9[tK4]",
              "DJANGO_ALLOWED_HOSTS": "chat.example.com", "REDIS_URL": "redis://127.0.0.1:6379/0",
              "RAGCHAT_USER_RETENTION_DAYS": "365"}


def manage(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in DJANGO_VARS}
    # A database of the test's own (the demo's default file lives under var/).
    clean["DATABASE_URL"] = f"sqlite:///{cwd / 'site.sqlite3'}"
    return subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], cwd=ROOT,
                          env={**clean, **env}, capture_output=True, text=True, timeout=120)


def test_it_refuses_to_start_without_a_key_of_its_own(tmp_path):
    result = manage("check", env={}, cwd=tmp_path)
    assert result.returncode != 0
    assert "Set DJANGO_SECRET_KEY" in result.stderr
    result = manage("check", env={"DJANGO_SECRET_KEY": "demo-only-not-secret"}, cwd=tmp_path)
    assert result.returncode != 0 and "Set DJANGO_SECRET_KEY" in result.stderr


def test_the_demo_key_with_white_space_around_it_is_still_refused(tmp_path):
    for key in ("demo-only-not-secret ", " demo-only-not-secret", "demo-only-not-secret\n", "   "):
        result = manage("check", env={"DJANGO_SECRET_KEY": key}, cwd=tmp_path)
        assert result.returncode != 0 and "Set DJANGO_SECRET_KEY" in result.stderr, repr(key)


def test_a_setting_that_is_not_a_number_is_named_not_a_traceback(tmp_path):
    for name, value in (("DJANGO_SECURE_HSTS_SECONDS", "abc"), ("RAGCHAT_USER_RETENTION_DAYS", "a year")):
        result = manage("check", env={**PRODUCTION, name: value}, cwd=tmp_path)
        assert result.returncode != 0
        assert f"ImproperlyConfigured: {name} must be a whole number" in result.stderr, result.stderr[-800:]
        assert "ValueError" not in result.stderr


def test_check_deploy_names_what_several_workers_and_keeping_data_need(tmp_path):
    bare = {k: v for k, v in PRODUCTION.items() if k not in ("REDIS_URL", "RAGCHAT_USER_RETENTION_DAYS")}
    result = manage("check", "--deploy", env=bare, cwd=tmp_path)
    assert "ragchat.W032" in result.stderr and "ragchat.W033" in result.stderr, result.stderr
    # Plain check: silent for one worker, W032 when WEB_CONCURRENCY asks for several.
    assert "ragchat.W032" not in manage("check", env=bare, cwd=tmp_path).stderr
    several = manage("check", env={**bare, "WEB_CONCURRENCY": "4"}, cwd=tmp_path)
    assert "ragchat.W032" in several.stderr and "4 worker processes" in several.stderr


def test_the_demo_mode_runs_with_the_demo_key(tmp_path):
    result = manage("check", env={"DJANGO_DEBUG": "1"}, cwd=tmp_path)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("extra", [{}, {"DJANGO_SECURE_PROXY_SSL_HEADER": "1"}])
def test_check_deploy_passes_with_the_documented_production_settings(tmp_path, extra):
    result = manage("check", "--deploy", "--fail-level", "WARNING", env={**PRODUCTION, **extra}, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout, result.stdout + result.stderr


def test_the_documented_checklist_names_every_variable():
    text = (ROOT / "docs" / "deployment.md").read_text()
    for name in ("DJANGO_SECRET_KEY", "DJANGO_ALLOWED_HOSTS", "DJANGO_DEBUG", "check --deploy",
                 "DJANGO_SECURE_PROXY_SSL_HEADER", "DJANGO_CSRF_TRUSTED_ORIGINS", "REDIS_URL",
                 "RAGCHAT_USER_RETENTION_DAYS", "ragchat.W032", "ragchat.W033"):
        assert name in text, name
