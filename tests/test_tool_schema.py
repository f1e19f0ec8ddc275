"""Declaring tools: the JSON schema from a function's signature and docstring, validating and
converting the model's arguments, the registry and its system checks; the wire format (tool
calls whole and assembled from stream fragments) against the loopback server."""

from __future__ import annotations

import datetime
import enum
import json
import uuid
from decimal import Decimal
from typing import Annotated, Literal

import openai
import pytest
from asgiref.sync import async_to_sync
from django.core.checks import run_checks
from pydantic import BaseModel, Field
from rest_framework import serializers

from django_ragchat import plugins
from django_ragchat.backends.openai import ChatModel, OpenAIConnection, ToolCallAssembler
from django_ragchat.testing.openai_server import call, tool_calls
from django_ragchat.tools import (
    Tool,
    ToolArgumentsError,
    ToolDefinitionError,
    ToolRegistry,
    parse_docstring,
    tool,
)


class Size(enum.Enum):
    SMALL = "s"
    LARGE = "l"


class Address(BaseModel):
    street: str
    city: str = Field(description="The city's name.")


class Parcel(BaseModel):
    weight_kg: float
    to: Address


class ReturnForm(serializers.Serializer):
    order_number = serializers.CharField(max_length=12, help_text="As on the receipt.")
    quantity = serializers.IntegerField(min_value=1, max_value=5)
    reason = serializers.ChoiceField(choices=["broken", "wrong_size", "other"])
    note = serializers.CharField(required=False, allow_blank=True)
    created = serializers.DateTimeField(read_only=True)


def properties(found: Tool) -> dict:
    return found.schema["properties"]


# --- docstrings ----------------------------------------------------------------------------------


@pytest.mark.parametrize("doc", [
    """Find products.

    Args:
        query: What to look for,
            in a few words.
        limit (int): How many at most.

    Returns:
        The products.
    """,
    """Find products.

    :param query: What to look for,
        in a few words.
    :param int limit: How many at most.
    :returns: The products.
    """,
    """Find products.

    Parameters
    ----------
    query : str
        What to look for,
        in a few words.
    limit : int
        How many at most.
    """,
], ids=["google", "sphinx", "numpy"])
def test_descriptions_come_from_google_sphinx_and_numpy_docstrings(doc):
    description, params = parse_docstring(doc)
    assert description == "Find products."
    assert params == {"query": "What to look for, in a few words.", "limit": "How many at most."}


# --- types -----------------------------------------------------------------------------------------


def test_the_schema_follows_the_signature():
    @tool
    def everything(turn, text: str, count: int, ratio: float, flag: bool, mode: Literal["a", "b"], size: Size,
                   tags: list[str], scores: dict[str, float], when: datetime.date, at: datetime.datetime,
                   price: Decimal, ref: uuid.UUID, maybe: int | None = None, noted: Annotated[str, "A note."] = "x",
                   unique: set[int] = frozenset(), either: int | str = 1):
        """Everything at once."""

    props = properties(everything)
    assert props["text"] == {"type": "string"} and props["count"] == {"type": "integer"}
    assert props["ratio"] == {"type": "number"} and props["flag"] == {"type": "boolean"}
    assert props["mode"] == {"type": "string", "enum": ["a", "b"]}
    assert props["size"] == {"type": "string", "enum": ["s", "l"], "title": "Size"}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}}
    assert props["scores"] == {"type": "object", "additionalProperties": {"type": "number"}}
    assert props["when"] == {"type": "string", "format": "date"}
    assert props["at"] == {"type": "string", "format": "date-time"}
    assert props["price"] == {"type": "number"} and props["ref"] == {"type": "string", "format": "uuid"}
    assert props["maybe"] == {"type": ["integer", "null"], "default": None}
    assert props["noted"] == {"type": "string", "description": "A note.", "default": "x"}
    assert props["unique"] == {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    assert props["either"] == {"anyOf": [{"type": "integer"}, {"type": "string"}], "default": 1}
    assert everything.schema["required"] == ["text", "count", "ratio", "flag", "mode", "size", "tags", "scores",
                                             "when", "at", "price", "ref"]
    assert everything.schema["additionalProperties"] is False
    assert everything.spec() == {"type": "function", "function": {
        "name": "everything", "description": "Everything at once.", "parameters": everything.schema}}

    bound = everything.bind(json.dumps({
        "text": "t", "count": 2, "ratio": 1, "flag": True, "mode": "b", "size": "l", "tags": ["x"],
        "scores": {"a": 1}, "when": "2025-03-01", "at": "2025-03-01T10:00:00+00:00", "price": 9.99,
        "ref": "12345678-1234-5678-1234-567812345678", "maybe": None, "unique": [1, 2, 2 + 1]}))
    assert bound["size"] is Size.LARGE and bound["ratio"] == 1.0 and isinstance(bound["ratio"], float)
    assert bound["when"] == datetime.date(2025, 3, 1) and bound["at"].tzinfo is not None
    assert bound["price"] == Decimal("9.99") and isinstance(bound["ref"], uuid.UUID)
    assert bound["maybe"] is None and bound["unique"] == {1, 2, 3} and "noted" not in bound  # default applies
    # 12.0 is an integer to JSON Schema: the function gets the int its annotation names.
    bound = everything.bind({
        "text": "t", "count": 12.0, "ratio": 1, "flag": True, "mode": "b", "size": "l", "tags": [], "scores": {},
        "when": "2025-03-01", "at": "2025-03-01T10:00:00+00:00", "price": 9.99,
        "ref": "12345678-1234-5678-1234-567812345678", "maybe": 3.0, "unique": [1.0]})
    assert [(bound[k], type(bound[k])) for k in ("count", "maybe")] == [(12, int), (3, int)] and bound["unique"] == {1}
    assert all(type(v) is int for v in bound["unique"])


def test_a_pydantic_model_parameter_is_described_and_validated_by_pydantic():
    @tool
    def ship(turn, parcel: Parcel) -> str:
        """Ship a parcel.

        Args:
            parcel: What to send, and where.
        """

    schema = ship.schema
    parcel = schema["properties"]["parcel"]
    assert parcel["properties"]["to"] == {"$ref": "#/$defs/Address"} and parcel["description"] == "What to send, and where."
    assert schema["$defs"]["Address"]["properties"]["city"]["description"] == "The city's name."
    bound = ship.bind({"parcel": {"weight_kg": 1.5, "to": {"street": "Main St 1", "city": "Lyon"}}})
    assert isinstance(bound["parcel"], Parcel) and bound["parcel"].to.city == "Lyon"
    with pytest.raises(ToolArgumentsError, match="'city' is a required property"):
        ship.bind({"parcel": {"weight_kg": 1.5, "to": {"street": "Main St 1"}}})


def test_a_drf_serializer_parameter_is_described_and_validated_by_the_serializer():
    @tool
    def open_return(turn, form: ReturnForm) -> dict:
        """Open a return."""

    form = properties(open_return)["form"]
    assert form["properties"] == {
        "order_number": {"type": "string", "maxLength": 12, "description": "As on the receipt."},
        "quantity": {"type": "integer", "maximum": 5, "minimum": 1},
        "reason": {"enum": ["broken", "wrong_size", "other"]},
        "note": {"type": "string"},
    }
    assert form["required"] == ["order_number", "quantity", "reason"] and form["additionalProperties"] is False
    bound = open_return.bind({"form": {"order_number": "ORD-17", "quantity": 2, "reason": "broken"}})
    assert dict(bound["form"]) == {"order_number": "ORD-17", "quantity": 2, "reason": "broken"}
    with pytest.raises(ToolArgumentsError, match="quantity: 9 is greater than the maximum of 5"):
        open_return.bind({"form": {"order_number": "ORD-17", "quantity": 9, "reason": "broken"}})


@pytest.mark.parametrize(("arguments", "message"), [
    ({"city": 3}, "city: 3 is not of type 'string'"),
    ({"city": "Lyon", "days": "two"}, "days: 'two' is not of type 'integer'"),
    ({"city": "Lyon", "extra": 1}, "Additional properties are not allowed ('extra' was unexpected)"),
    ([1, 2], "The arguments must be a JSON object."),
    ("not json", "The arguments are not valid JSON; send a JSON object."),
    ('"a string"', "The arguments must be a JSON object."),
])
def test_arguments_that_do_not_fit_say_how(arguments, message):
    @tool
    def forecast(turn, city: str, days: Annotated[int, "How many days."] = 1) -> str:
        """The forecast."""

    with pytest.raises(ToolArgumentsError) as error:
        forecast.bind(arguments)
    assert error.value.message == message


@pytest.mark.parametrize(("function", "message"), [
    (lambda: None, "the first parameter must be the turn"),
    (lambda turn, x: None, "parameter 'x' needs a type annotation"),
], ids=["no-turn", "no-annotation"])
def test_functions_that_cannot_be_tools_are_refused_with_a_reason(function, message):
    function.__name__ = "broken"
    with pytest.raises(ToolDefinitionError, match=message):
        tool(function).spec()


def test_other_definitions_that_cannot_work_are_refused():
    def star(turn, *rest: str): ...

    def opaque(turn, thing: object.__class__): ...

    with pytest.raises(ToolDefinitionError, match=r"\*rest cannot be described"):
        tool(star).spec()
    with pytest.raises(ToolDefinitionError, match="cannot be described to the model as JSON"):
        tool(opaque).spec()
    with pytest.raises(ToolDefinitionError, match="must be 1 to 64 letters"):
        tool(name="no spaces allowed")(star)
    with pytest.raises(ToolDefinitionError, match="timeout must be a positive number"):
        tool(timeout=0)(star)


def test_a_label_is_filled_with_the_arguments_and_never_fails():
    @tool(label="Looking up order {order_number}…")
    def order_status(turn, order_number: str): ...

    @tool
    def plain_tool(turn): ...

    assert order_status.describe({"order_number": "ORD-17"}) == "Looking up order ORD-17…"
    assert order_status.describe({}) == "Looking up order …" and order_status.describe(None) == "Looking up order …"
    assert plain_tool.describe({}) == "Using plain tool…"
    assert tool(label="{0} {x.y}")(plain_tool.function).describe({"x": 1}) == "Using plain tool…"


def test_results_are_json_and_long_ones_are_cut():
    @tool(max_result_chars=30)
    def big(turn): ...

    assert big.result_text("plain text") == "plain text"
    assert big.result_text({"when": datetime.date(2025, 1, 2)}) == '{"when": "2025-01-02"}'
    assert big.result_text("x" * 50) == "x" * 30 + "… [cut at 30 characters]"
    assert big.result_text(Address(street="a", city="b")) == '{"street": "a", "city": "b"}'
    with pytest.raises(TypeError):
        big.result_text(object())


# --- the registry and the checks ------------------------------------------------------------------


def test_the_registry_reports_duplicates_and_tools_that_cannot_be_described():
    registry = ToolRegistry()

    def first(turn, a: str): ...

    def broken(turn, a: "Undefined"): ...  # noqa: F821 - the point

    registry.add(first, "plugin_a")
    registry.add(tool(first), "plugin_b")
    registry.add(broken, "plugin_b")
    registry.add(first, "plugin_b", name="second")
    assert registry.names() == ["first", "second"]
    assert registry.get("second").function is first
    assert registry.errors[0] == "Plugin 'plugin_b' registered a tool named 'first', which plugin 'plugin_a' " \
                                 "already registered."
    assert "parameter 'a': its annotation cannot be resolved" in registry.errors[1]
    assert "Undefined" in registry.errors[1]


def test_every_problem_of_a_tool_is_reported_at_once():
    """A plugin author's trial: a tool with three parameters the schema cannot describe was
    refused for the first, then (once fixed) for the second, one run at a time."""

    def broken(turn, when: "NoSuchType", *rest: str, note, fine: int = 1, blob: object.__class__ = None): ...  # noqa: F821

    with pytest.raises(ToolDefinitionError) as caught:
        tool(broken).spec()
    message = str(caught.value)
    for problem in ("parameter 'when': its annotation cannot be resolved", "*rest cannot be described",
                    "parameter 'note' needs a type annotation", "parameter 'blob': <class 'type'> cannot be described"):
        assert problem in message, message
    assert "'fine'" not in message

    # A function whose first parameter is not the turn: that, and its other parameters' problems.
    def no_turn(*, city: str, when): ...

    with pytest.raises(ToolDefinitionError) as caught:
        tool(no_turn).spec()
    assert "the first parameter must be the turn" in str(caught.value)
    assert "parameter 'when' needs a type annotation" in str(caught.value)
    with pytest.raises(ToolDefinitionError) as caught:
        tool(name="no spaces", timeout=-1)(no_turn)
    assert "1 to 64 letters" in str(caught.value) and "timeout must be a positive number" in str(caught.value)


def test_wrong_options_are_refused_with_the_parameters_problems_in_one_error():
    """A plugin author's trial: ``@tool(...)`` raised at import with its options' problems only;
    once they were fixed, the next run refused the parameters. Now one error says all that can
    be known as the module is imported (an annotation that does not resolve yet may name a class
    defined further down: the registry says it)."""

    def lookup(turn, day: type, count, when: DefinedBelow, fine: int = 1) -> str: ...  # noqa: F821

    with pytest.raises(ToolDefinitionError) as caught:
        tool(name="look up", timeout=0, max_result_chars="8000", permission=7)(lookup)
    message = str(caught.value)
    for problem in ("its name must be 1 to 64 letters", "timeout must be a positive number",
                    "max_result_chars must be a whole number, 1 or more, not '8000'",
                    "permission must be a permission name ('app_label.codename'), a list of them or a callable",
                    "parameter 'day': <class 'type'> cannot be described", "parameter 'count' needs a type annotation"):
        assert problem in message, message
    assert message.startswith("Tool 'look up': ") and "'when'" not in message and "'fine'" not in message
    # Registered under a wrong name, the registry's one error says all, the unresolved one too.
    registry = ToolRegistry()
    registry.add(lookup, "plugin_a", name="look up")
    [error] = registry.errors
    for problem in ("its name must be 1 to 64 letters", "parameter 'day'", "parameter 'count'",
                    "parameter 'when': its annotation cannot be resolved"):
        assert problem in error, error
    assert registry.names() == []

    # Renamed, a tool is checked under its new name, and keeps its own options.
    def unannotated(turn, day): ...

    def annotated(turn, day: str): ...

    registry.add(tool(timeout=5)(unannotated), "plugin_a", name="renamed")
    assert registry.errors[-1].endswith("Tool 'renamed': parameter 'day' needs a type annotation.")
    registry.add(tool(timeout=5)(annotated), "plugin_a", name="renamed")
    assert registry.names() == ["renamed"] and registry.get("renamed").timeout == 5
    assert registry.get("renamed").spec()["function"]["name"] == "renamed"


def test_the_check_says_every_problem_of_a_tool_refused_as_its_plugin_is_imported(ragchat_settings_override):
    ragchat_settings_override(PLUGINS=["tests.broken_tool_options"])
    [error] = [m.msg for m in run_checks() if m.id == "ragchat.E004"]
    for problem in ("Tool 'order lookup': its name must be", "timeout must be a positive number",
                    "parameter 'number' needs a type annotation", "parameter 'since': <class 'type'>"):
        assert problem in error, error


def test_the_check_reports_every_problem_of_every_tool_in_one_run(ragchat_settings_override):
    ragchat_settings_override(PLUGINS=["tests.broken_tools.several"])
    errors = [m.msg for m in run_checks() if m.id == "ragchat.E004"]
    assert len(errors) == 2 and any("Tool 'two_problems'" in e for e in errors), errors
    both = " ".join(errors)
    for problem in ("'day': <class 'type'>", "'count' needs a type annotation", "'city': its annotation cannot"):
        assert problem in both, both
    assert plugins.get_tools().names() == ["fine_tool"]


def test_the_system_checks_report_unknown_tools_and_tools_offered_to_the_extractive_answerer(
        ragchat_settings_override):
    ragchat_settings_override(PLUGINS=["tests.tool_plugins"], PROFILES={
        "default": {"tools": ["weather"]},
        "typo": {"llm": "openai", "tools": ["wether"], "options": {"openai": {"base_url": "http://127.0.0.1:9/v1"}}},
        "searching": {"retrieval": "tool"},
        "fine": {"llm": "openai", "tools": ["weather"], "retrieval": "tool",
                 "options": {"openai": {"base_url": "http://127.0.0.1:9/v1"}}},
    })
    messages = {(m.id, m.msg) for m in run_checks() if m.id.startswith("ragchat.")}
    assert ("ragchat.E002", "Profile 'typo': tools: no tool named 'wether' is registered (registered: audit_log, "
                            "explode, refuse, send_email, slow, slow_sync, staff_directory, unserialisable, weather). "
                            "Did you mean 'weather'? Is the plugin that provides it listed in RAGCHAT['PLUGINS'], or "
                            "installed with an entry point of the django_ragchat group?") in messages
    warned = sorted(msg.split(",")[0] for i, msg in messages if i == "ragchat.W041")
    assert warned == ["Profile 'default' offers tools (weather)", "Profile 'searching' offers tools (retrieval as a tool)"]
    assert not any("'fine'" in msg for _, msg in messages)


def test_a_plugin_that_fails_to_register_a_tool_is_reported(ragchat_settings_override):
    ragchat_settings_override(PLUGINS=["tests.broken_tools"])
    errors = [m.msg for m in run_checks() if m.id == "ragchat.E004"]
    assert any("registered a tool that cannot be used" in e and "NoSuchType" in e for e in errors), errors
    assert any("failed in register_tools: RuntimeError('no tools today')" in e for e in errors), errors
    assert plugins.get_tools().names() == ["fine_tool"]


@pytest.mark.parametrize("option", [{"retrieval": "sometimes"}, {"max_tool_steps": -1}, {"tool_timeout": 0},
                                    {"tool_confirmation_timeout": "soon"}, {"tools": "weather"}])
def test_bad_tool_options_of_a_profile_are_reported(ragchat_settings_override, option):
    ragchat_settings_override(PROFILES={"default": option})
    errors = [m.msg for m in run_checks() if m.id == "ragchat.E002"]
    assert len(errors) == 1 and next(iter(option)) in errors[0]


# --- the wire format --------------------------------------------------------------------------------


def test_streamed_fragments_are_assembled_by_index_and_by_id():
    assembler = ToolCallAssembler()
    for fragment in [
        {"index": 0, "id": "a", "type": "function", "function": {"name": "weather", "arguments": ""}},
        {"index": 1, "id": "b", "type": "function", "function": {"name": "weath", "arguments": '{"ci'}},
        {"index": 0, "function": {"arguments": '{"city": '}},
        {"index": 1, "function": {"name": "er", "arguments": 'ty": "Oslo"}'}},
        {"index": 0, "function": {"arguments": '"Lyon"}'}},
        "junk", {"index": 2, "function": {"arguments": "{}"}},  # no name: not a call
    ]:
        assembler.add(fragment)
    assert [(c.id, c.name, json.loads(c.arguments)) for c in assembler.result()] == [
        ("a", "weather", {"city": "Lyon"}), ("b", "weather", {"city": "Oslo"})]

    ollama = ToolCallAssembler()  # every call of a batch at index 0, told apart by id
    for fragment in [{"index": 0, "id": "x", "function": {"name": "one", "arguments": "{}"}},
                     {"index": 0, "id": "y", "function": {"name": "two", "arguments": '{"a": 1}'}}]:
        ollama.add(fragment)
    assert [(c.id, c.name) for c in ollama.result()] == [("x", "one"), ("y", "two")]

    bare = ToolCallAssembler()  # no index, no id
    for fragment in [{"function": {"name": "one", "arguments": '{"a"'}}, {"function": {"arguments": ": 1}"}}]:
        bare.add(fragment)
    assert [(c.id, c.name, c.arguments) for c in bare.result()] == [("call_0", "one", '{"a": 1}')]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_the_chat_model_reads_tool_calls_from_the_loopback_server(openai_server, stream):
    openai_server.script(tool_calls(call("weather", city="Lyon", id="a"), call("weather", {"city": "Oslo"}, id="b"),
                                    content="Checking."))
    chat = ChatModel(OpenAIConnection(base_url=openai_server.base_url, max_retries=0), model="gpt-4o-mini")
    spec = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    messages = [{"role": "user", "content": "Weather?"}]

    async def ask():
        if not stream:
            return await chat.complete(messages, tools=spec)
        pieces = [piece async for piece in chat.stream(messages, tools=spec)]
        return "".join(p.text for p in pieces), pieces[-1]

    answer = async_to_sync(ask)()
    text, calls, finish = ((answer.text, answer.tool_calls, answer.finish_reason) if not stream
                           else (answer[0], answer[1].tool_calls, answer[1].finish_reason))
    assert text == "Checking." and finish == "tool_calls"
    assert [(c.id, c.name, json.loads(c.arguments)) for c in calls] == [("a", "weather", {"city": "Lyon"}),
                                                                        ("b", "weather", {"city": "Oslo"})]
    assert openai_server.last("/chat/completions").json["tools"] == spec
    if stream:  # the arguments really came in pieces
        assert len(openai_server.requests) == 1


def test_the_loopback_server_streams_calls_in_fragments_the_official_client_assembles(openai_server):
    openai_server.script(tool_calls(call("weather", city="Lyon and its suburbs")))
    client = openai.OpenAI(base_url=openai_server.base_url, api_key="test", max_retries=0)
    chunks = list(client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "?"}], stream=True,
        tools=[{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]))
    fragments = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert len(fragments) > 3 and fragments[0].function.name == "weather" and fragments[0].id
    assert json.loads("".join(f.function.arguments or "" for f in fragments)) == {"city": "Lyon and its suburbs"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize(("messages", "message"), [
    ([{"role": "tool", "tool_call_id": "x", "content": "1"}], "must be a response to a preceeding message"),
    ([{"role": "assistant", "content": None, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
      {"role": "user", "content": "?"}], "did not have response messages: a"),
])
def test_the_loopback_server_refuses_what_the_api_refuses(openai_server, messages, message):
    client = openai.OpenAI(base_url=openai_server.base_url, api_key="test", max_retries=0)
    with pytest.raises(openai.BadRequestError, match=message):
        client.chat.completions.create(model="gpt-4o-mini", messages=messages)


def test_the_loopback_server_gives_no_calls_when_tools_are_forbidden(openai_server):
    openai_server.script(tool_calls(call("weather", city="Lyon"), content="Text only."))
    client = openai.OpenAI(base_url=openai_server.base_url, api_key="test", max_retries=0)
    completion = client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "?"}], tool_choice="none",
        tools=[{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}])
    assert completion.choices[0].message.tool_calls is None and completion.choices[0].message.content == "Text only."
