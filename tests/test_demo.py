"""The demo: its products come from the shop's Product model (synced by ``ragchat_sync``), its
policies from the sample policies page only (never this project's docs/), and its page says
answers are extractive until a model is configured, naming the variables that plug one in."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

# Its sites run on SQLite files of their own: the PostgreSQL pass leaves it out (tests/conftest.py).
pytestmark = pytest.mark.own_database

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


def test_the_demo_syncs_the_shop_and_ingests_the_sample_policies_only():
    script = [line for line in (ROOT / "scripts" / "demo.sh").read_text().splitlines()
              if not line.lstrip().startswith("#")]
    lines = [shlex.split(line) for line in script if "ragchat_ingest" in line]
    assert len(lines) == 1
    paths = [a for a in lines[0][lines[0].index("ragchat_ingest") + 1:] if not a.startswith("-") and a != "."]
    assert paths == ["example_project/sample_docs/support.md"]
    assert any("manage.py ragchat_sync" in line for line in script)


@pytest.mark.slow
def test_the_demo_answers_from_the_shop_and_keeps_staff_notes_from_visitors(tmp_path):
    """The demo's setup (migrate, ragchat_sync, the policies page) on a fresh database: a visitor's
    price question is answered from the Product model; the staff-only notes reach staff only."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("DJANGO_SETTINGS_MODULE", "OPENAI_API_KEY", "RAGCHAT_LLM_BASE_URL", "DATABASE_URL")}
    env.update(DJANGO_DEBUG="1", DATABASE_URL=f"sqlite:///{tmp_path / 'demo.sqlite3'}", TMPDIR=str(tmp_path))

    def manage(*argv: str) -> str:
        result = subprocess.run([sys.executable, "manage.py", *argv], cwd=ROOT, env=env, capture_output=True,
                                text=True, timeout=180)
        assert result.returncode == 0, result.stderr
        return result.stdout

    manage("migrate", "--no-input")
    assert "Synced 2 source(s): 6 created" in manage("ragchat_sync", "--no-progress")
    manage("ragchat_ingest", "example_project/sample_docs/support.md", "--root", ".", "--no-progress")
    answer = json.loads(manage("ragchat_chat", "--message", "How much does the Aurora X2 cost?", "--json"))
    assert "$699" in answer["answer"] and answer["sources"][0]["source"].startswith("products:")
    question = "What is the supplier cost of the Aurora X2?"
    visitor = manage("ragchat_chat", "--message", question, "--json")
    assert "$412" not in visitor and "staff notes" not in visitor
    manage("shell", "-c", "from django.contrib.auth.models import User; "
                          "User.objects.create_user('clerk', password='pw', is_staff=True)")
    staff = json.loads(manage("ragchat_chat", "--message", question, "--json", "--user", "clerk"))
    assert any(s["source"].startswith("product_notes:") for s in staff["sources"])


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


@pytest.mark.slow
@pytest.mark.browser
def test_the_demo_under_uvicorn_serves_its_script_and_icon_and_fits_a_phone(tmp_path):
    """The demo site under the ASGI server docs/deployment.md names (``uvicorn
    example_project.asgi:application``): the chat page's script and styles and the icon are
    served (uvicorn serves no static files), and on a phone the extractive-answers notice takes
    one line, not a fifth of the screen. Screenshot: var/screenshots/demo-phone.png."""
    import contextlib
    import socket
    import time

    import httpx

    from tests.live_servers import chromium, free_port

    env = {k: v for k, v in os.environ.items()
           if k not in ("DJANGO_SETTINGS_MODULE", "OPENAI_API_KEY", "RAGCHAT_LLM_BASE_URL", "DATABASE_URL",
                        "REDIS_URL")}
    env.update(DJANGO_DEBUG="1", DATABASE_URL=f"sqlite:///{tmp_path / 'demo.sqlite3'}", TMPDIR=str(tmp_path))
    subprocess.run([sys.executable, "manage.py", "migrate", "--no-input"], cwd=ROOT, env=env, check=True,
                   capture_output=True, timeout=120)
    port = free_port()
    log = (tmp_path / "uvicorn.log").open("wb")
    server = subprocess.Popen([sys.executable, "-m", "uvicorn", "example_project.asgi:application", "--port", str(port),
                               "--ws-per-message-deflate", "false"], cwd=ROOT, env=env, stdout=log,
                              stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, (tmp_path / "uvicorn.log").read_text()
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
            assert time.monotonic() < deadline
            time.sleep(0.1)
        with httpx.Client(base_url=url, timeout=30, follow_redirects=True) as client:
            page = client.get("/")
            assert page.status_code == 200
            assets = re.findall(r'(?:src|href)="(/static/[^"]+)"', page.text)
            assert any(a.endswith("widget.js") for a in assets), assets
            for asset in assets:
                assert client.get(asset).status_code == 200, asset
            icon = client.get("/favicon.ico")
            assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/svg+xml")

        with chromium(window="390,844") as driver:
            driver.get(url + "/")
            for _ in range(200):
                if driver.execute_script("const w = document.querySelector('.ragchat'); "
                                         "return w && w.dataset.ready === 'true'"):
                    break
                time.sleep(0.1)
            notice, screen = driver.execute_script(
                "return [document.getElementById('demo-notice').getBoundingClientRect().height, innerHeight]")
            shots = ROOT / "var" / "screenshots"
            shots.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(shots / "demo-phone.png"))
        assert notice <= 0.08 * screen, f"the notice takes {notice:.0f} of {screen} px"
    finally:
        server.terminate()
        server.wait(10)
        log.close()
