"""Reading a chat completion request: the body's fields, and its messages as one turn.

The last message is the turn: it must be the user's. The messages before it are the history a
stateless client keeps (``HistoryMessage``s, not saved: memory reads them instead of the log).
A request that names a stored conversation (``conversation`` in the body, or the
``X-Ragchat-Conversation`` header) continues it instead: its log is the history, and the earlier
messages of the request are not read.

An ``Idempotency-Key`` header makes a request safe to send again (a client's retry after a
timeout or a dropped connection): the key is stored as the user message's ``client_id``, as the
websocket and server-sent events clients send it, so a resend with the same key is answered with
the first attempt's answer (or 409 ``turn_in_progress`` while it is still being written), and no
second turn runs or counts against the limits. Keys are the caller's own: another user's equal
key is another message.

System (and ``developer``) messages are the request's own instructions; the site's are the
profile's system prompt. ``OPENAI_API_SYSTEM_MESSAGES`` says what happens to them: ``"ignore"``
(left out, counted in the trace) or ``"refuse"`` (400 ``system_message_not_allowed``).

OpenAI's sampling parameters (``SAMPLING``, ``stop``, ``user``) are checked as OpenAI checks
them (400 ``invalid_type`` or ``invalid_value`` naming the parameter: a client's mistake is
reported, not silently ignored), then left to the profile, as OpenAI-compatible servers do, so
clients that send them work unchanged. Other keys are not read (OpenAI's other parameters, and
unknown ones). What would change the answer's shape in ways this endpoint cannot honour is
refused with a 400 naming the parameter: ``n`` other than 1, client ``tools``, tool and
function messages, content other than text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import RequestDataTooBig

from django_ragchat.conf import ragchat_settings
from django_ragchat.openai_api.errors import OpenAIError, bad_request
from django_ragchat.tokens import count_tokens
from django_ragchat.transport import jsonbody
from django_ragchat.transport.turns import TurnRefused, check_client_id
from django_ragchat.types import HistoryMessage

#: OpenAI's limit on messages per request.
MAX_MESSAGES = 2048
CONVERSATION_HEADER = "X-Ragchat-Conversation"
IDEMPOTENCY_HEADER = "Idempotency-Key"
SYSTEM_ROLES = ("system", "developer")
TOOL_ROLES = ("tool", "function")
#: OpenAI's numeric sampling parameters: name -> (an ``"integer"`` or any ``"number"``, lowest,
#: highest; ``None``: no bound). Checked, then left to the profile; ``null`` is no value.
SAMPLING: dict[str, tuple[str, float | None, float | None]] = {
    "temperature": ("number", 0, 2),
    "top_p": ("number", 0, 1),
    "presence_penalty": ("number", -2, 2),
    "frequency_penalty": ("number", -2, 2),
    "max_tokens": ("integer", 1, None),
    "max_completion_tokens": ("integer", 1, None),
    "seed": ("integer", None, None),
}
TOOLS_UNSUPPORTED = ("This assistant's tools run on the server; a request cannot bring its own "
                     "(send no '{param}').")


@dataclass
class ChatRequest:
    """A chat completion request as the endpoint uses it."""

    model: str
    #: The last message's text (validated by the turn like any message).
    question: Any
    history: list[HistoryMessage] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    conversation_id: str | None = None
    #: System and developer messages left out (``OPENAI_API_SYSTEM_MESSAGES = "ignore"``).
    ignored_system_messages: int = 0
    #: The ``Idempotency-Key`` header ("" for none): the user message's ``client_id``.
    idempotency_key: str = ""
    #: Where the question is in the body (``messages.[2].content``): the ``param`` of its refusal.
    question_param: str = "messages"


def read_body(request) -> dict[str, Any]:
    """The JSON object of the body, or 400 (413 when larger than Django accepts)."""
    try:
        body = request.body
    except RequestDataTooBig:
        jsonbody.drain_refused_body(request)
        raise OpenAIError(413, "too_large", "The request body is too large.") from None
    try:
        jsonbody.check_media_type(request.content_type)
    except jsonbody.UnsupportedMediaType as exc:
        raise OpenAIError(415, exc.code, str(exc)) from None
    try:
        data = jsonbody.loads(jsonbody.body_text(body, jsonbody.declared_charset(request)))
    except jsonbody.JSONRefused as exc:
        # The refusal's own code: ``too_many_fields`` is that code on every transport.
        raise OpenAIError(400, exc.code, f"We could not parse the JSON body of your request: {exc}") from None
    if not isinstance(data, dict):
        raise OpenAIError(400, "invalid_type", "The request body must be a JSON object.")
    return data


def parse(data: dict[str, Any], headers) -> ChatRequest:
    """The request ``data`` (the body) and ``headers`` ask for; ``OpenAIError`` 400 if they
    cannot be answered."""
    model = data.get("model")
    if model is None:
        raise bad_request("You must provide a model parameter.", param="model", code="missing_required_parameter")
    if not isinstance(model, str):
        raise bad_request("'model' must be a string.", param="model", code="invalid_type")
    stream, include_usage = _stream_options(data)
    check_sampling(data)
    _refuse_unsupported(data)
    conversation_id = _conversation_id(data, headers)
    idempotency_key = _idempotency_key(headers)
    question, history, ignored, question_param = read_messages(data.get("messages"),
                                                               keep_history=conversation_id is None)
    return ChatRequest(model=model, question=question, history=history, stream=stream, include_usage=include_usage,
                       conversation_id=conversation_id, ignored_system_messages=ignored,
                       idempotency_key=idempotency_key, question_param=question_param)


def _idempotency_key(headers) -> str:
    """The ``Idempotency-Key`` header, checked as a ``client_id`` is (400 ``invalid_client_id``:
    the same code as the other transports give a bad one)."""
    key = (headers.get(IDEMPOTENCY_HEADER) or "").strip()
    try:
        return check_client_id(key)
    except TurnRefused as refusal:
        raise bad_request(f"The {IDEMPOTENCY_HEADER} header must be at most 100 characters.",
                          param=IDEMPOTENCY_HEADER, code=refusal.code) from None


def _stream_options(data: dict[str, Any]) -> tuple[bool, bool]:
    stream = data.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise bad_request("'stream' must be true or false.", param="stream", code="invalid_type")
    options = data.get("stream_options")
    if options is None:
        return bool(stream), False
    if not stream:
        raise bad_request("The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                          param="stream_options")
    if not isinstance(options, dict):
        raise bad_request("'stream_options' must be an object.", param="stream_options", code="invalid_type")
    include_usage = options.get("include_usage")
    if include_usage is not None and not isinstance(include_usage, bool):
        raise bad_request("'stream_options.include_usage' must be true or false.",
                          param="stream_options.include_usage", code="invalid_type")
    return True, bool(include_usage)


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bounds(low: float | None, high: float | None) -> str:
    if low is not None and high is not None:
        return f"between {low} and {high}"
    return f"at least {low}" if low is not None else f"at most {high}"


def check_sampling(data: dict[str, Any]) -> None:
    """400 for a sampling parameter OpenAI would refuse: ``invalid_type`` (``"temperature":
    "hot"``), ``invalid_value`` (out of its range); ``param`` names it."""
    for name, (kind, low, high) in SAMPLING.items():
        value = data.get(name)
        if value is None:
            continue
        if not (_is_integer(value) or (kind == "number" and isinstance(value, float))):
            article = "a number" if kind == "number" else "an integer"
            raise bad_request(f"'{name}' must be {article}, not {type(value).__name__}.", param=name,
                              code="invalid_type")
        if value != value or (low is not None and value < low) or (high is not None and value > high):
            raise bad_request(f"'{name}' must be {_bounds(low, high)}, not {value!r}.", param=name)
    stop = data.get("stop")
    if stop is not None and not isinstance(stop, str) and not (
            isinstance(stop, list) and all(isinstance(item, str) for item in stop)):
        raise bad_request("'stop' must be a string or an array of strings.", param="stop", code="invalid_type")
    if data.get("user") is not None and not isinstance(data["user"], str):
        raise bad_request("'user' must be a string.", param="user", code="invalid_type")


def _refuse_unsupported(data: dict[str, Any]) -> None:
    n = data.get("n")
    if n is not None and not _is_integer(n):
        raise bad_request("'n' must be an integer (and 1: one answer per request).", param="n", code="invalid_type")
    if n is not None and n != 1:
        raise bad_request("Only one answer per request: 'n' must be 1.", param="n")
    for name in ("tools", "functions"):
        if data.get(name):  # absent, null and [] are fine
            raise bad_request(TOOLS_UNSUPPORTED.format(param=name), param=name, code="unsupported_parameter")


def _conversation_id(data: dict[str, Any], headers) -> str | None:
    """The stored conversation the request continues: the body's ``conversation`` (an id, or
    an object with one, as OpenAI's Responses API writes it), else the header."""
    value = data.get("conversation")
    if isinstance(value, dict):
        if "id" not in value:  # {"uuid": ...} named one the caller meant: not a new conversation
            raise bad_request("'conversation' must be a conversation id, or an object with its 'id'.",
                              param="conversation", code="invalid_value")
        value = value["id"]
    if value is None:
        header = (headers.get(CONVERSATION_HEADER) or "").strip()
        return header or None
    if not isinstance(value, str):
        raise bad_request("'conversation' must be a conversation id (a string).", param="conversation",
                          code="invalid_type")
    return value


def read_messages(messages: Any, *, keep_history: bool = True) -> tuple[Any, list[HistoryMessage], int, str]:
    """(the last message's text, the messages before it as history, how many system messages
    were ignored, where the last message's text is: ``messages.[2].content``). Without
    ``keep_history`` the earlier messages are checked but not kept."""
    if messages is None:
        raise bad_request("You must provide a messages parameter.", param="messages",
                          code="missing_required_parameter")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty array of messages.", param="messages",
                          code="invalid_type")
    if len(messages) > MAX_MESSAGES:
        raise bad_request(f"'messages' has {len(messages):,} items; at most {MAX_MESSAGES:,} are allowed.",
                          param="messages")
    kept: list[tuple[int, str, Any]] = []
    ignored = 0
    for index, message in enumerate(messages):
        role, text = _message(index, message)
        if role in SYSTEM_ROLES:
            if ragchat_settings.OPENAI_API_SYSTEM_MESSAGES == "refuse":
                raise bad_request("This assistant's instructions are the site's: the request may not carry "
                                  f"{role} messages.", param=f"messages.[{index}].role",
                                  code="system_message_not_allowed")
            ignored += 1
            continue
        kept.append((index, role, text))
    if not kept or kept[-1][1] != "user":
        raise bad_request("The last message (besides system messages) must be the user's: it is the question "
                          "answered.", param="messages", code="last_message_not_user")
    history = [_history_message(role, text, f"messages.[{index}].content")
               for index, role, text in kept[:-1]] if keep_history else []
    index, _role, question = kept[-1]
    return question, history, ignored, f"messages.[{index}].content"


def _message(index: int, message: Any) -> tuple[str, Any]:
    """(role, text) of one message; 400 for what it cannot be."""
    param = f"messages.[{index}]"
    if not isinstance(message, dict):
        raise bad_request(f"{param} must be an object with a role and content.", param=param, code="invalid_type")
    role = message.get("role")
    if role in TOOL_ROLES:
        raise bad_request(f"{param}: {role} messages are not accepted: this assistant's tools run on the server.",
                          param=f"{param}.role", code="unsupported_role")
    if role not in ("user", "assistant", *SYSTEM_ROLES):
        raise bad_request(f"{param}.role must be one of 'user', 'assistant', 'system', 'developer'.",
                          param=f"{param}.role")
    if role == "assistant" and (message.get("tool_calls") or message.get("function_call")):
        raise bad_request(f"{param}: tool calls are not accepted: this assistant's tools run on the server.",
                          param=f"{param}.tool_calls", code="unsupported_role")
    return role, _text(message.get("content"), role, f"{param}.content")


def _text(content: Any, role: str, param: str) -> Any:
    """A message's text: a string, or text content parts joined by newlines. Anything else is
    returned as it is for the last message (the turn refuses it with its usual code)."""
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in ("text", "input_text"):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise bad_request(f"{param}: only text content is accepted, not {kind!r}.", param=param,
                                  code="unsupported_content")
            if not isinstance(part.get("text"), str):
                raise bad_request(f"{param}: a text part needs a 'text' string.", param=param, code="invalid_type")
            texts.append(part["text"])
        return "\n".join(texts)
    if content is None and role == "assistant":
        return ""
    return content


def _history_message(role: str, text: Any, param: str) -> HistoryMessage:
    if not isinstance(text, str):
        raise bad_request(f"{param} must be text.", param=param, code="invalid_type")
    if "\x00" in text:
        raise bad_request(f"{param} contains NUL characters.", param=param, code="invalid_characters")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request(f"{param} contains invalid Unicode (lone surrogates).", param=param,
                          code="invalid_characters") from None
    return HistoryMessage(role=role, content=text, token_count=count_tokens(text))
