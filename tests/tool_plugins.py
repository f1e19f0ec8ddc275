"""Tools and tool advisors for tests/test_tools*.py, loaded by the tests that list them in
``RAGCHAT["PLUGINS"]`` (with ``example_project.orders.ragchat``, the example's real tools)."""

from __future__ import annotations

import asyncio
import time
from typing import Literal

from django_ragchat import hookimpl
from django_ragchat.tools import ToolError, tool
from django_ragchat.turn.advisors import Advisor
from django_ragchat.types import ToolResult

#: Each call of ``weather``/``slow``/``slow_sync`` notes when it started and ended (``slow``: and
#: whether it was cancelled).
CALLS: list[dict] = []


@tool(label="Checking the weather in {city}…")
async def weather(turn, city: str, unit: Literal["C", "F"] = "C") -> dict:
    """Today's weather in a city.

    Args:
        city: The city's name.
        unit: Celsius or Fahrenheit.
    """
    entry = {"started": time.monotonic()}
    CALLS.append(entry)
    await asyncio.sleep(0.3)
    entry["ended"] = time.monotonic()
    return {"city": city, "temperature": 21 if unit == "C" else 70, "unit": unit, "asked_by": turn.user.get_username()}


@tool
async def slow(turn, seconds: float) -> str:
    """Waits, then says so."""
    entry = {"started": time.monotonic(), "cancelled": False}
    CALLS.append(entry)
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        entry["cancelled"] = True
        raise
    entry["ended"] = time.monotonic()
    return f"waited {seconds} s"


@tool
def slow_sync(turn, seconds: float) -> str:
    """Waits in its thread, then says so."""
    entry = {"started": time.monotonic()}
    CALLS.append(entry)
    time.sleep(seconds)
    entry["ended"] = time.monotonic()
    return f"waited {seconds} s"


@tool
def explode(turn) -> str:
    """Always fails."""
    raise RuntimeError("secret database password in a traceback")


@tool
def refuse(turn, reason: str) -> str:
    """Always declines, saying why."""
    raise ToolError(f"Cannot do that: {reason}")


@tool
def unserialisable(turn) -> object:
    """Returns something JSON cannot carry."""
    return object()


@tool(permission="auth.view_user")
def staff_directory(turn) -> list:
    """The staff members' names (for users with the auth.view_user permission)."""
    return ["Ada", "Grace"]


@tool(permission=lambda turn: turn.user.is_staff)
def audit_log(turn) -> list:
    """Recent audit entries (staff only)."""
    return ["nothing happened"]


@tool(requires_confirmation=True, label="Sending an e-mail to {to}…")
def send_email(turn, to: str, body: str) -> dict:
    """Send an e-mail for the user (asks them first)."""
    SENT.append({"to": to, "body": body, "by": turn.user.get_username()})
    return {"sent": True}


SENT: list[dict] = []


@hookimpl
def register_tools(register):
    for found in (weather, slow, slow_sync, explode, refuse, unserialisable, staff_directory, audit_log, send_email):
        register(found)


class CachedWeather(Advisor):
    """Answers the weather of "Atlantis" itself (a short-circuit) and spells every city in
    capitals before the tool sees it (a changed call)."""

    name = "cached_weather"
    enabled_by_default = False

    async def around_tool(self, call, turn, call_next):
        if call.name != "weather":
            return await call_next(call)
        arguments = call.parsed_arguments or {}
        if arguments.get("city") == "Atlantis":
            return {"city": "Atlantis", "temperature": 4, "unit": "C", "source": "cache"}
        result = await call_next(call.with_arguments({**arguments, "city": str(arguments.get("city", "")).upper()}))
        return ToolResult(call_id=result.call_id, name=result.name, content=result.content + " (checked)",
                          status=result.status, error=result.error)


class SignedMail(Advisor):
    """Signs every e-mail before the user is asked to approve it."""

    name = "signed_mail"
    enabled_by_default = False

    def around_tool(self, call, turn, call_next):
        if call.name == "send_email":
            arguments = call.parsed_arguments or {}
            call = call.with_arguments({**arguments, "body": f"{arguments.get('body', '')}\n-- sent by the assistant"})
        return call_next(call)


class Advisors:
    @hookimpl
    def register_advisors(self, register):
        register(CachedWeather)
        register(SignedMail)


advisors = Advisors()
