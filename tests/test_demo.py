"""The demo: it ingests the sample product documents only (never this project's docs/), and its
page says answers are extractive until a model is configured, naming the variables that
plug one in."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RENDER = (
    "from django.template.loader import render_to_string; from django.test import RequestFactory; "
    "print(render_to_string('django_ragchat/chat.html', {'config': {}}, request=RequestFactory().get('/')))"
)


def demo_page(tmp_path, **env) -> str:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("DJANGO_SETTINGS_MODULE", "OPENAI_API_KEY", "RAGCHAT_LLM_BASE_URL", "DATABASE_URL")}
    clean.update(DJANGO_DEBUG="1", DATABASE_URL=f"sqlite:///{tmp_path / 'demo.sqlite3'}", TMPDIR=str(tmp_path), **env)
    result = subprocess.run([sys.executable, "manage.py", "shell", "-c", RENDER], cwd=ROOT, env=clean,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_demo_ingests_the_sample_documents_only():
    lines = [shlex.split(line) for line in (ROOT / "scripts" / "demo.sh").read_text().splitlines()
             if "ragchat_ingest" in line and not line.lstrip().startswith("#")]
    assert len(lines) == 1
    paths = [a for a in lines[0][lines[0].index("ragchat_ingest") + 1:] if not a.startswith("-") and a != "."]
    assert paths == ["example_project/sample_docs"]


@pytest.mark.slow
def test_the_demo_page_says_answers_are_extractive_until_a_model_is_configured(tmp_path):
    page = demo_page(tmp_path)
    assert "extractive" in page
    for variable in ("RAGCHAT_LLM_BASE_URL", "RAGCHAT_CHAT_MODEL", "RAGCHAT_EMBEDDING_MODEL"):
        assert variable in page
    readme = (ROOT / "README.md").read_text()
    assert "extractive" in readme and all(v in readme for v in ("RAGCHAT_LLM_BASE_URL", "RAGCHAT_CHAT_MODEL",
                                                                 "RAGCHAT_EMBEDDING_MODEL"))
    configured = demo_page(tmp_path, RAGCHAT_LLM_BASE_URL="http://127.0.0.1:9/v1")
    assert "demo-notice" not in configured and "ragchat" in configured
