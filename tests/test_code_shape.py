"""The package's import graph has no cycles, function-level imports included: the pipeline
imports the stages, the stages import ``context``, ``types`` and ``components``, and nothing
goes back up. Imports under ``if TYPE_CHECKING:`` are not run, so they do not count."""

from __future__ import annotations

import ast
from pathlib import Path

import django_ragchat

PACKAGE = Path(django_ragchat.__file__).parent


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
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)  # "from pkg import module"

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


def test_stages_do_not_import_the_pipeline():
    graph = import_graph()
    importers = sorted(name for name, imports in graph.items() if "django_ragchat.pipeline" in imports)
    # Only the edges (transports, the API, the terminal) call the pipeline.
    assert set(importers) <= {"django_ragchat.transport", "django_ragchat.api.views",
                              "django_ragchat.management.commands.ragchat_chat"}, importers
    assert "django_ragchat.pipeline" not in graph["django_ragchat.context"]


def test_the_cycle_finder_sees_function_level_imports_and_ignores_type_checking_ones(tmp_path):
    module = tmp_path / "stage.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from django_ragchat.pipeline import TurnContext\n"
        "def later():\n"
        "    from django_ragchat import pipeline\n"
        "    from . import types\n"
    )
    known = {"django_ragchat.pipeline", "django_ragchat.types", "django_ragchat.stage"}
    assert imports_of("django_ragchat.stage", module, known) == {"django_ragchat.pipeline", "django_ragchat.types"}
    module.write_text("if TYPE_CHECKING:\n    from django_ragchat.pipeline import TurnContext\n")
    assert imports_of("django_ragchat.stage", module, known) == set()
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_user_facing_error_shares_one_base_with_a_stable_code_and_a_safe_message():
    from django_ragchat.api.views import APIError
    from django_ragchat.exceptions import InvalidMessage, LLMError, RagchatError, TurnInProgress
    from django_ragchat.pipeline import describe_error
    from django_ragchat.transport import TurnRefused

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
    assert errors[1].as_dict() == {"code": "turn_in_progress", "message": TurnInProgress.default_message}
    assert isinstance(errors[0], ValueError)  # callers catching ValueError keep working
    assert str(errors[4].detail) == "Wait for the answer." and errors[4].status_code == 409
