"""A plugin whose one tool is wrong in its options and its parameters: ``@tool`` refuses it as
the module is imported (tests/test_tool_schema.py)."""

from __future__ import annotations

from django_ragchat import hookimpl
from django_ragchat.tools import tool


@tool(name="order lookup", timeout=0)
def order_lookup(turn, number, since: type) -> str:
    """Three problems of its own, besides the name: every one said in one run."""


@hookimpl
def register_tools(register):
    register(order_lookup)
