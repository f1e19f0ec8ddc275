"""The endpoint's views: ``GET models``, ``GET models/<id>``, ``POST chat/completions``.

Every answer is JSON in OpenAI's shapes, errors included (``errors.OpenAIError``). The views are
async and serve ASGI and WSGI alike: the turn runs as the server-sent events view runs it
(``transport.sse.start_events``: a task of its own under ASGI, the process's background loop
under WSGI), through the same ``transport.turns.turn_events`` as every transport, so the same
limits, refusals, saving and tracing apply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.http import JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from django_ragchat.events import PROTOCOL_VERSION
from django_ragchat.openai_api import auth, completions, errors, naming, parsing
from django_ragchat.openai_api.auth import Caller, authenticate
from django_ragchat.openai_api.errors import OpenAIError
from django_ragchat.permissions import can_use_profile, usable_profiles
from django_ragchat.profiles import get_profile
from django_ragchat.transport import sse
from django_ragchat.transport import turns as transport
from django_ragchat.transport.turns import TurnRefused

OWNER = "django-ragchat"
CONVERSATION_HEADER = parsing.CONVERSATION_HEADER


def _model(name: str) -> dict[str, Any]:
    # Profiles are settings: they have no creation time.
    return {"id": name, "object": "model", "created": 0, "owned_by": OWNER}


def _not_allowed(request, allowed: str) -> JsonResponse:
    error = OpenAIError(405, "method_not_allowed", f"{request.method} is not allowed here; use {allowed}.")
    return error.response(headers={"Allow": allowed})


@csrf_exempt  # API keys need no token; session callers are checked by auth.authenticate
async def models(request):
    """``GET models``: the profiles the caller may use, as models (the default one first)."""
    if request.method != "GET":
        return _not_allowed(request, "GET")
    try:
        caller = await authenticate(request)
    except OpenAIError as error:
        return error.response()
    names = await sync_to_async(usable_profiles)(caller.user)
    return JsonResponse({"object": "list", "data": [_model(name) for name in names]})


@csrf_exempt
async def model(request, model_id: str):
    """``GET models/<id>``: one model the caller may use, or 404 ``model_not_found``."""
    if request.method != "GET":
        return _not_allowed(request, "GET")
    try:
        caller = await authenticate(request)
        if not await sync_to_async(can_use_profile)(caller.user, model_id):
            raise errors.model_not_found(model_id)
    except OpenAIError as error:
        return error.response()
    return JsonResponse(_model(model_id))


@csrf_exempt  # a POST to an unknown URL gets the 404, not the CSRF page
def unknown_url(request, path: str = ""):
    """Any other URL under the endpoint: OpenAI's JSON 404, not the site's HTML page."""
    return OpenAIError(404, "unknown_url", f"Unknown URL ({request.method} {request.path}).").response()


@csrf_exempt
async def chat_completions(request):
    """``POST chat/completions``: one turn, answered whole or streamed (``stream``)."""
    if request.method != "POST":
        return _not_allowed(request, "POST")
    conversation_id = None
    chat = None
    try:
        user = await auth.session_user(request)
        try:
            chat = parsing.parse(parsing.read_body(request), request.headers)
        except OpenAIError as invalid:
            chat = invalid  # answered after the credentials: a stranger learns nothing from a 400
        # Everything before the turn in one trip off the event loop (each trip is a thread hop).
        prepared = await sync_to_async(_prepare)(request, user, chat)
        conversation_id = str(prepared.conversation.pk) if prepared.conversation is not None else None
        if prepared.chat.stream:
            return await _streamed(request, prepared)
        return await _whole(request, prepared)
    except TurnRefused as refusal:
        asked = chat.question_param if isinstance(chat, parsing.ChatRequest) else "messages"
        param = asked if refusal.code in ("empty", "too_long", "invalid_characters", "invalid_type") else None
        error = OpenAIError.from_refusal(refusal, param)
    except OpenAIError as exc:
        error = exc
    return error.response(headers={CONVERSATION_HEADER: conversation_id} if conversation_id else None)


@dataclass
class _Prepared:
    """A request ready to run its turn."""

    caller: Caller
    chat: parsing.ChatRequest
    conversation: Any  # the stored conversation it continues, or None for a new one
    hold: bool  # the stream holds the answer back until the guardrails passed it


def _prepare(request, user, chat: parsing.ChatRequest | OpenAIError) -> _Prepared:
    """Who calls (401/403), the body (400), the model (404 ``model_not_found``), the message
    (400), the stored conversation the request continues (404 ``not_found`` for unknown and
    foreign ids alike; 400 ``model_mismatch`` when it uses another profile). Synchronous."""
    caller = auth.caller_of(request, user)
    if isinstance(chat, OpenAIError):
        raise chat
    if not can_use_profile(caller.user, chat.model):
        raise errors.model_not_found(chat.model)
    transport.validate(chat.question)  # before anything is looked up or saved
    conversation = None
    if chat.conversation_id is not None:
        try:
            conversation, _ = transport.open_conversation_sync(caller.user, chat.conversation_id, None, True,
                                                               chat.idempotency_key or "")
        except TurnRefused as refusal:
            raise OpenAIError.from_refusal(refusal, "conversation") from None
        if conversation.profile != chat.model:
            raise errors.bad_request(f"This conversation uses the model {conversation.profile!r}: send that model, "
                                     "or no conversation to start a new one.", param="model", code="model_mismatch")
    hold = chat.stream and completions.holds_answer(get_profile(chat.model))
    # The request's own database work is done, but Django would keep its connection until the
    # end of the response: release it, as the end of a request would. The turn has its own.
    transport.close_stale_connections()
    return _Prepared(caller, chat, conversation, hold)


def _origin(caller: Caller, chat: parsing.ChatRequest) -> dict[str, Any]:
    """What the trace keeps of where the turn came from."""
    origin: dict[str, Any] = {"transport": "openai", "model": chat.model}
    if caller.api_key is not None:
        origin["api_key"] = {"id": caller.api_key.pk, "name": caller.api_key.name, "prefix": caller.api_key.prefix}
    if chat.ignored_system_messages:
        origin["ignored_system_messages"] = chat.ignored_system_messages
    return origin


def _events(prepared: _Prepared):
    """The function that starts the turn's events (called where the turn runs)."""
    caller, chat, conversation = prepared.caller, prepared.chat, prepared.conversation
    # An OpenAI client cannot approve a tool call: one that needs approval fails at once
    # (``approval_unavailable``, which the model reads) instead of waiting for nobody.
    options = {"stream": chat.stream, "origin": _origin(caller, chat), "client_id": chat.idempotency_key,
               "can_approve": False}
    if conversation is not None:
        return lambda: transport.turn_events(conversation, chat.question, user=caller.user, session_key=None,
                                             **options)
    # A new conversation per stateless request, with the request's earlier messages as the
    # history memory reads (not saved); created only once the turn is admitted, untitled. It is
    # named once its answer is saved (naming): after the request's first question, which says
    # more than the last, the only one saved ("and how much is it?"), if the guardrails pass it.
    first = next((message.content for message in chat.history if message.role == "user"), None)
    new = {"profile": chat.model, "metadata": {"created_by": "openai_api"}}
    return lambda: naming.named_once_answered(
        sse.turn_stream(caller.user, None, None, chat.question, new_conversation=new, history=chat.history,
                        **options), first, caller.user)


async def _streamed(request, prepared: _Prepared) -> StreamingHttpResponse:
    chat = prepared.chat
    encoder = completions.ChunkEncoder(chat.model, include_usage=chat.include_usage, hold=prepared.hold)
    # Pieces already written when the client reads are sent as one chunk: the same text, and
    # less for a client that parses every chunk (the openai client) to fall behind on.
    first, body = await sse.start_events(request, _events(prepared), encoder, merge_deltas=True)
    response = StreamingHttpResponse(body, content_type="text/event-stream; charset=utf-8")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass each chunk on
    response[CONVERSATION_HEADER] = first.conversation_id
    response["X-Ragchat-Protocol"] = str(PROTOCOL_VERSION)
    return response


async def _whole(request, prepared: _Prepared) -> JsonResponse:
    first, body = await sse.start_events(request, _events(prepared))
    events = [first, *await sse.remaining_events(body)]
    try:
        completion = completions.whole_completion(prepared.chat.model, events)
    except OpenAIError as error:
        return error.response(headers={CONVERSATION_HEADER: first.conversation_id})
    return JsonResponse(completion, headers={CONVERSATION_HEADER: first.conversation_id})
