"""The plugin system: loading from settings and entry points, order, checks, lifecycle hooks."""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command

from django_ragchat import checks, hookimpl, plugins
from django_ragchat.models import Conversation
from django_ragchat.profiles import get_profile
from django_ragchat.stages.transformers import QueryTransformer
from django_ragchat.turn.context import components_for
from django_ragchat.turn.pipeline import run_turn_sync

PLUGIN_DIST = Path(__file__).parent / "plugin_dist"


@pytest.fixture(scope="session")
def installed_plugin_dist(tmp_path_factory):
    """The test distribution, really installed by pip into a private folder on sys.path.

    pip builds it offline (no build isolation) and writes its .dist-info with the entry point,
    which importlib.metadata then finds exactly as for any installed distribution.
    """
    target = tmp_path_factory.mktemp("site")
    # Build from a copy: setuptools writes build/ and .egg-info/ next to the sources.
    source = tmp_path_factory.mktemp("dist") / "plugin_dist"
    shutil.copytree(PLUGIN_DIST, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(target), str(source)],
        check=True, capture_output=True,
    )
    sys.path.insert(0, str(target))
    importlib.invalidate_caches()
    yield target
    sys.path.remove(str(target))
    sys.modules.pop("ragchat_example_plugin", None)


def test_builtin_components_register_through_the_public_hooks():
    registry = plugins.get_registry()
    assert registry.errors == []
    by_kind = {(r.kind, r.name): r.plugin for r in registry.all()}
    assert by_kind[("retriever", "vector")] == "django_ragchat.stages.retrievers"
    assert by_kind[("llm", "extractive")] == "django_ragchat.stages.llms"
    assert by_kind[("query_transformer", "followup")] == "django_ragchat.stages.transformers"
    # Every built-in module is an ordinary pluggy plugin.
    names = {name for name, _ in plugins.get_plugin_manager().list_name_plugin()}
    assert set(plugins.DEFAULT_PLUGINS) <= names


@pytest.mark.django_db
def test_entry_point_and_settings_plugins_take_part_in_a_turn_in_documented_order(
    installed_plugin_dist, ragchat_settings_override, product_corpus, user
):
    ragchat_settings_override(LOAD_ENTRY_POINTS=True, PLUGINS=["tests.settings_plugin"])
    import ragchat_example_plugin

    registrations = plugins.get_registry().ordered("query_transformer")
    assert [(r.name, r.plugin) for r in registrations] == [
        ("entrypoint_early", "example"),                      # order 10
        ("followup", "django_ragchat.stages.transformers"),          # order 50
        ("settings_marker", "tests.settings_plugin"),         # order 100, loaded before entry points
        ("entrypoint_late", "example"),                       # order 100, loaded last
    ]
    conversation = Conversation.objects.create(owner=user)
    result = run_turn_sync(conversation, "What does the Aurora X2 cost?")
    assert [step["by"] for step in result.trace["queries"]["transformed"]] == [
        "entrypoint_early", "followup", "settings_marker", "entrypoint_late",
    ]
    assert result.trace["queries"]["transformed"][-1]["note"] == "entry point, order 100"
    assert result.message["id"] in ragchat_example_plugin.COMPLETED_TURNS

    listing = {p["name"]: p for p in plugins.plugin_listing()}
    assert listing["example"]["version"] == "1.2.3"
    assert "register_query_transformers" in listing["example"]["hooks"]
    assert listing["tests.settings_plugin"]["builtin"] is False


@pytest.mark.django_db
def test_ragchat_plugins_command_lists_plugins_in_call_order(installed_plugin_dist, ragchat_settings_override, capsys):
    ragchat_settings_override(LOAD_ENTRY_POINTS=True, PLUGINS=["tests.settings_plugin"])
    call_command("ragchat_plugins")
    out = capsys.readouterr().out
    assert "example" in out and "tests.settings_plugin" in out
    assert out.index("entrypoint_early") < out.index("followup") < out.index("settings_marker") < out.index("entrypoint_late")


def test_entry_points_are_not_loaded_when_disabled(installed_plugin_dist):
    names = {name for name, _ in plugins.get_plugin_manager().list_name_plugin()}
    assert "example" not in names


def test_misspelt_hook_is_a_system_check_error(ragchat_settings_override):
    ragchat_settings_override(PLUGINS=["tests.broken_plugins.misspelt"])
    errors = checks.check_plugins()
    assert [e.id for e in errors] == ["ragchat.E005"]
    assert "register_retreivers" in errors[0].msg


def test_every_misspelt_hook_is_reported_by_the_plugin_s_name_with_the_close_hooks(ragchat_settings_override):
    """A plugin author's trial: E005 named the plugin by its repr and stopped at the first
    misspelt hook, with no suggestion."""
    ragchat_settings_override(PLUGINS=["tests.broken_plugins.misspelt", "tests.broken_plugins.two_misspelt"])
    errors = checks.check_plugins()
    assert [e.id for e in errors] == ["ragchat.E005"] * 3
    by_hook = {e.msg.split("does not exist: ")[1].split()[0]: e for e in errors}
    assert set(by_hook) == {"'register_retreivers'", "'register_guardrials'", "'on_turn_complete'"}
    retreivers = by_hook["'register_retreivers'"]
    assert retreivers.msg.startswith("Plugin 'tests.broken_plugins.misspelt' implements")
    assert "object at 0x" not in retreivers.msg + retreivers.hint and "<" not in retreivers.msg
    assert retreivers.hint.startswith("Did you mean 'register_retrievers'?")
    assert "'tests.broken_plugins.misspelt' in RAGCHAT['PLUGINS']" in retreivers.hint
    assert "Did you mean 'register_guardrails'?" in by_hook["'register_guardrials'"].hint
    assert "'on_turn_completed'" in by_hook["'on_turn_complete'"].hint


def test_a_settings_plugin_s_hint_names_its_settings_entry(ragchat_settings_override):
    ragchat_settings_override(PLUGINS=["no_such_module_anywhere"])
    [error] = checks.check_plugins()
    assert error.hint == "Fix the plugin, or remove 'no_such_module_anywhere' from RAGCHAT['PLUGINS']."


def test_registering_a_non_component_names_the_plugin(ragchat_settings_override):
    ragchat_settings_override(PLUGINS=["tests.broken_plugins.not_a_component"])
    errors = checks.check_plugins()
    assert [e.id for e in errors] == ["ragchat.E004"]
    assert "tests.broken_plugins.not_a_component" in errors[0].msg


def test_unimportable_plugin_is_reported_not_raised(ragchat_settings_override):
    ragchat_settings_override(PLUGINS=["no_such_module_anywhere"])
    errors = checks.check_plugins()
    assert [e.id for e in errors] == ["ragchat.E004"]
    assert "no_such_module_anywhere" in errors[0].msg


def test_a_misspelt_plugin_module_is_said_to_be_neither_a_module_nor_an_attribute(ragchat_settings_override):
    """A new user's trial: "boxoffice.ragchatt" was reported as 'Module "boxoffice" does not define a
    "ragchatt" attribute/class', as if an object had been meant, not a module misspelt."""
    ragchat_settings_override(PLUGINS=["tests.settings_plugn"])
    [error] = checks.check_plugins()
    assert error.id == "ragchat.E004"
    assert error.msg == ("Cannot import plugin 'tests.settings_plugn' from RAGCHAT['PLUGINS']: there is no module "
                         "'tests.settings_plugn', and the module 'tests' has no attribute 'settings_plugn'. Did you "
                         "mean 'tests.settings_plugin'?")  # a submodule, imported or not
    ragchat_settings_override(PLUGINS=["tests.broken_plugins.not_there"])  # a module's object misspelt
    [error] = checks.check_plugins()
    assert "the module 'tests.broken_plugins' has no attribute 'not_there'." in error.msg


def test_duplicate_component_names_are_reported():
    registry = plugins.ComponentRegistry()

    class One(QueryTransformer):
        name = "same"

    registry.add("query_transformer", One, "first")
    registry.add("query_transformer", One, "second")
    assert registry.errors == [
        "Plugin 'second' registered a query_transformer named 'same', which plugin 'first' already registered."
    ]


def test_ties_are_broken_by_registration_order():
    registry = plugins.ComponentRegistry()

    def make(name, order):
        return type(name, (QueryTransformer,), {"name": name, "order": order})

    for name, order in [("c", 5), ("a", 5), ("b", 1)]:
        registry.add("query_transformer", make(name, order), "p")
    assert [r.name for r in registry.ordered("query_transformer")] == ["b", "c", "a"]


async def test_await_me_maybe_resolves_values_awaitables_and_callables():
    async def coro():
        return 2

    assert await plugins.await_me_maybe(1) == 1
    assert await plugins.await_me_maybe(coro()) == 2
    assert await plugins.await_me_maybe(coro) == 2
    assert await plugins.await_me_maybe(lambda: 3) == 3


class _Boom:
    @staticmethod
    @hookimpl
    def on_stage_completed(turn, stage, elapsed_ms):
        raise RuntimeError("observer bug")


@pytest.mark.django_db
def test_a_failing_lifecycle_observer_never_breaks_the_turn(product_corpus, user, caplog):
    plugins.get_plugin_manager().register(_Boom(), name="boom")
    conversation = Conversation.objects.create(owner=user)
    result = run_turn_sync(conversation, "What does the Aurora X2 cost?")
    assert result.status == "complete"
    assert "Plugin 'boom' failed in on_stage_completed" in caplog.text


def test_component_options_come_from_the_profile(ragchat_settings_override):
    ragchat_settings_override(PROFILES={"default": {"options": {"followup": {"max_terms": 2}}}})
    transformer = components_for(get_profile()).query_transformers[0]
    assert transformer.max_terms == 2


def test_unknown_component_option_is_a_profile_check_error(ragchat_settings_override):
    ragchat_settings_override(PROFILES={"default": {"options": {"top_k": {"k": 3}}}})
    errors = checks.check_profiles()
    assert [e.id for e in errors] == ["ragchat.E002"]
    assert "takes no options" in errors[0].msg



PLUGIN_MODULE = '''
from django_ragchat import hookimpl
from django_ragchat.turn.advisors import Advisor


class Hello(Advisor):
    name = "hello_advisor"
    enabled_by_default = False


@hookimpl
def register_advisors(register):
    register(Hello)
'''


def test_a_plugin_listed_by_a_top_level_module_name_is_loaded(tmp_path, monkeypatch, ragchat_settings_override):
    (tmp_path / "ragchat_toplevel_plugin.py").write_text(PLUGIN_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "ragchat_toplevel_plugin", raising=False)
    ragchat_settings_override(PLUGINS=["ragchat_toplevel_plugin"])
    assert checks.check_plugins() == []
    names = {name for name, _ in plugins.get_plugin_manager().list_name_plugin()}
    assert "ragchat_toplevel_plugin" in names
    assert plugins.get_registry().get("advisor", "hello_advisor").plugin == "ragchat_toplevel_plugin"
    sys.modules.pop("ragchat_toplevel_plugin", None)


def test_a_plugin_module_that_fails_to_import_is_reported_with_its_own_error(
    tmp_path, monkeypatch, ragchat_settings_override
):
    (tmp_path / "ragchat_broken_plugin.py").write_text("import a_dependency_that_is_not_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ragchat_settings_override(PLUGINS=["ragchat_broken_plugin"])
    errors = checks.check_plugins()
    assert [e.id for e in errors] == ["ragchat.E004"]
    assert "ragchat_broken_plugin" in errors[0].msg and "a_dependency_that_is_not_installed" in errors[0].msg
    assert "look like a module path" not in errors[0].msg
    sys.modules.pop("ragchat_broken_plugin", None)


def test_a_misspelt_option_names_the_options_the_component_takes(ragchat_settings_override):
    """A component with options of its own (``followup``'s ``max_terms``) is not said to take none."""
    ragchat_settings_override(PROFILES={"default": {"options": {"followup": {"max_term": 2}}}})
    errors = checks.check_profiles()
    assert [e.id for e in errors] == ["ragchat.E002"]
    assert "has no option 'max_term' (did you mean 'max_terms'? its options:" in errors[0].msg, errors[0].msg
    assert "takes no options" not in errors[0].msg


@pytest.fixture
def broken_and_working_dists(tmp_path):
    """Two distributions really installed by pip: one whose module imports a dependency that is
    not installed, one that works (a guardrail)."""
    target = tmp_path / "site"
    for name, module, body in [
        ("ragchat-broken-plugin", "ragchat_broken_dist", "import a_dependency_that_is_not_installed\n"),
        ("ragchat-working-plugin", "ragchat_working_dist",
         "from django_ragchat import hookimpl\n"
         "from django_ragchat.stages.guardrails import Guardrail\n\n"
         "class NoHomework(Guardrail):\n    name = 'no_homework'\n\n"
         "@hookimpl\ndef register_guardrails(register):\n    register(NoHomework)\n"),
    ]:
        source = tmp_path / name
        (source / module).mkdir(parents=True)
        (source / module / "__init__.py").write_text(body)
        (source / "pyproject.toml").write_text(
            f'[build-system]\nrequires = ["setuptools>=68"]\nbuild-backend = "setuptools.build_meta"\n\n'
            f'[project]\nname = "{name}"\nversion = "0.1"\n\n'
            f'[project.entry-points.django_ragchat]\n{module} = "{module}"\n')
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                        "--no-index", "--target", str(target), str(source)], check=True, capture_output=True)
    sys.path.insert(0, str(target))
    importlib.invalidate_caches()
    yield
    sys.path.remove(str(target))
    for module in ("ragchat_broken_dist", "ragchat_working_dist"):
        sys.modules.pop(module, None)


def test_a_broken_entry_point_is_reported_by_name_and_the_others_still_load(
        broken_and_working_dists, ragchat_settings_override, caplog, capsys):
    """A new user's trial: one distribution whose import failed switched off every entry point
    plugin, its guardrail with it, and nothing was logged under a server (which runs no checks)."""
    ragchat_settings_override(LOAD_ENTRY_POINTS=True)
    with caplog.at_level("ERROR", logger="django_ragchat.plugins"):
        registry = plugins.get_registry()
    assert registry.get("guardrail", "no_homework").plugin == "ragchat_working_dist"
    [error] = [e for e in checks.check_plugins() if e.id == "ragchat.E004"]
    assert "'ragchat_broken_dist'" in error.msg and "'ragchat-broken-plugin' 0.1" in error.msg
    assert "a_dependency_that_is_not_installed" in error.msg
    assert "ragchat_broken_dist" in caplog.text and "ragchat.E004" in caplog.text
    # The hint says where it came from (a site builder's trial: it said to remove it from
    # RAGCHAT['PLUGINS'], where it never was).
    assert "RAGCHAT['PLUGINS']" not in error.hint, error.hint
    assert "entry point `ragchat_broken_dist = ragchat_broken_dist` (group 'django_ragchat')" in error.hint
    assert "'ragchat-broken-plugin'" in error.hint and "pip uninstall" in error.hint
    # The listing command still runs, to diagnose it, and prints the problem.
    call_command("ragchat_plugins")
    out, err = capsys.readouterr()
    assert "ragchat_working_dist" in out and "ragchat_broken_dist" in err


def test_a_component_of_an_entry_point_plugin_that_fails_to_build_names_the_entry_point(
        installed_plugin_dist, ragchat_settings_override):
    """E002's hint of a component that rejects its options says which plugin registered it and
    where that plugin came from, not RAGCHAT['PLUGINS'] (a site builder's trial)."""
    ragchat_settings_override(LOAD_ENTRY_POINTS=True, PROFILES={"default": {"options": {
        "entrypoint_early": {"colour": "red"}, "entrypoint_late": {"size": 3}}}})
    errors = [e for e in checks.check_profiles() if e.id == "ragchat.E002"]
    assert len(errors) == 2, [e.msg for e in errors]  # both, not the first
    early = next(e for e in errors if "entrypoint_early" in e.msg)
    assert "takes no options; got ['colour']" in early.msg
    assert "registered by the plugin 'example'" in early.hint
    assert "the entry point `example = ragchat_example_plugin` (group 'django_ragchat') of the distribution " \
           "'ragchat-example-plugin' 1.2.3" in early.hint
    assert "RAGCHAT['PLUGINS']" not in early.hint
