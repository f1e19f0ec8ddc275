"""docs/plugins.md: the guide's copy-paste pyproject.toml and plugin module really install
(built offline by pip, as a user would), and the installed plugin loads through its entry point."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import distributions
from pathlib import Path

import pytest
from django.conf import settings
from django.test import override_settings

from django_ragchat import hookimpl, plugins
from django_ragchat.models import Message
from django_ragchat.turn.pipeline import run_turn_sync

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "plugins.md"


def guide_block(marker_or_heading: str, language: str) -> str:
    """The first ``language`` code block after ``marker_or_heading`` in the guide."""
    text = GUIDE.read_text(encoding="utf-8")
    start = text.index(marker_or_heading)
    match = re.compile(rf"```{language}\n(.*?)```", re.DOTALL).search(text, start)
    return match.group(1)


@pytest.fixture(scope="module")
def installed_guide_plugin(tmp_path_factory):
    source = tmp_path_factory.mktemp("guide-plugin")
    (source / "pyproject.toml").write_text(guide_block("<!-- guide:pyproject -->", "toml"))
    package = source / "ragchat_drop_drafts"
    package.mkdir()
    (package / "__init__.py").write_text(guide_block("## A plugin in one file", "python"))
    target = tmp_path_factory.mktemp("site")
    completed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "--target", str(target), str(source)],
        capture_output=True, text=True, timeout=300,
        env={"PATH": "/usr/bin:/bin", "HOME": str(source), "TMPDIR": str(source), "PIP_NO_INPUT": "1"},
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    sys.path.insert(0, str(target))
    yield target
    sys.path.remove(str(target))
    for name in [m for m in sys.modules if m.startswith("ragchat_drop_drafts")]:
        del sys.modules[name]


def test_the_guide_pyproject_installs_with_its_metadata(installed_guide_plugin):
    (dist,) = [d for d in distributions(path=[str(installed_guide_plugin)]) if d.metadata["Name"] == "ragchat-drop-drafts"]
    assert dist.version == "0.1.0"
    assert dist.metadata["License-Expression"] == "BSD-3-Clause"
    (entry_point,) = [ep for ep in dist.entry_points if ep.group == "django_ragchat"]
    assert (entry_point.name, entry_point.value) == ("drop_drafts", "ragchat_drop_drafts")


def test_the_installed_guide_plugin_loads_through_its_entry_point(installed_guide_plugin):
    with override_settings(RAGCHAT={**settings.RAGCHAT, "LOAD_ENTRY_POINTS": True}):
        registration = plugins.get_registry().get("document_postprocessor", "drop_drafts")
        assert registration.plugin == "drop_drafts" and registration.order == 60
        assert "drop_drafts" in [p["name"] for p in plugins.plugin_listing()]


class _GuidePasswordPlugin:
    """The guide's ``NoPasswords`` guardrail ("Redacting the user's message"), as written."""

    namespace: dict = {}

    @staticmethod
    @hookimpl
    def register_guardrails(register):
        register(_GuidePasswordPlugin.namespace["NoPasswords"])


@pytest.mark.django_db
def test_the_guides_redacting_guardrail_keeps_the_password_out(ragchat_settings_override, conversation):
    exec(guide_block("### Redacting the user's message", "python"), _GuidePasswordPlugin.namespace)
    ragchat_settings_override(PLUGINS=["tests.test_plugin_guide._GuidePasswordPlugin"],
                              PROFILES={"default": {"guardrails": ["no_passwords"]}})
    on = run_turn_sync(conversation, "My password: Hunter2 no longer opens the printer's page")
    refused = run_turn_sync(conversation, "sudo asks for my password: Hunter2")
    assert refused.answer == "I can't help with that here."
    kept = list(Message.objects.filter(role="user").order_by("seq").values_list("content", flat=True))
    assert kept == ["My password: [redacted] no longer opens the printer's page", "sudo asks for my password: [redacted]"]
    assert on.trace["redactions"] == [{"by": "no_passwords", "reason": "a password"}]
    assert "Hunter2" not in str(on.trace) + str(refused.trace)
