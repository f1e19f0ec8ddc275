"""What a component's method may return, checked where the pipeline reads it.

A plugin method that returned the wrong kind of value passed silently (a guardrail's string
instead of a ``Refusal`` let the message through) or failed far from it, naming no component
("'str' object has no attribute 'metadata'"). ``checked`` and ``checked_list`` fail the turn
at once with ``WrongResult``, which names the component, what it returned and what its stage
takes; the trace's ``error.raised_by`` names the component as for one that raised. A guardrail
that returns something else fails closed: the message is not answered.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class WrongResult(TypeError):
    """``component``'s ``method`` returned ``value``, which its stage cannot use."""

    def __init__(self, component: Any, method: str, value: Any, expected: str, *, item: bool = False):
        self.component = component
        got = f"a list holding {type(value).__name__}" if item else type(value).__name__
        super().__init__(f"{component.kind} {component.name!r}: {method}() returned {got}, not {expected} "
                         f"(docs/plugins.md, the table of hooks)")


def checked(component: Any, method: str, value: Any, types: tuple[type, ...], expected: str) -> Any:
    """``value`` when it is one of ``types``; ``WrongResult`` otherwise."""
    if not isinstance(value, types):
        raise WrongResult(component, method, value, expected)
    return value


def checked_list(component: Any, method: str, values: Any, item_type: type, expected: str) -> list:
    """``values`` as a list when it is an iterable of ``item_type`` (not a string or a mapping,
    whose iteration is no list of results); ``WrongResult`` otherwise."""
    if isinstance(values, (str, bytes, dict)) or not isinstance(values, Iterable):
        raise WrongResult(component, method, values, expected)
    items = list(values)
    for item in items:
        if not isinstance(item, item_type):
            raise WrongResult(component, method, item, expected, item=True)
    return items
