"""Every plugin in plugins/ installed, then each one missing: the app starts, ``ragchat_plugins``
lists what is installed, and a turn runs with each installed plugin's components in its trace.

"Missing" is real, not a mock: the child process gets a site-packages directory that holds
everything of this environment except the distribution's files (its .dist-info, its editable
.pth and finder), so neither its entry point nor its package can be found.
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
# entry point name -> distribution file prefix
PLUGINS = {
    "lexical_rerank": "ragchat_lexical_rerank",
    "pii_guard": "ragchat_pii_guard",
    "prompt_guard": "ragchat_prompt_guard",
}

CHILD = r"""
import json, os, site, sys
site.addsitedir(sys.argv[1])
sys.path[:0] = [sys.argv[2], sys.argv[3]]
os.environ["DJANGO_SETTINGS_MODULE"] = "child_settings"
import django
django.setup()
from django.core import checks
from django.core.management import call_command
from django.contrib.auth import get_user_model
call_command("migrate", verbosity=0)
problems = [f"{m.id}: {m.msg}" for m in checks.run_checks() if m.level >= checks.ERROR]
from django_ragchat.management.commands.ragchat_plugins import describe
from django_ragchat.ingestion.pipeline import ingest_text
from django_ragchat.models import Conversation
from django_ragchat.turn.pipeline import run_turn_sync
ingest_text("aurora.md", "# Aurora X2\n\n## Pricing\nThe Aurora X2 costs $699. Call +1 (555) 123-4567.\n")
conversation = Conversation.objects.create(owner=get_user_model().objects.create_user("child"))
result = run_turn_sync(conversation, "How much does the Aurora X2 cost?")
print(json.dumps({
    "problems": problems,
    "listed": [p["name"] for p in describe()["plugins"] if not p["builtin"]],
    "trace_plugins": sorted({c["plugin"] for c in result.trace["components"]}),
    "status": result.status,
    "answer": result.answer,
}))
"""


def site_without(tmp_path: Path, missing: str | None) -> Path:
    """A site directory of symlinks to this environment's site-packages, minus one distribution."""
    source = Path(sysconfig.get_paths()["purelib"])
    farm = tmp_path / "site"
    farm.mkdir()
    prefix = PLUGINS.get(missing, None)
    for entry in source.iterdir():
        name = entry.name
        if prefix and (name.startswith(prefix + "-") or name.startswith(f"__editable__.{prefix}-")
                       or name.startswith(f"__editable___{prefix}_")):
            continue
        (farm / name).symlink_to(entry)
    return farm


def run_child(tmp_path: Path, missing: str | None) -> dict:
    farm = site_without(tmp_path, missing)
    (tmp_path / "child_settings.py").write_text(
        "from tests.settings import *  # noqa: F401,F403\n"
        f"DATABASES = {{'default': {{'ENGINE': 'django.db.backends.sqlite3', 'NAME': {str(tmp_path / 'db.sqlite3')!r}}}}}\n"
        "RAGCHAT = {**RAGCHAT, 'LOAD_ENTRY_POINTS': True, 'PLUGINS': []}\n"
    )
    completed = subprocess.run(
        [sys.executable, "-S", "-c", CHILD, str(farm), str(tmp_path), str(REPO)],
        capture_output=True, text=True, timeout=240, cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TMPDIR": str(tmp_path)},
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("missing", [None, *PLUGINS])
def test_every_plugin_installed_or_one_missing(tmp_path, missing):
    result = run_child(tmp_path, missing)
    expected = sorted(name for name in PLUGINS if name != missing)
    assert result["problems"] == []
    assert sorted(result["listed"]) == expected
    assert result["status"] == "complete" and "$699" in result["answer"]
    # Each installed plugin's components ran in the turn (entry point names as plugin names).
    assert set(expected) <= set(result["trace_plugins"])
    assert missing not in result["trace_plugins"]
    if "pii_guard" in expected:
        assert "123-4567" not in result["answer"]  # it redacts, so it really ran
