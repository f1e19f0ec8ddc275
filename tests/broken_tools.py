"""A plugin whose tools partly fail to register (tests/test_tool_schema.py)."""

from __future__ import annotations

from django_ragchat import hookimpl


def fine_tool(turn, text: str) -> str:
    """Echoes."""
    return text


def broken_tool(turn, when: NoSuchType) -> str:  # noqa: F821 - an annotation that names nothing
    """Cannot be described."""


@hookimpl
def register_tools(register):
    register(fine_tool)
    register(broken_tool)
    raise RuntimeError("no tools today")


def two_problems(turn, day: type, count) -> str:
    """Neither parameter can be described."""


def unresolved(turn, city: Nowhere, text: str) -> str:  # noqa: F821 - an annotation that names nothing
    """One annotation names nothing."""


class Several:
    """Registers two tools with problems and one that works, and does not fail itself."""

    @hookimpl
    def register_tools(self, register):
        register(two_problems)
        register(unresolved)
        register(fine_tool)


several = Several()
