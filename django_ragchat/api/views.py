"""The REST API (see docs/api.md for the endpoints, the error shapes and the permission matrix).

Views are synchronous DRF views, so the API works the same under WSGI and ASGI; posting a
message runs the whole turn through ``pipeline.run_turn_sync`` and answers when it is saved.
Clients that want the answer as it is written use the server-sent events endpoint or the
websocket, which share the pipeline and the event vocabulary.

Every error answers ``{"code": ..., "detail": ...}`` (validation errors add ``errors`` per
field); the ``code`` is short and stable, the ``detail`` safe to show.
"""

from __future__ import annotations

import logging
import math
import uuid
from pathlib import PurePath

from django.core.exceptions import ImproperlyConfigured, RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.db.models import BooleanField, Count, ExpressionWrapper, Prefetch, Q
from django.http import Http404
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import exceptions, generics, status
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.response import Response
from rest_framework.views import APIView
from rest_framework.views import exception_handler as drf_exception_handler

from django_ragchat import permissions as rules
from django_ragchat import tasks
from django_ragchat.api import permissions as access
from django_ragchat.api import serializers as s
from django_ragchat.api.schema import RagchatAutoSchema
from django_ragchat.conf import ragchat_settings
from django_ragchat.exceptions import ProfileUnavailable, RagchatError, TurnInProgress
from django_ragchat.ingestion.loaders import DocumentLoadError, content_type_for
from django_ragchat.ingestion.pipeline import CREATED, ingest_text
from django_ragchat.models import Conversation, Document, Feedback, Message, MessageSource, ToolInvocation
from django_ragchat.plugins import PIPELINE_ORDER, get_registry, plugin_listing, profile_listing, tool_listing
from django_ragchat.transport import csrf, jsonbody
from django_ragchat.transport import turns as transport
from django_ragchat.transport.jsonbody import UNREAD_MEDIA_TYPE, JSONBodyNegotiation, JSONRefused, LimitedJSONParser
from django_ragchat.turn import limits, persistence
from django_ragchat.turn.confirmations import DecisionRefused, decide_tool_call, parse_invocation_id
from django_ragchat.turn.pipeline import built_profile, run_turn_sync
from django_ragchat.turn.stops import request_stop

logger = logging.getLogger(__name__)


# --- Errors -----------------------------------------------------------------------------------


class APIError(RagchatError, exceptions.APIException):
    """An error with an explicit code, status and headers (e.g. ``Retry-After``); a
    ``RagchatError`` (stable ``code``, user-safe ``message``) like every error of the app."""

    def __init__(self, status_code: int, code: str, detail: str, headers: dict[str, str] | None = None):
        RagchatError.__init__(self, detail, code=code, http_status=status_code)
        exceptions.APIException.__init__(self, detail=detail, code=code)
        self.status_code = status_code
        self.headers = headers or {}


def retry_after_header(seconds: float | None) -> dict[str, str]:
    return {"Retry-After": str(max(1, math.ceil(seconds)))} if seconds else {}


def api_exception_handler(exc, context):
    """DRF's handler, answering every error as ``{"code", "detail"}``."""
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()  # one body for every 404, naming no model
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    elif isinstance(exc, exceptions.PermissionDenied) and str(exc.detail).startswith(access.CSRF_FAILED):
        # DRF's SessionAuthentication says only "CSRF Failed: <reason>", as a plain 403: the
        # streaming transports' code and words for the same cause.
        exc = APIError(403, csrf.CODE, csrf.message(str(exc.detail).removeprefix(access.CSRF_FAILED)))
    elif isinstance(exc, RequestDataTooBig):
        # Django refuses bodies over DATA_UPLOAD_MAX_MEMORY_SIZE before they are parsed.
        request = context.get("request")
        jsonbody.drain_refused_body(getattr(request, "_request", request))
        exc = APIError(413, "too_large", "The request body is too large.")
    elif isinstance(exc, (TooManyFieldsSent, TooManyFilesSent)):
        exc = APIError(400, "too_many_fields", "The request has too many fields or files.")
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        errors = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
        response.data = {"code": _validation_code(exc), "detail": _first_message(errors), "errors": errors}
    elif isinstance(exc, exceptions.APIException):
        detail = exc.detail
        response.data = {"code": getattr(detail, "code", None) or exc.default_code, "detail": str(detail)}
        for name, value in getattr(exc, "headers", {}).items():
            response[name] = value
    return response


#: Validation codes the other transports answer with for the same cause: a body whose only
#: problem is one of them is answered with it, not ``invalid`` (its ``errors`` still list it).
TRANSPORT_CODES = frozenset({"unknown_profile"})


def _validation_code(exc: exceptions.ValidationError) -> str:
    codes = set()
    pending = [exc.get_codes()]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
        else:
            codes.add(item)
    return codes.pop() if len(codes) == 1 and codes <= TRANSPORT_CODES else "invalid"


def _first_message(errors) -> str:
    while isinstance(errors, (dict, list)) and errors:
        errors = next(iter(errors.values())) if isinstance(errors, dict) else errors[0]
    return str(errors) if errors else "Invalid input."


ERRORS = {code: OpenApiResponse(s.ErrorSerializer, description=text) for code, text in {
    400: "Invalid input (`code` says what; validation errors list `errors` per field).",
    403: "Not signed in (anonymous use off), CSRF failure, or not allowed to change this.",
    404: "No such object, or not yours: the two are indistinguishable.",
    409: "An answer is still being written in this conversation.",
    413: "The message or the request body is too large.",
    410: "The conversation was deleted while its answer was being written (`conversation_deleted`).",
    429: "Rate limit or concurrent-answer limit reached; see the Retry-After header.",
}.items()}


PROFILE_UNAVAILABLE = OpenApiResponse(s.ErrorSerializer, description="`profile_unavailable`: the profile cannot be "
                                    "built (a component no plugin registers; logged); nothing is created.")


NOT_RATEABLE = OpenApiResponse(s.ErrorSerializer, description="`not_rateable`: only finished answers of the "
                                                            "assistant can be rated.")


#: The header of a refusal that waiting will cure (429, 409 ``turn_in_progress``) and of a turn
#: failed on the model's rate limit (503).
RETRY_AFTER = OpenApiParameter(
    "Retry-After", OpenApiTypes.INT, OpenApiParameter.HEADER, response=[409, 429, 503],
    description="Seconds to wait before sending again: for `rate_limited` until one more turn fits, for "
                "`too_many_streams` and `turn_in_progress` 1 (an answer frees its place when it ends).")


def errors(*codes: int) -> dict[int, OpenApiResponse]:
    return {code: ERRORS[code] for code in codes}


CONVERSATION_ID = OpenApiParameter("conversation_id", OpenApiTypes.UUID, OpenApiParameter.PATH)
MESSAGE_ID = OpenApiParameter("message_id", OpenApiTypes.INT, OpenApiParameter.PATH)


class RagchatAPIView(APIView):
    """Base of every view here: the chat permission, JSON bodies and ``{"code", "detail"}`` errors."""

    # drf-spectacular's inspector, set here rather than in the site's REST_FRAMEWORK settings:
    # the schema of these views then works whatever DEFAULT_SCHEMA_CLASS the site uses.
    schema = RagchatAutoSchema()
    permission_classes = [access.CanChat]
    parser_classes = [LimitedJSONParser]
    content_negotiation_class = JSONBodyNegotiation  # no Content-Type, or ...+json: JSON too
    #: Whether a POST, PUT or PATCH must carry a body (an action such as ``cancel`` needs none).
    body_required = True
    #: What a body that is no JSON object is told to look like (after "must be a JSON object").
    object_example = ""

    def get_exception_handler(self):
        return api_exception_handler

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        method = request.method.lower()
        served = method in self.http_method_names and hasattr(self, method)  # else 405, as before
        if method in ("post", "put", "patch") and served and self.body_required and not has_body(request):
            # No body is not an empty change: a client that lost its body must not create or
            # edit anything with the defaults (the same code as a body that is not JSON).
            raise APIError(400, JSONRefused.code, jsonbody.NO_BODY)
        if method in ("post", "put", "patch") and served:
            request.data  # noqa: B018 - read now: a body no parser reads is 415 (after the checks above)
            unread = getattr(request, UNREAD_MEDIA_TYPE, None)
            if unread is not None:
                raise exceptions.UnsupportedMediaType(unread)
            if not isinstance(request.data, dict):  # [], "text", null: every body here is an object
                raise APIError(400, "invalid_type", f"The body must be a JSON object{self.object_example}.")


def has_body(request) -> bool:
    """Whether the request carries a body (a length above 0, or a chunked one)."""
    length = request.META.get("CONTENT_LENGTH") or "0"
    return length.strip("0") != "" or "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", "").lower()


#: Sequence numbers and offsets are stored in 32-bit columns on every database.
MAX_INT = 2**31 - 1


def int_param(request, name: str, *, minimum: int = 0, maximum: int = MAX_INT) -> int | None:
    """The query parameter ``name`` as a whole number from ``minimum`` to ``maximum``, ``None``
    when absent; anything else (text, floats, NUL, out of range) is 400 naming the parameter."""
    raw = request.query_params.get(name)
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit()) or not minimum <= int(raw) <= maximum:
        raise exceptions.ValidationError(
            {name: [f"Must be a whole number from {minimum} to {maximum}."]}, code="invalid")
    return int(raw)


class StrictLimitOffsetPagination(LimitOffsetPagination):
    """``limit``/``offset`` that refuse what they cannot use (DRF's silently fall back to the
    defaults): ``limit`` 1 to ``max_limit``, ``offset`` 0 or more; both say so in the schema."""

    def get_limit(self, request):
        limit = int_param(request, self.limit_query_param, minimum=1, maximum=self.max_limit)
        return self.default_limit if limit is None else limit

    def get_offset(self, request):
        return int_param(request, self.offset_query_param) or 0

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        bounds = {self.limit_query_param: {"minimum": 1, "maximum": self.max_limit, "default": self.default_limit},
                  self.offset_query_param: {"minimum": 0, "maximum": MAX_INT, "default": 0}}
        for parameter in parameters:
            parameter["schema"].update(bounds.get(parameter["name"], {}))
        return parameters


class ConversationPagination(StrictLimitOffsetPagination):
    default_limit = 20
    max_limit = 100


class MessagePagination(StrictLimitOffsetPagination):
    default_limit = 50
    max_limit = 200


class ListPagination(StrictLimitOffsetPagination):
    default_limit = 50
    max_limit = 500


# --- Conversations ----------------------------------------------------------------------------


@extend_schema_view(
    get=extend_schema(summary="Your conversations, most recently active first", parameters=[OpenApiParameter(
        "profile", OpenApiTypes.STR, description="Only those with this profile (a widget's own)")], responses={
        200: s.ConversationSerializer(many=True), **errors(400, 403)}),
    post=extend_schema(summary="Start a conversation", request=s.ConversationCreateSerializer,
                       responses={201: s.ConversationSerializer, **errors(400, 403), 500: PROFILE_UNAVAILABLE}),
)
class ConversationList(RagchatAPIView, generics.ListCreateAPIView):
    """The caller's conversations (staff too see only their own here) and starting one."""

    serializer_class = s.ConversationSerializer
    pagination_class = ConversationPagination

    def get_queryset(self):
        conversations = rules.visible_conversations(self.request.user, access.caller_session_key(self.request))
        profile = self.request.query_params.get("profile")
        if profile is not None:  # a widget with a profile lists its own conversations
            if "\x00" in profile or len(profile) > 100:  # no name; PostgreSQL refuses a NUL in text
                raise exceptions.ValidationError({"profile": ["Must be a profile name."]}, code="invalid")
            conversations = conversations.filter(profile=profile)
        return conversations.annotate(first_question=s.first_question_subquery()).order_by(
            "-updated_at", "-created_at", "pk")

    def create(self, request, *args, **kwargs):
        form = s.ConversationCreateSerializer(data=request.data, context={"request": request})
        try:
            form.is_valid(raise_exception=True)  # reads the profile's settings
            # Built now, as a message to it would be: a profile that cannot answer is refused
            # before anything is saved (not 201 and an empty conversation no message can use).
            built_profile(form.validated_data["profile"], "cannot start a conversation")
        except ImproperlyConfigured as exc:  # the named or the default profile's values are wrong
            logger.error("ragchat cannot start a conversation: a profile cannot be built: %s", exc)
            raise APIError(ProfileUnavailable.http_status, ProfileUnavailable.code,
                           ProfileUnavailable.default_message) from None
        except ProfileUnavailable as exc:
            raise APIError(exc.http_status, exc.code, exc.message) from None
        conversation = rules.create_conversation(
            request.user, access.caller_session_key(request, create=True), **form.validated_data
        )
        return Response(s.ConversationSerializer(conversation).data, status=status.HTTP_201_CREATED)


@extend_schema_view(
    get=extend_schema(summary="A conversation, with the answer being written in it if any", parameters=[CONVERSATION_ID],
                      responses={200: s.ConversationDetailSerializer, **errors(403, 404)}),
    patch=extend_schema(summary="Rename a conversation", parameters=[CONVERSATION_ID],
                        request=s.ConversationRenameSerializer,
                        responses={200: s.ConversationSerializer, **errors(400, 403, 404)}),
    delete=extend_schema(summary="Delete a conversation with its messages", parameters=[CONVERSATION_ID],
                         responses={204: None, **errors(403, 404)}),
)
class ConversationDetail(RagchatAPIView, generics.GenericAPIView):
    """One conversation: readable by its owner and staff, changed only by its owner."""

    serializer_class = s.ConversationSerializer

    def get_object(self) -> Conversation:
        conversation = access.get_conversation(self.request, self.kwargs["conversation_id"])
        if self.request.method not in ("GET", "HEAD", "OPTIONS"):
            access.check_change(self.request, conversation)
        return conversation

    def get(self, request, conversation_id):
        return Response(s.ConversationDetailSerializer(self.get_object(), context={"request": request}).data)

    def patch(self, request, conversation_id):
        conversation = self.get_object()
        form = s.ConversationRenameSerializer(conversation, data=request.data, partial=True)
        form.is_valid(raise_exception=True)
        form.save()
        return Response(s.ConversationSerializer(conversation).data)

    def delete(self, request, conversation_id):
        self.get_object().delete()
        return Response(status=status.HTTP_204_NO_CONTENT)


NOT_IN_PROGRESS = OpenApiResponse(s.ErrorSerializer, description="`not_in_progress`: no answer is being written "
                                                                "in this conversation (it ended meanwhile).")


@extend_schema(
    summary="Stop the answer being written in a conversation",
    description=("Stops the answer being written, whichever transport and worker write it (another tab's "
                 "stream, a page left, a REST request waiting for it): at once in the same process, within "
                 "half a second while it waits for an approval and within STREAM_HEARTBEAT_SECONDS otherwise "
                 "from another. Its calls waiting for the user's approval are cancelled now; the answer is "
                 "saved as `incomplete` with what it had written, and its own client gets an `error` event "
                 "`cancelled`. No body. The conversation's owner only."),
    parameters=[CONVERSATION_ID], request=None,
    responses={202: s.CancelSerializer, **errors(403, 404), 409: NOT_IN_PROGRESS},
)
class ConversationCancel(RagchatAPIView):
    """Stop the answer being written in a conversation (the websocket's ``cancel``, over HTTP)."""

    body_required = False

    def post(self, request, conversation_id):
        conversation = access.get_conversation(request, conversation_id)
        access.check_change(request, conversation)
        message_id = request_stop(conversation.pk)
        if message_id is None:
            raise APIError(409, "not_in_progress", "No answer is being written in this conversation.")
        return Response({"assistant_message_id": message_id}, status=status.HTTP_202_ACCEPTED)


# --- Messages ---------------------------------------------------------------------------------


def messages_with_sources(queryset, principals):
    """Messages with their sources (and the sources' chunks) and their tool calls in three more
    queries, whatever the number of messages (the embeddings are not loaded). Each source says
    whether ``principals`` may read its chunk now (``chunk_readable``): the passage of one they
    may not is not shown."""
    sources = (MessageSource.objects.select_related("chunk").defer("chunk__embedding", "chunk__metadata")
               .annotate(chunk_readable=ExpressionWrapper(Q(chunk__access__visible_to=principals),
                                                          output_field=BooleanField())))
    return queryset.prefetch_related(Prefetch("sources", queryset=sources), "tool_invocations")


# The HTTP status of a turn that failed after the user's message was saved, by error code.
FAILED_TURN_STATUS = {
    "timeout": 504,
    "rate_limited": 503,
    "model_unavailable": 503,
    "internal_error": 500,
    "embedding_space_mismatch": 500,
}


@extend_schema_view(
    get=extend_schema(
        summary="The conversation's messages, in order",
        parameters=[CONVERSATION_ID, OpenApiParameter(
            "after", {"type": "integer", "minimum": 0, "maximum": MAX_INT},
            description="Only messages with a sequence number above this one.")],
        responses={200: s.MessageSerializer(many=True), **errors(400, 403, 404)},
    ),
    post=extend_schema(
        summary="Send a message and receive the whole answer",
        description=(
            "Runs the turn to the end and answers 201 with both saved messages. When the model "
            "fails after the user's message was saved, the answer is 502 (503 when the model is "
            "unavailable or rate limited, 504 on a timeout, 500 on an internal error) with the "
            "error's `code` and `detail` and both messages, the assistant's marked `error` with "
            "any partial text. Stream the answer instead with the server-sent events endpoint "
            "or the websocket. A resend with the `client_id` of a message already sent there "
            "answers 200 with the first attempt's messages (409 while its answer is still "
            "being written); 410 `conversation_deleted` when the conversation was deleted "
            "during the turn."
        ),
        parameters=[CONVERSATION_ID, RETRY_AFTER],
        request=s.MessageCreateSerializer,
        responses={
            200: s.TurnSerializer, 201: s.TurnSerializer,
            **errors(400, 403, 404, 409, 410, 413, 429),
            500: s.TurnFailedSerializer, 502: s.TurnFailedSerializer,
            503: s.TurnFailedSerializer, 504: s.TurnFailedSerializer,
        },
    ),
)
class MessageList(RagchatAPIView, generics.ListAPIView):
    """A conversation's message log, and sending a message to it."""

    serializer_class = s.MessageSerializer
    pagination_class = MessagePagination
    object_example = ': {"content": "..."}'

    def get_queryset(self):
        conversation = access.get_conversation(self.request, self.kwargs["conversation_id"])
        queryset = Message.objects.filter(conversation=conversation).order_by("seq")
        after = int_param(self.request, "after")
        if after is not None:
            queryset = queryset.filter(seq__gt=after)
        return messages_with_sources(queryset, access.reader(self.request))

    def post(self, request, conversation_id):
        conversation = access.get_conversation(request, conversation_id)
        access.check_change(request, conversation)
        try:
            text = transport.validate(request.data.get("content"))
        except transport.TurnRefused as exc:
            raise APIError(exc.http_status, exc.code, exc.message) from None
        try:
            client_id = transport.check_client_id(request.data.get("client_id"))
        except transport.TurnRefused as exc:
            raise APIError(exc.http_status, exc.code, exc.message) from None
        session_key = access.caller_session_key(request)
        try:
            # A resend, or a message refused because another answer is being written, is
            # answered before the limits: a retry never costs the caller a turn or a slot.
            persistence.check_pending(conversation.pk, client_id)
            with limits.admitted(request.user, session_key) as admission:
                try:
                    result = run_turn_sync(conversation, text, client_id=client_id, user=request.user)
                except (TurnInProgress, ProfileUnavailable, persistence.DuplicateMessage, Conversation.DoesNotExist):
                    admission.refund()  # found under the conversation's lock, or before it: the turn did not start
                    raise
        except limits.LimitExceeded as exc:
            raise APIError(429, exc.code, exc.message, retry_after_header(exc.retry_after)) from None
        except TurnInProgress as exc:
            raise APIError(409, TurnInProgress.code, str(exc), retry_after_header(exc.retry_after)) from None
        except ProfileUnavailable as exc:
            raise APIError(exc.http_status, exc.code, exc.message) from None
        except Conversation.DoesNotExist:  # deleted while we were getting here
            raise exceptions.NotFound() from None
        except persistence.ConversationGone as exc:
            raise APIError(410, exc.code, exc.message) from None
        except persistence.DuplicateMessage as duplicate:
            # A resend (same client_id): the first attempt's messages, nothing new saved.
            return self._resent(persistence.settle(duplicate))

        saved = {m.pk: m for m in messages_with_sources(
            Message.objects.filter(pk__in=[result.user_message_id, result.message["id"]]), access.reader(request))}
        body = {"user_message": s.MessageSerializer(saved[result.user_message_id]).data,
                "assistant_message": s.MessageSerializer(saved[result.message["id"]]).data}
        if result.error is None:
            return Response(body, status=status.HTTP_201_CREATED)
        error = result.error
        return Response({"code": error.code, "detail": error.message, **body},
                        status=FAILED_TURN_STATUS.get(error.code, 502),
                        headers=retry_after_header(error.retry_after))

    def _resent(self, duplicate) -> Response:
        assistant = duplicate.assistant_message
        if assistant is None or assistant.status == Message.Status.STREAMING:
            raise APIError(409, TurnInProgress.code, "The answer to this message is still being written; send it "
                           "again (same client_id) to get it when it is done.", retry_after_header(1))
        saved = {m.pk: m for m in messages_with_sources(
            Message.objects.filter(pk__in=[duplicate.user_message.pk, assistant.pk]), access.reader(self.request))}
        return Response({"user_message": s.MessageSerializer(saved[duplicate.user_message.pk]).data,
                         "assistant_message": s.MessageSerializer(saved[assistant.pk]).data},
                        status=status.HTTP_200_OK)


# --- Tool calls -------------------------------------------------------------------------------


TOOL_CALL_ID = OpenApiParameter("confirmation_id", OpenApiTypes.INT, OpenApiParameter.PATH,
                                description="The tool call's id: the confirmation_id of its tool_call event.")


def _tool_invocation(request, confirmation_id) -> ToolInvocation:
    """The tool call if the caller may read its conversation; one 404 for unknown, malformed and foreign."""
    pk = parse_invocation_id(confirmation_id)
    invocation = ToolInvocation.objects.select_related("message__conversation").filter(pk=pk).first() if pk else None
    if invocation is None or not rules.can_access(request.user, invocation.message.conversation,
                                                  access.caller_session_key(request)):
        raise exceptions.NotFound()
    return invocation


@extend_schema(summary="A tool call of an answer", parameters=[TOOL_CALL_ID],
               responses={200: s.ToolInvocationSerializer, **errors(403, 404)})
class ToolCallDetail(RagchatAPIView):
    """One tool call the assistant made (or asked to make) in a conversation the caller can read."""

    def get(self, request, confirmation_id):
        return Response(s.ToolInvocationSerializer(_tool_invocation(request, confirmation_id)).data)


NOT_PENDING = OpenApiResponse(s.ErrorSerializer, description="`not_pending`: the call is not waiting for a "
                                                            "decision (decided, abandoned, or its answer ended).")


@extend_schema(
    summary="Approve or reject a tool call that awaits your decision",
    description=("A tool declared with requires_confirmation does not run until the conversation's owner "
                 "approves it here (or with the websocket's tool_decision frame, or the widget's buttons); "
                 "its tool_call event has status awaiting_confirmation and this id as confirmation_id. "
                 "Rejected, or not decided within the profile's tool_confirmation_timeout, it never runs."),
    parameters=[TOOL_CALL_ID], request=s.ToolDecisionSerializer,
    responses={200: s.ToolInvocationSerializer, **errors(400, 403, 404), 409: NOT_PENDING},
)
class ToolCallDecision(RagchatAPIView):
    """The user's decision on a tool call that needs their approval."""

    def post(self, request, confirmation_id):
        form = s.ToolDecisionSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        try:
            invocation = decide_tool_call(confirmation_id, request.user, access.caller_session_key(request),
                                          form.validated_data["approve"])
        except DecisionRefused as exc:
            raise APIError(exc.http_status, exc.code, exc.message) from None
        return Response(s.ToolInvocationSerializer(invocation).data)


# --- Feedback ---------------------------------------------------------------------------------


@extend_schema_view(
    get=extend_schema(summary="Your feedback on an answer", parameters=[MESSAGE_ID],
                      responses={200: s.FeedbackSerializer, **errors(403, 404)}),
    post=extend_schema(summary="Rate an answer (again: replaces your rating)", parameters=[MESSAGE_ID],
                       request=s.FeedbackSerializer,
                       responses={200: s.FeedbackSerializer, 201: s.FeedbackSerializer, **errors(400, 403, 404),
                                  409: NOT_RATEABLE}),
    put=extend_schema(summary="Rate an answer (same as POST)", parameters=[MESSAGE_ID],
                      request=s.FeedbackSerializer,
                      responses={200: s.FeedbackSerializer, 201: s.FeedbackSerializer, **errors(400, 403, 404),
                                 409: NOT_RATEABLE}),
    delete=extend_schema(summary="Withdraw your feedback", parameters=[MESSAGE_ID],
                         responses={204: None, **errors(403, 404)}),
)
class MessageFeedback(RagchatAPIView, generics.GenericAPIView):
    """The caller's own rating of an assistant message in a conversation they can read."""

    serializer_class = s.FeedbackSerializer

    def owner_filter(self, *, create: bool = False) -> dict:
        """Whose feedback: the signed-in user's, or the anonymous caller's session's."""
        if access.is_signed_in(self.request):
            return {"user": self.request.user}
        return {"user": None, "session_key": access.caller_session_key(self.request, create=create) or ""}

    def get_object(self) -> Feedback:
        message = access.get_message(self.request, self.kwargs["message_id"])
        feedback = Feedback.objects.filter(message=message, **self.owner_filter()).first()
        if feedback is None:
            raise exceptions.NotFound("You have not rated this answer.")
        return feedback

    def get(self, request, message_id):
        return Response(s.FeedbackSerializer(self.get_object()).data)

    def post(self, request, message_id):
        message = access.get_message(request, message_id)
        if message.role != Message.Role.ASSISTANT or message.status == Message.Status.STREAMING:
            # A state of the message, not a fault of the request body: 409, as for a turn in progress.
            raise APIError(409, "not_rateable", "Only finished answers of the assistant can be rated.")
        form = s.FeedbackSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        feedback, created = Feedback.objects.update_or_create(
            message=message, **self.owner_filter(create=True), defaults=form.validated_data
        )
        return Response(s.FeedbackSerializer(feedback).data,
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    put = post

    def delete(self, request, message_id):
        self.get_object().delete()
        return Response(status=status.HTTP_204_NO_CONTENT)


@extend_schema(
    summary="Feedback: yours; reviewers (staff with view_feedback) see everyone's",
    parameters=[OpenApiParameter("rating", OpenApiTypes.STR, enum=["up", "down"]),
                OpenApiParameter("conversation", OpenApiTypes.UUID, description="Only this conversation's")],
    responses={200: s.FeedbackSerializer(many=True), **errors(400, 403)},
)
class FeedbackList(RagchatAPIView, generics.ListAPIView):
    """Ratings, newest first: the caller's own; staff with ``view_feedback`` see everyone's."""

    serializer_class = s.FeedbackSerializer
    pagination_class = ListPagination

    def get_queryset(self):
        request = self.request
        if rules.may_review(request.user, "feedback"):
            queryset = Feedback.objects.all()
        elif access.is_signed_in(request):
            queryset = Feedback.objects.filter(user=request.user)
        else:
            session_key = access.caller_session_key(request)
            queryset = Feedback.objects.filter(user=None, session_key=session_key) if session_key \
                else Feedback.objects.none()
        rating = request.query_params.get("rating")
        if rating is not None:
            if rating not in Feedback.Rating.values:
                raise exceptions.ValidationError({"rating": [f"Must be one of {Feedback.Rating.values}."]},
                                                 code="invalid")
            queryset = queryset.filter(rating=rating)
        conversation = request.query_params.get("conversation")
        if conversation is not None:
            # The chat widget shows your earlier ratings when it opens a conversation.
            try:
                queryset = queryset.filter(message__conversation_id=uuid.UUID(conversation))
            except ValueError:
                raise exceptions.ValidationError({"conversation": ["Must be a conversation id (a UUID)."]},
                                                 code="invalid") from None
        return queryset.order_by("-updated_at", "-pk")


# --- Memory -----------------------------------------------------------------------------------


@extend_schema(summary="Long-term memory about you and your conversations; reviewers (staff with view_memoryrecord) see all",
               responses={200: s.MemoryRecordSerializer(many=True), **errors(400, 403)})
class MemoryList(RagchatAPIView, generics.ListAPIView):
    """Summaries and facts the assistant remembers about the caller and their conversations."""

    serializer_class = s.MemoryRecordSerializer
    pagination_class = ListPagination

    def get_queryset(self):
        return access.visible_memory(self.request).order_by("-updated_at", "-pk")


@extend_schema_view(
    get=extend_schema(summary="A memory record", responses={200: s.MemoryRecordSerializer, **errors(403, 404)}),
    patch=extend_schema(summary="Correct a memory record",
                        responses={200: s.MemoryRecordSerializer, **errors(400, 403, 404)}),
    delete=extend_schema(summary="Forget a memory record", responses={204: None, **errors(403, 404)}),
)
class MemoryDetail(RagchatAPIView, generics.RetrieveUpdateDestroyAPIView):
    """One memory record: reviewers (staff with view_memoryrecord) may read any, only its owner may correct or delete it."""

    serializer_class = s.MemoryRecordSerializer
    http_method_names = ["get", "patch", "delete", "head", "options"]

    def get_queryset(self):
        return access.visible_memory(self.request).select_related("conversation")

    def get_object(self):
        record = super().get_object()
        if self.request.method not in ("GET", "HEAD", "OPTIONS") and not access.can_change_memory(self.request, record):
            raise exceptions.PermissionDenied("You may read this memory record but not change it.", code="forbidden")
        return record


# --- Documents --------------------------------------------------------------------------------


class DocumentViewMixin:
    permission_classes = [access.CanManageDocuments]
    serializer_class = s.DocumentSerializer

    def get_queryset(self):
        # The documents the caller may read: listing, reading and deleting alike.
        return (Document.objects.filter(access__visible_to=access.reader(self.request))
                .annotate(chunk_count=Count("chunks")).order_by("source"))


@extend_schema_view(
    get=extend_schema(summary="The documents the assistant searches",
                      responses={200: s.DocumentSerializer(many=True), **errors(400, 403)}),
    post=extend_schema(
        summary="Upload a document for ingestion",
        description="Parses, chunks and embeds the file now; uploading the same `source` again "
                    "replaces the document (or leaves it alone when unchanged). 201 when created, "
                    "200 when updated or unchanged.",
        request={"multipart/form-data": s.DocumentUploadSerializer},
        responses={200: s.IngestResultSerializer, 201: s.IngestResultSerializer,
                   202: OpenApiResponse(s.IngestQueuedSerializer, description=(
                       "Queued: the file is larger than RAGCHAT['BACKGROUND_INGEST_BYTES'] and the task "
                       "backend runs tasks in a worker; poll the task's `url`.")),
                   502: OpenApiResponse(s.ErrorSerializer, description="The embedder failed; nothing was lost."),
                   **errors(400, 403, 413)},
    ),
)
class DocumentList(DocumentViewMixin, RagchatAPIView, generics.ListAPIView):
    """The documents the assistant searches, and uploading one."""

    pagination_class = ListPagination
    parser_classes = [MultiPartParser, FormParser]
    #: Uploads larger than this are refused (413) before they are decoded.
    max_upload_bytes = 10 * 1024 * 1024

    def post(self, request):
        form = s.DocumentUploadSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        data = form.validated_data
        upload = data["file"]
        if upload.size > self.max_upload_bytes:
            raise APIError(413, "too_large", f"The file is larger than {self.max_upload_bytes // 2**20} MB.")
        content_type = data.get("content_type") or content_type_for(PurePath(upload.name))
        if content_type is None:
            raise APIError(400, "unsupported_type", "Name the file .md, .rst, .html or .txt, or give "
                                                    "content_type.")
        try:
            text = upload.read().decode("utf-8-sig")
        except UnicodeDecodeError:
            raise APIError(400, "invalid_encoding", "The file is not UTF-8 text.") from None
        source = data.get("source") or f"upload/{PurePath(upload.name).name}"
        if upload.size > ragchat_settings.BACKGROUND_INGEST_BYTES and tasks.runs_in_background():
            # A worker ingests it; the caller polls the task (documents/tasks/{id}/).
            queued = tasks.enqueue(tasks.ingest_upload, source, text, data["title"], content_type, data["profile"])
            return Response({"task": task_payload(request, queued)}, status=status.HTTP_202_ACCEPTED)
        try:
            result = ingest_text(source, text, title=data["title"], content_type=content_type,
                                 profile=data["profile"])
        except DocumentLoadError as exc:
            raise APIError(400, "invalid_document", exc.reason) from None
        except Exception:
            logger.exception("Ingesting the upload %r failed", source)
            raise APIError(502, "ingestion_failed", "The document could not be embedded or stored; "
                                                    "whatever was stored before is kept.") from None
        document = self.get_queryset().get(pk=result.document_id)
        return Response({"document": s.DocumentSerializer(document).data, "outcome": result.status},
                        status=status.HTTP_201_CREATED if result.status == CREATED else status.HTTP_200_OK)


def task_payload(request, result) -> dict:
    """What the API says of an ingestion task (``tasks.ingest_upload``)."""
    payload = {
        "id": str(result.id),
        "status": str(result.status.value if hasattr(result.status, "value") else result.status),
        "url": request.build_absolute_uri(reverse("ragchat_api:document-task", args=[result.id])),
        "enqueued_at": result.enqueued_at, "started_at": result.started_at, "finished_at": result.finished_at,
        "result": None, "error": None,
    }
    if payload["status"] == tasks.TaskResultStatus.SUCCESSFUL:
        payload["result"] = result.return_value
    elif payload["status"] == tasks.TaskResultStatus.FAILED:
        # The exception's class only: its message and traceback are for the logs.
        payload["error"] = result.errors[-1].exception_class_path if result.errors else "unknown"
    return payload


@extend_schema(summary="The status of a queued document ingestion", parameters=[
    OpenApiParameter("task_id", OpenApiTypes.STR, OpenApiParameter.PATH)],
    responses={200: s.IngestTaskSerializer, **errors(403, 404)})
class DocumentTask(RagchatAPIView):
    """A queued upload's task: ``READY``, ``RUNNING``, ``SUCCESSFUL`` (with the document id and
    outcome) or ``FAILED`` (with the exception's class)."""

    permission_classes = [access.CanUploadDocuments]

    def get(self, request, task_id):
        result = tasks.result_of(tasks.ingest_upload, task_id)
        if result is None:
            raise exceptions.NotFound()
        return Response(task_payload(request, result))


@extend_schema_view(
    get=extend_schema(summary="A document", responses={200: s.DocumentSerializer, **errors(403, 404)}),
    delete=extend_schema(summary="Delete a document and its chunks", responses={204: None, **errors(403, 404)}),
)
class DocumentDetail(DocumentViewMixin, RagchatAPIView, generics.RetrieveDestroyAPIView):
    """One document; deleting it deletes its chunks (answers keep their source labels)."""

    def perform_destroy(self, instance):
        # Load no chunk texts or embeddings just to delete them.
        instance.chunks.only("id").delete()
        instance.delete()


# --- Plugins ----------------------------------------------------------------------------------


@extend_schema(summary="Loaded plugins, registered components and tools, and what each profile runs (staff)",
               responses={200: s.PluginListingSerializer, **errors(403)})
class PluginList(RagchatAPIView):
    """What is installed: plugins with their hooks, components by stage in call order, the
    registered tools, and each profile's components and tools (what ``ragchat_plugins`` lists)."""

    permission_classes = [access.IsStaff]

    def get(self, request):
        registry = get_registry()
        components = [
            {"kind": r.kind, "name": r.name, "plugin": r.plugin, "order": r.order,
             "enabled_by_default": r.cls.enabled_by_default, "path": f"{r.cls.__module__}.{r.cls.__qualname__}"}
            for r in registry.all()
        ]
        profiles = [
            {"name": name, "title": runs["title"], "error": runs.get("error"), "tools": runs.get("tools", []),
             "components": None if "error" in runs else {field: runs[field] for field in PIPELINE_ORDER}}
            for name, runs in profile_listing().items()
        ]
        return Response({"plugins": plugin_listing(), "components": components, "tools": tool_listing(),
                         "profiles": profiles, "errors": list(registry.errors)})
