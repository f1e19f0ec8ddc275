"""Tools: functions of the site that the assistant may call, as the asking user.

A tool is a plain function (sync or ``async``) whose first parameter is the turn (the
``TurnContext`` every component receives: ``turn.user``, ``turn.conversation``,
``turn.profile``) and whose other parameters the model fills in::

    from django_ragchat import hookimpl
    from django_ragchat.tools import tool

    @tool(label="Looking up order {order_number}…")
    def order_status(turn, order_number: str) -> dict:
        \"\"\"The status of one of the signed-in customer's orders.

        Args:
            order_number: The number on the receipt, such as ORD-17.
        \"\"\"
        order = Order.objects.filter(owner=turn.user, number=order_number).first()
        ...

    @hookimpl
    def register_tools(register):
        register(order_status)

The JSON schema the model sees is built from the signature and the docstring: ``str``,
``int``, ``float``, ``bool``, ``Literal[...]`` and ``Enum`` classes, ``list[...]`` and
``dict[str, ...]``, ``X | None``, ``date``/``datetime``/``Decimal``/``UUID``, parameters with
defaults (optional), ``Annotated[X, "description"]``, a pydantic model or a DRF serializer
class. Each parameter's description comes from the docstring (Google ``Args:``, Sphinx
``:param x:`` or numpy ``Parameters`` sections); the rest of the docstring describes the tool.
The model's arguments are validated against the schema (``jsonschema``) and converted (enum
members, model instances, the serializer's ``validated_data``) before the function runs.

A profile offers tools by name (``"tools": ["order_status"]``). ``permission`` (a permission
name ``"app_label.codename"``, a list of them, or a callable ``(turn) -> bool``) decides who may
use a tool: a tool the user may not use is never offered and, called anyway, never runs.
``requires_confirmation`` shows the call to the user, who approves or rejects it before it runs.
The loop that runs the calls is ``django_ragchat.turn.tools``; docs/tools.md tells the whole story.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import decimal
import enum
import functools
import inspect
import json
import re
import string
import sys
import types
import typing
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.core.serializers.json import DjangoJSONEncoder
from django.db import close_old_connections
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from django_ragchat.components import PluginProblem

#: Characters of a result sent back to the model; longer results are cut (and say so).
DEFAULT_MAX_RESULT_CHARS = 8000
#: What a tool's name may be (OpenAI's rule for function names).
NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


class ToolError(Exception):
    """Raise it in a tool to tell the model why the tool could not do what was asked ("No order
    ORD-99 on your account"): its message is the result the model sees. Any other exception is
    logged and the model only hears that the tool failed."""


class ToolArgumentsError(ValueError):
    """The model's arguments do not fit the tool's schema; ``message`` says how, for the model."""

    def __init__(self, message: str):
        self.message = message
        super().__init__(message)


class ToolDefinitionError(ImproperlyConfigured):
    """A function that cannot be a tool (no turn parameter, an unsupported parameter type, a
    wrong ``@tool`` option): one error lists every problem of the tool, not only the first."""


# --- Reading docstrings -------------------------------------------------------------------------

_SECTION = re.compile(r"^(Args|Arguments|Parameters|Params|Keyword Args|Keyword Arguments|Returns?|Yields?|Raises|"
                      r"Examples?|Notes?|See Also)\s*:?\s*$")
_PARAMETER_SECTIONS = ("Args", "Arguments", "Parameters", "Params", "Keyword Args", "Keyword Arguments")
_SPHINX_PARAM = re.compile(r"^:param\s+(?:[^:]*\s)?(\w+):\s*(.*)$")
_GOOGLE_PARAM = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_NUMPY_PARAM = re.compile(r"^(\w+)\b")


@dataclasses.dataclass
class _DocReader:
    """The state of ``parse_docstring`` as it reads the lines."""

    description: list[str] = dataclasses.field(default_factory=list)
    params: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    section: str | None = None
    numpy: bool = False  # the section header was underlined (numpy style)
    item_indent: int | None = None
    current: str | None = None

    def header(self, name: str) -> None:
        self.section, self.numpy, self.item_indent, self.current = name, False, None, None

    def parameter_line(self, line: str) -> None:
        stripped = line.strip()
        if not stripped:
            return
        indent = len(line) - len(line.lstrip())
        if self.item_indent is None:
            self.item_indent = indent
        if indent <= self.item_indent:
            match = (_NUMPY_PARAM if self.numpy else _GOOGLE_PARAM).match(stripped)
            if match:
                self.current = match.group(1)
                self.params[self.current] = [] if self.numpy else [match.group(2)]
                return
        if self.current is not None:
            self.params[self.current].append(stripped)


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """(the description, {parameter: description}) of a Google, Sphinx or numpy docstring."""
    reader = _DocReader()
    for line in inspect.cleandoc(doc or "").splitlines():
        stripped = line.strip()
        header = _SECTION.match(stripped)
        sphinx = _SPHINX_PARAM.match(stripped)
        if header and not line.startswith(" "):
            reader.header(header.group(1))
        elif stripped and set(stripped) == {"-"} and reader.section is not None and reader.item_indent is None:
            reader.numpy = True  # the header's underline
        elif sphinx:
            reader.header(":param")
            reader.current = sphinx.group(1)
            reader.params[reader.current] = [sphinx.group(2)]
        elif stripped.startswith(":") and reader.section in (None, ":param"):
            reader.header(":field")  # :returns:, :raises:... end the parameter's text
        elif reader.section in _PARAMETER_SECTIONS:
            reader.parameter_line(line)
        elif reader.section is None:
            reader.description.append(line)
        elif reader.section == ":param" and reader.current and stripped:
            reader.params[reader.current].append(stripped)
    text = "\n".join(reader.description).strip()
    return text, {name: " ".join(p for p in parts if p).strip() for name, parts in reader.params.items()}


# --- Types to JSON schema ------------------------------------------------------------------------


@dataclasses.dataclass
class _Shape:
    """The JSON schema of one annotation and how to turn a valid JSON value into the Python one."""

    schema: dict[str, Any]
    convert: Callable[[Any], Any] | None = None
    defs: dict[str, Any] = dataclasses.field(default_factory=dict)


_SIMPLE: dict[Any, dict[str, Any]] = {
    str: {"type": "string"}, int: {"type": "integer"}, float: {"type": "number"}, bool: {"type": "boolean"},
    Any: {}, object: {},
}
_FORMATTED: dict[type, tuple[dict[str, Any], Callable[[Any], Any]]] = {
    datetime.datetime: ({"type": "string", "format": "date-time"}, datetime.datetime.fromisoformat),
    datetime.date: ({"type": "string", "format": "date"}, datetime.date.fromisoformat),
    datetime.time: ({"type": "string", "format": "time"}, datetime.time.fromisoformat),
    uuid.UUID: ({"type": "string", "format": "uuid"}, uuid.UUID),
    decimal.Decimal: ({"type": "number"}, lambda value: decimal.Decimal(str(value))),
}
_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _is_pydantic_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and hasattr(annotation, "model_json_schema") and hasattr(
        annotation, "model_validate")


def _is_serializer(annotation: Any) -> bool:
    drf = sys.modules.get("rest_framework.serializers")  # loaded if the annotation can be a serializer
    return drf is not None and isinstance(annotation, type) and issubclass(annotation, drf.BaseSerializer)


def shape_of(annotation: Any) -> _Shape:
    """The ``_Shape`` of a parameter's annotation; ``ToolDefinitionError`` when it has none."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        inner, *extras = typing.get_args(annotation)
        shape = shape_of(inner)
        notes = [extra for extra in extras if isinstance(extra, str)]
        if notes:
            shape.schema = {**shape.schema, "description": " ".join(notes)}
        return shape
    if annotation in _SIMPLE:
        # JSON Schema counts 12.0 an integer: the function gets 12, as its annotation says (an
        # outside probe's "plot 12.0"); 1 for a float parameter is 1.0.
        return _Shape(dict(_SIMPLE[annotation]), {float: float, int: int}.get(annotation))
    if annotation in _FORMATTED:
        schema, convert = _FORMATTED[annotation]
        return _Shape(dict(schema), convert)
    if origin is typing.Literal:
        return _literal(typing.get_args(annotation))
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        values = [member.value for member in annotation]
        return _Shape({**_literal(values).schema, "title": annotation.__name__}, annotation)
    if origin in (typing.Union, types.UnionType):
        return _optional(annotation)
    if origin in (list, tuple, set, frozenset) or annotation in (list, tuple, set, frozenset):
        return _array(annotation, origin or annotation)
    if origin is dict or annotation is dict:
        return _mapping(annotation)
    if _is_pydantic_model(annotation):
        return _pydantic(annotation)
    if _is_serializer(annotation):
        return _serializer(annotation)
    raise ToolDefinitionError(f"{annotation!r} cannot be described to the model as JSON; use str, int, float, "
                              f"bool, a Literal or Enum, a list or dict of those, a pydantic model or a DRF "
                              f"serializer.")


def _literal(values) -> _Shape:
    values = list(values)
    types_ = {_JSON_TYPES.get(type(value)) for value in values}
    schema: dict[str, Any] = {"enum": values}
    if len(types_) == 1 and None not in types_:
        schema = {"type": types_.pop(), "enum": values}
    return _Shape(schema)


def _optional(annotation: Any) -> _Shape:
    args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    nullable = len(args) < len(typing.get_args(annotation))
    if len(args) != 1:
        shapes = [shape_of(arg) for arg in args]
        schema = {"anyOf": [s.schema for s in shapes] + ([{"type": "null"}] if nullable else [])}
        return _Shape(schema, None, {k: v for s in shapes for k, v in s.defs.items()})
    inner = shape_of(args[0])
    if not nullable:
        return inner
    kind = inner.schema.get("type")
    if isinstance(kind, str) and "enum" not in inner.schema:
        schema = {**inner.schema, "type": [kind, "null"]}
    else:
        schema = {"anyOf": [inner.schema, {"type": "null"}]}
    convert = inner.convert
    return _Shape(schema, (lambda value: None if value is None else convert(value)) if convert else None, inner.defs)


def _array(annotation: Any, container: type) -> _Shape:
    args = typing.get_args(annotation)
    item = shape_of(args[0]) if args else _Shape({})
    schema: dict[str, Any] = {"type": "array", "items": item.schema}
    if container in (set, frozenset):
        schema["uniqueItems"] = True
    convert_item = item.convert

    def convert(values):
        items = [convert_item(v) for v in values] if convert_item else list(values)
        return items if container is list else container(items)

    return _Shape(schema, convert, item.defs)


def _mapping(annotation: Any) -> _Shape:
    args = typing.get_args(annotation)
    value = shape_of(args[1]) if len(args) == 2 else _Shape({})
    schema = {"type": "object", "additionalProperties": value.schema} if value.schema else {"type": "object"}
    convert_value = value.convert
    return _Shape(schema, (lambda mapping: {k: convert_value(v) for k, v in mapping.items()}) if convert_value
                  else None, value.defs)


def _pydantic(model: type) -> _Shape:
    schema = model.model_json_schema(ref_template="#/$defs/{model}")
    defs = schema.pop("$defs", {})

    def convert(value):
        try:
            return model.model_validate(value)
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            raise ToolArgumentsError(str(exc)) from None

    return _Shape(schema, convert, defs)


def _serializer(serializer_class: type) -> _Shape:
    serializer = serializer_class()
    properties, required = {}, []
    for name, field in serializer.fields.items():
        if field.read_only:
            continue
        properties[name] = drf_field_schema(field)
        if field.required:
            required.append(name)
    schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = required

    def convert(value):
        bound = serializer_class(data=value)
        if not bound.is_valid():
            raise ToolArgumentsError(json.dumps(bound.errors, ensure_ascii=False, default=str))
        return bound.validated_data

    return _Shape(schema, convert)


def drf_field_schema(field: Any) -> dict[str, Any]:
    """The JSON schema of a DRF serializer field (its own validation runs after the schema's)."""
    drf = sys.modules["rest_framework.serializers"]
    schema = _drf_base_schema(drf, field)
    automatic = (field.field_name or "").replace("_", " ").capitalize()  # what DRF makes of the name
    text = field.help_text or (field.label if field.label and field.label != automatic else None)
    if text:
        schema["description"] = str(text)
    if getattr(field, "allow_null", False) and isinstance(schema.get("type"), str):
        schema["type"] = [schema["type"], "null"]
    return schema


def _drf_base_schema(drf: Any, field: Any) -> dict[str, Any]:
    if isinstance(field, drf.BaseSerializer):
        child = getattr(field, "child", None)
        if child is not None:  # a ListSerializer (many=True)
            return {"type": "array", "items": _serializer(type(child)).schema}
        return _serializer(type(field)).schema
    if isinstance(field, drf.MultipleChoiceField):
        return {"type": "array", "items": {"enum": list(field.choices)}, "uniqueItems": True}
    if isinstance(field, drf.ChoiceField):
        return {"enum": list(field.choices)}
    if isinstance(field, drf.ListField):
        return {"type": "array", "items": drf_field_schema(field.child)}
    if isinstance(field, drf.DictField):
        return {"type": "object", "additionalProperties": drf_field_schema(field.child)}
    for cls, schema in ((drf.BooleanField, {"type": "boolean"}), (drf.IntegerField, {"type": "integer"}),
                        (drf.FloatField, {"type": "number"}), (drf.DecimalField, {"type": "number"}),
                        (drf.DateTimeField, {"type": "string", "format": "date-time"}),
                        (drf.DateField, {"type": "string", "format": "date"}),
                        (drf.EmailField, {"type": "string", "format": "email"}),
                        (drf.UUIDField, {"type": "string", "format": "uuid"}),
                        (drf.URLField, {"type": "string", "format": "uri"})):
        if isinstance(field, cls):
            return _bounded(dict(schema), field)
    if isinstance(field, drf.CharField):
        return _bounded({"type": "string"}, field)
    return {}


def _bounded(schema: dict[str, Any], field: Any) -> dict[str, Any]:
    limits = (("max_length", "maxLength"), ("min_length", "minLength"), ("max_value", "maximum"),
              ("min_value", "minimum"))
    for attribute, key in limits:
        value = getattr(field, attribute, None)
        if isinstance(value, (int, float, decimal.Decimal)) and not isinstance(value, bool):
            schema[key] = float(value) if isinstance(value, decimal.Decimal) else value
    return schema


# --- Tools ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Parameter:
    """One parameter the model fills in: its schema, whether it is required, its default."""

    name: str
    schema: dict[str, Any]
    required: bool
    default: Any
    convert: Callable[[Any], Any] | None
    positional_only: bool = False
    defs: dict[str, Any] = dataclasses.field(default_factory=dict)


def _type_hints(function: Callable[..., Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """(the resolved annotations of ``function``, why each that does not resolve does not): one
    name that imports nothing (a ``NameError``) leaves the others resolved."""
    try:
        return typing.get_type_hints(function, include_extras=True), {}
    except Exception:  # noqa: BLE001 - resolved one by one below, to say which
        pass
    hints, unresolved = {}, {}
    namespace = getattr(inspect.unwrap(function), "__globals__", {})
    for name, annotation in getattr(function, "__annotations__", {}).items():
        def holder(): ...
        holder.__annotations__ = {name: annotation}
        try:
            hints.update(typing.get_type_hints(holder, globalns=namespace, include_extras=True))
        except Exception as exc:  # noqa: BLE001 - NameError, or whatever evaluating it raised
            unresolved[name] = repr(exc)
    return hints, unresolved


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_permission(value: Any) -> bool:
    """Whether ``value`` is what ``@tool(permission=...)`` takes (``Tool.allowed`` reads it)."""
    if value is None or callable(value) or isinstance(value, str):
        return True
    return isinstance(value, (list, tuple, set, frozenset)) and all(isinstance(name, str) for name in value)


def _json_default(value: Any) -> tuple[bool, Any]:
    """(can the default go in the schema, its JSON value)."""
    if isinstance(value, enum.Enum):
        value = value.value
    try:
        return True, json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return False, None


class Tool:
    """A function the model may call; make one with ``@tool``. See the module's docstring.

    Attributes: ``name`` (the function's name unless given), ``description`` (the docstring's
    text unless given), ``permission``, ``requires_confirmation``, ``timeout`` (seconds; ``None``:
    the profile's ``tool_timeout``), ``label`` (what the user sees while it runs: a template
    filled with the arguments, ``"Looking up order {order_number}…"``), ``thread_sensitive``
    (run a sync function on the turn's database thread instead of a thread of its own),
    ``max_result_chars`` (results longer than this are cut before the model sees them).
    """

    def __init__(self, function: Callable[..., Any], *, name: str | None = None, description: str | None = None,
                 permission: str | Iterable[str] | Callable[[Any], bool] | None = None,
                 requires_confirmation: bool = False, timeout: float | None = None, label: str | None = None,
                 thread_sensitive: bool = False, max_result_chars: int = DEFAULT_MAX_RESULT_CHARS):
        if not callable(function):
            raise ToolDefinitionError(f"@tool needs a function, not {function!r}.")
        self.function = function
        self.name = name or function.__name__
        doc_text, self.parameter_docs = parse_docstring(function.__doc__)
        self.description = description if description is not None else doc_text
        self.permission = permission
        self.requires_confirmation = bool(requires_confirmation)
        self.timeout = timeout
        self.label = label
        self.thread_sensitive = thread_sensitive
        self.max_result_chars = max_result_chars
        self.is_async = inspect.iscoroutinefunction(function)
        functools.update_wrapper(self, function)
        problems = self._option_problems()
        if problems:  # with what its signature shows already: every problem in one error, not one per run
            raise ToolDefinitionError(self._refusal(problems + self._read_signature(now=True)[1]))

    def _option_problems(self) -> list[str]:
        """What is wrong with ``@tool``'s options (or the name it was registered under)."""
        problems = []
        if not (isinstance(self.name, str) and NAME_PATTERN.match(self.name)):
            problems.append("its name must be 1 to 64 letters, digits, '_' or '-'")
        if self.timeout is not None and not (_is_number(self.timeout) and self.timeout > 0):
            problems.append("timeout must be a positive number of seconds")
        if isinstance(self.max_result_chars, bool) or not isinstance(self.max_result_chars, int) \
                or self.max_result_chars < 1:
            problems.append(f"max_result_chars must be a whole number, 1 or more, not {self.max_result_chars!r}")
        if not _is_permission(self.permission):
            problems.append(f"permission must be a permission name ('app_label.codename'), a list of them or a "
                            f"callable (turn) -> bool, not {self.permission!r}")
        return problems

    def _refusal(self, problems: list[str]) -> str:
        return f"Tool {self.name!r}: {'; '.join(problems)}."

    def renamed(self, name: str) -> Tool:
        """This tool under another name (``register(tool, name=...)``); ``spec()`` checks it."""
        twin = copy.copy(self)
        twin.name = name
        for built in ("parameters", "schema", "validator"):  # cached under the old name
            twin.__dict__.pop(built, None)
        return twin

    def __repr__(self) -> str:
        return f"<Tool {self.name}>"

    def __call__(self, turn: Any, *args: Any, **kwargs: Any) -> Any:
        """Call the function directly (site code, tests): no schema, no permission check."""
        return self.function(turn, *args, **kwargs)

    # --- the schema ---

    @functools.cached_property
    def parameters(self) -> tuple[Parameter, ...]:
        """The parameters the model fills in (every one after the turn). ``ToolDefinitionError``
        lists every problem of the tool, its options' and every parameter's, not only the first."""
        found, problems = self._read_signature()
        problems = self._option_problems() + problems
        if problems:
            raise ToolDefinitionError(self._refusal(problems))
        return tuple(self._parameter(param, shape) for param, shape in found)

    def _read_signature(self, *, now: bool = False) -> tuple[list[tuple[inspect.Parameter, _Shape]], list[str]]:
        """Each parameter the model fills in with its ``_Shape``, and every problem of the
        signature. ``now`` (``@tool`` refusing its options, while the module is still being
        imported): an annotation that does not resolve, or cannot be read, is left for the
        registry, as it may name a class the module defines further down."""
        try:
            params = list(inspect.signature(self.function).parameters.values())
        except (TypeError, ValueError):  # a builtin or a C function with no signature to read
            return [], ["its signature cannot be read"]
        problems = []
        if not params or params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
            problems.append(f"the first parameter must be the turn: def {self.name}(turn, ...)")
            params = [None, *params]  # none is the turn: each of them is a parameter the model would fill in
        hints, unresolved = _type_hints(self.function)
        found = []
        for param in params[1:]:
            if now and param.name in unresolved:
                continue
            try:
                found.append((param, self._shape(param, hints, unresolved)))
            except ToolDefinitionError as exc:
                problems.append(str(exc))
            except Exception:  # noqa: BLE001 - a model or serializer not ready to read yet
                if not now:
                    raise
        return found, problems

    def _shape(self, param: inspect.Parameter, hints: dict[str, Any], unresolved: dict[str, str]) -> _Shape:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolDefinitionError(f"*{param.name} cannot be described to the model")
        if param.name in unresolved:
            raise ToolDefinitionError(f"parameter {param.name!r}: its annotation cannot be resolved: "
                                      f"{unresolved[param.name]}")
        if param.name not in hints:
            raise ToolDefinitionError(f"parameter {param.name!r} needs a type annotation")
        try:
            return shape_of(hints[param.name])
        except ToolDefinitionError as exc:
            raise ToolDefinitionError(f"parameter {param.name!r}: {str(exc).rstrip('.')}") from None

    def _parameter(self, param: inspect.Parameter, shape: _Shape) -> Parameter:
        schema = dict(shape.schema)
        if self.parameter_docs.get(param.name) and "description" not in schema:
            schema["description"] = self.parameter_docs[param.name]
        required = param.default is param.empty
        if not required:
            fits, value = _json_default(param.default)
            if fits:
                schema["default"] = value
        return Parameter(param.name, schema, required, None if required else param.default, shape.convert,
                         param.kind == param.POSITIONAL_ONLY, shape.defs)

    @functools.cached_property
    def schema(self) -> dict[str, Any]:
        """The JSON schema of the arguments (an object: one property per parameter)."""
        parameters = self.parameters
        schema: dict[str, Any] = {
            "type": "object",
            "properties": {p.name: p.schema for p in parameters},
            "required": [p.name for p in parameters if p.required],
            "additionalProperties": False,
        }
        defs = {k: v for p in parameters for k, v in p.defs.items()}
        if defs:
            schema["$defs"] = defs
        return schema

    @functools.cached_property
    def validator(self) -> Draft202012Validator:
        return Draft202012Validator(self.schema, format_checker=Draft202012Validator.FORMAT_CHECKER)

    def spec(self) -> dict[str, Any]:
        """The tool as an entry of the chat completions request's ``tools``."""
        function: dict[str, Any] = {"name": self.name, "parameters": self.schema}
        if self.description:
            function["description"] = self.description
        return {"type": "function", "function": function}

    # --- a call ---

    def bind(self, raw_arguments: str | dict[str, Any]) -> dict[str, Any]:
        """The model's arguments, validated against the schema and converted, as keyword
        arguments of the function. Raises ``ToolArgumentsError`` saying what is wrong."""
        arguments = raw_arguments
        if isinstance(raw_arguments, str):
            try:
                arguments = json.loads(raw_arguments or "{}")
            except ValueError:
                raise ToolArgumentsError("The arguments are not valid JSON; send a JSON object.") from None
        if not isinstance(arguments, dict):
            raise ToolArgumentsError("The arguments must be a JSON object.")
        error = best_match(self.validator.iter_errors(arguments))
        if error is not None:
            where = "/".join(str(part) for part in error.absolute_path)
            raise ToolArgumentsError(f"{where}: {error.message}" if where else error.message)
        bound = {}
        for parameter in self.parameters:
            if parameter.name not in arguments:
                continue  # the function's default applies
            value = arguments[parameter.name]
            try:
                bound[parameter.name] = parameter.convert(value) if parameter.convert else value
            except ToolArgumentsError:
                raise
            except (TypeError, ValueError) as exc:
                raise ToolArgumentsError(f"{parameter.name}: {exc}") from None
        return bound

    def allowed(self, turn: Any) -> bool:
        """May the turn's user use this tool? Synchronous (a permission check may query the
        database): the tool loop asks from a thread."""
        permission = self.permission
        if permission is None:
            return True
        user = turn.user
        if isinstance(permission, str):
            return bool(user.has_perm(permission))
        if callable(permission):
            return bool(permission(turn))
        return bool(user.has_perms(list(permission)))

    def describe(self, arguments: dict[str, Any] | None) -> str:
        """What the user sees while the call runs: the label filled with the arguments."""
        if self.label:
            try:
                return string.Formatter().vformat(self.label, (), _Defaulting(arguments or {}))
            except (ValueError, IndexError, AttributeError, KeyError):  # a label that does not fit the call
                pass
        return f"Using {self.name.replace('_', ' ')}…"

    async def run(self, turn: Any, arguments: dict[str, Any]) -> Any:
        """Call the function with validated, converted ``arguments``: awaited if it is
        ``async``; else in a thread (its own, or the turn's with ``thread_sensitive``)."""
        positional = [arguments.pop(p.name) for p in self.parameters if p.positional_only and p.name in arguments]
        if self.is_async:
            return await self.function(turn, *positional, **arguments)
        if self.thread_sensitive:
            return await sync_to_async(self.function)(turn, *positional, **arguments)
        return await sync_to_async(_with_fresh_connections, thread_sensitive=False)(
            self.function, turn, *positional, **arguments)

    def result_text(self, value: Any) -> str:
        """The return value as the model reads it: text as is, anything else as JSON, cut at
        ``max_result_chars``. Raises ``TypeError`` for a value JSON cannot carry."""
        if hasattr(value, "model_dump") and callable(value.model_dump):
            value = value.model_dump(mode="json")
        text = value if isinstance(value, str) else json.dumps(value, cls=DjangoJSONEncoder, ensure_ascii=False)
        if len(text) > self.max_result_chars:
            text = text[:self.max_result_chars] + f"… [cut at {self.max_result_chars} characters]"
        return text


class _Defaulting(dict):
    """The arguments for a label: a missing one shows as nothing rather than failing."""

    def __missing__(self, key: str) -> str:
        return ""


def _with_fresh_connections(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    # A tool's own thread keeps its database connection between calls: closed here when
    # CONN_MAX_AGE says so, as Django does at the end of a request (Channels'
    # database_sync_to_async does the same for consumers).
    close_old_connections()
    try:
        return function(*args, **kwargs)
    finally:
        close_old_connections()


def tool(function: Callable[..., Any] | None = None, **options: Any) -> Any:
    """Make ``function`` a ``Tool``: ``@tool`` or ``@tool(name=..., permission=...,
    requires_confirmation=..., timeout=..., label=..., thread_sensitive=..., max_result_chars=...)``."""
    if function is None:
        return lambda fn: Tool(fn, **options)
    return Tool(function, **options)


# --- The registry ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ToolRegistration:
    tool: Tool
    plugin: str


class ToolRegistry:
    """Every tool the plugins registered (``register_tools``), by name; ``errors`` lists what
    could not be registered (reported by the system check ragchat.E004)."""

    def __init__(self) -> None:
        self._tools: dict[str, ToolRegistration] = {}
        self.errors: list[str] = []

    def add(self, candidate: Any, plugin: str, *, name: str | None = None) -> None:
        try:
            found = candidate if isinstance(candidate, Tool) else Tool(candidate)
            if name is not None and name != found.name:
                found = found.renamed(name)
            found.spec()  # built now, every problem in one error: reported at startup, not mid-turn
        except ToolDefinitionError as exc:
            self.errors.append(PluginProblem(f"Plugin {plugin!r} registered a tool that cannot be used: {exc}", plugin))
            return
        existing = self._tools.get(found.name)
        if existing is not None:
            self.errors.append(PluginProblem(f"Plugin {plugin!r} registered a tool named {found.name!r}, which "
                                             f"plugin {existing.plugin!r} already registered.", plugin))
            return
        self._tools[found.name] = ToolRegistration(found, plugin)

    def get(self, name: str) -> Tool | None:
        registration = self._tools.get(name)
        return registration.tool if registration else None

    def names(self) -> list[str]:
        return sorted(self._tools)

    def all(self) -> list[ToolRegistration]:
        return [self._tools[name] for name in self.names()]
