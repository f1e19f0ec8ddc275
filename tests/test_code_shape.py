"""The package's shape, asserted: its rooms and which may import which, no import cycles
(function-level imports included), and functions that fit on a screen.

Rooms, lowest first (docs/architecture.md draws them). A module imports only from its own room
or a lower one, so the file list reads as the architecture and nothing imports upward:

* **core** (modules at the top: settings, models, types, events, errors, hooks, plugins,
  components, profiles, permissions, language data, text utilities);
* **services** (``search/``, ``ingestion/``, ``backends/``, ``tasks.py``): storage, search,
  model servers, background work;
* **answerer** (``answerer/``): the offline extractive answerer;
* **stages** (``stages/``): one module per kind of pipeline component;
* **turn** (``turn/``): the turn runtime (pipeline, context, advisors, persistence, limits...);
* **transport** (``transport/``): websockets, server-sent events, the chat page;
* **edges** (``api/``, ``admin/``, ``management/``, ``templatetags/``, ``testing/``, and the
  faces Django and Channels look for: ``apps``, ``checks``, ``urls``, ``site_urls``).

Imports under ``if TYPE_CHECKING:`` are not run, so they do not count."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import django_ragchat

PACKAGE = Path(django_ragchat.__file__).parent

ROOMS = ("core", "services", "answerer", "stages", "turn", "transport", "edges")
# The top of a module's dotted name (after "django_ragchat.") -> its room.
ROOM_OF = {
    **dict.fromkeys(("", "conf", "types", "events", "exceptions", "hookspecs", "components", "plugins", "profiles",
                     "models", "fields", "permissions", "language", "tables", "text", "tokens", "access", "tools"), "core"),
    **dict.fromkeys(("search", "ingestion", "backends", "tasks", "sources"), "services"),
    "answerer": "answerer",
    "stages": "stages",
    "turn": "turn",
    "transport": "transport",
    **dict.fromkeys(("api", "admin", "management", "templatetags", "testing", "apps", "checks", "urls", "site_urls", "openai_api"),
                    "edges"),
}
#: Functions allowed over MAX_FUNCTION_LINES, each with the reason.
MAX_FUNCTION_LINES = 60
LONG_FUNCTIONS: dict[str, str] = {}


# A set or tuple of words written in code: frozenset("a b c".split()), {"a", "b", "c", ...}.
WORD_LIST_LITERAL = re.compile(r"""(["'])[a-z' ]+\1\.split\(\)|\(\s*(?:"[a-z' -]+",\s*){4,}|\{\s*(?:"[a-z' -]+",\s*){4,}""")


def room_of(module: str) -> str:
    parts = module.split(".")
    return ROOM_OF[parts[1] if len(parts) > 1 else ""]

def module_names() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        parts = ["django_ragchat", *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Every package module ``name`` imports at run time, wherever the import statement is."""
    found: set[str] = set()
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]

    class Visitor(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            if _is_type_checking(node.test):
                for child in node.orelse:
                    self.visit(child)
            else:
                self.generic_visit(node)

        def visit_Import(self, node: ast.Import) -> None:
            found.update(alias.name for alias in node.names)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            if node.level:
                base = package[:len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            submodules = {f"{module}.{alias.name}" for alias in node.names} & known  # "from pkg import module"
            found.update(submodules)
            if len(submodules) < len(node.names):  # names from the module itself, not only its submodules
                found.add(module)

    Visitor().visit(ast.parse(path.read_text(encoding="utf-8")))
    return {m for m in found if m in known and m != name}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def import_graph() -> dict[str, set[str]]:
    modules = module_names()
    return {name: imports_of(name, path, set(modules)) for name, path in modules.items()}


def test_the_package_has_no_import_cycles():
    assert find_cycles(import_graph()) == []


def test_every_module_lives_in_a_room():
    assert [name for name in module_names() if name.split(".")[1:2] and name.split(".")[1] not in ROOM_OF] == []


def test_nothing_imports_from_a_higher_room():
    upward = [
        f"{name} ({room_of(name)}) imports {other} ({room_of(other)})"
        for name, imports in sorted(import_graph().items()) for other in sorted(imports)
        if ROOMS.index(room_of(other)) > ROOMS.index(room_of(name))
    ]
    assert upward == []


def test_only_the_edges_run_the_pipeline_and_the_stages_import_no_vocabulary():
    graph = import_graph()
    importers = sorted(name for name, imports in graph.items() if "django_ragchat.turn.pipeline" in imports)
    # Only the edges (transports, the API, the terminal) call the pipeline.
    assert set(importers) <= {"django_ragchat.transport.turns", "django_ragchat.api.views",
                              "django_ragchat.management.commands.ragchat_chat"}, importers
    assert "django_ragchat.turn.pipeline" not in graph["django_ragchat.turn.context"]
    # The answerer's vocabulary is handed to the components that read it, never imported by them.
    for stage in ("transformers", "expanders"):
        assert not {m for m in graph[f"django_ragchat.stages.{stage}"] if m.startswith("django_ragchat.answerer")}
        assert "django_ragchat.language" not in graph[f"django_ragchat.stages.{stage}"]


def _functions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def test_functions_fit_on_a_screen():
    """No function (docstring included) is longer than MAX_FUNCTION_LINES, except those listed
    with a reason in LONG_FUNCTIONS."""
    long = {}
    for name, path in module_names().items():
        for node in _functions(ast.parse(path.read_text(encoding="utf-8"))):
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                long[f"{name}:{node.name}"] = lines
    assert set(long) == set(LONG_FUNCTIONS), long


def test_the_language_data_holds_the_word_lists_not_the_code():
    """The offline components' vocabulary is data (``django_ragchat/lang/``): no module of the
    answerer or the followup transformer builds a set of words from a literal."""
    for module in ("answerer.vocabulary", "answerer.passages", "answerer.question", "answerer.selector",
                   "stages.transformers", "stages.expanders", "search.subjects"):
        source = inspect.getsource(importlib.import_module(f"django_ragchat.{module}"))
        assert not WORD_LIST_LITERAL.search(source), (module, WORD_LIST_LITERAL.search(source))


def test_the_cycle_finder_sees_function_level_imports_and_ignores_type_checking_ones(tmp_path):
    module = tmp_path / "stage.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from django_ragchat.turn.pipeline import TurnContext\n"
        "def later():\n"
        "    from django_ragchat.turn import pipeline\n"
        "    from . import types\n"
    )
    known = {"django_ragchat.turn", "django_ragchat.turn.pipeline", "django_ragchat.types", "django_ragchat.stage"}
    assert imports_of("django_ragchat.stage", module, known) == {"django_ragchat.turn.pipeline", "django_ragchat.types"}
    module.write_text("if TYPE_CHECKING:\n    from django_ragchat.turn.pipeline import TurnContext\n")
    assert imports_of("django_ragchat.stage", module, known) == set()
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_user_facing_error_shares_one_base_with_a_stable_code_and_a_safe_message():
    from django_ragchat.api.views import APIError
    from django_ragchat.exceptions import InvalidMessage, LLMError, RagchatError, TurnInProgress
    from django_ragchat.transport.turns import TurnRefused
    from django_ragchat.turn.pipeline import describe_error

    errors = [
        InvalidMessage("too_long", "The message is too long."),
        TurnInProgress(),
        LLMError("rate_limited", "The model is busy.", retry_after=2.5),
        TurnRefused("too_many_streams", "Too many answers at once.", 429, retry_after=1.0),
        APIError(409, "turn_in_progress", "Wait for the answer."),
    ]
    assert all(isinstance(e, RagchatError) for e in errors)
    assert [(e.code, e.http_status) for e in errors] == [
        ("too_long", 413), ("turn_in_progress", 409), ("rate_limited", 502), ("too_many_streams", 429),
        ("turn_in_progress", 409)]
    assert describe_error(errors[2]) == ("rate_limited", "The model is busy.", 2.5)
    assert errors[2].user_message == "The model is busy." and str(errors[2]) == "rate_limited: The model is busy."
    assert errors[1].as_dict() == {"code": "turn_in_progress", "message": TurnInProgress.default_message,
                                   "retry_after": 1.0}
    assert isinstance(errors[0], ValueError)  # callers catching ValueError keep working
    assert str(errors[4].detail) == "Wait for the answer." and errors[4].status_code == 409
