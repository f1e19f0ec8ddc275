"""The example project is production-safe by default: DEBUG off, no demo key, and
``check --deploy`` passes with the environment docs/deployment.md's checklist gives."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DJANGO_VARS = ("DJANGO_DEBUG", "DJANGO_SECRET_KEY", "DJANGO_ALLOWED_HOSTS", "DATABASE_URL", "OPENAI_API_KEY",
               "RAGCHAT_LLM_BASE_URL", "DJANGO_SETTINGS_MODULE")
# The checklist's environment (docs/deployment.md, "Production checklist").
PRODUCTION = {"DJANGO_SECRET_KEY": "k7#qZ9-wP2!mXv4@rT8^yN1&bL6*cF3(hJ0)dG5_sA7+eU2=oI9[tK4]", "DJANGO_ALLOWED_HOSTS": "chat.example.com"}


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
                 "DJANGO_SECURE_PROXY_SSL_HEADER", "DJANGO_CSRF_TRUSTED_ORIGINS"):
        assert name in text, name
