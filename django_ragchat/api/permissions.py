"""DRF permission classes and object lookups for the API, over ``django_ragchat.permissions``.

The rules (who may read a conversation, who may change it, who may manage documents) live in
``django_ragchat.permissions`` and are swappable through settings; this module only applies
them to DRF requests:

* ``CanChat``: signed in, or anonymous while ``RAGCHAT["ALLOW_ANONYMOUS"]`` is on. An anonymous
  caller is identified by their session, so their unsafe requests must carry the CSRF token
  (DRF's ``SessionAuthentication`` checks it only for signed-in users).
* ``IsSignedIn``, ``IsStaff``: what their names say. ``CanManageDocuments`` (reading: signed
  in; adding and deleting: ``DOCUMENT_PERMISSION``), ``CanUploadDocuments`` (a queued upload's
  task: ``DOCUMENT_PERMISSION``).
* ``get_conversation`` / ``get_message``: the object lookups; an unknown id, a malformed id
  and an id the caller may not read all raise the same ``NotFound``.
* ``check_change``: ``PermissionDenied`` (403) when the caller may read but not change.
* ``reader``: the caller's principals (``django_ragchat.access``): the documents listed and the
  sources' passages shown are those the caller may read.
"""

from __future__ import annotations

from django.db.models import Q
from rest_framework import exceptions, permissions

from django_ragchat import permissions as rules
from django_ragchat.access import PUBLIC_ONLY, Principals, principals_of_user_id
from django_ragchat.conf import ragchat_settings
from django_ragchat.models import Conversation, MemoryRecord, Message
from django_ragchat.transport import csrf


def is_signed_in(request) -> bool:
    return bool(request.user and request.user.is_authenticated)


def caller_session_key(request, *, create: bool = False) -> str | None:
    """The anonymous caller's session key; ``None`` for signed-in callers.

    With ``create`` a session is started if the caller has none yet (an anonymous visitor's
    first conversation); otherwise a caller without a session has nothing of their own.
    """
    if is_signed_in(request) or not ragchat_settings.ALLOW_ANONYMOUS:
        return None
    session = getattr(request, "session", None)
    if session is None:
        return None
    if session.session_key is None and create:
        session.save()
    return session.session_key


def reader(request) -> Principals:
    """The caller's principals, read once per request (one query for a signed-in user)."""
    cached = getattr(request, "_ragchat_principals", None)
    if cached is None:
        cached = principals_of_user_id(request.user.pk) if is_signed_in(request) else PUBLIC_ONLY
        request._ragchat_principals = cached
    return cached


#: How DRF's ``SessionAuthentication.enforce_csrf`` words its refusal, before the reason.
CSRF_FAILED = "CSRF Failed: "


def enforce_csrf(request) -> None:
    """The check DRF's ``SessionAuthentication`` makes, for anonymous session callers; refused
    in its words, which the API's exception handler answers as ``csrf_failed``."""
    reason = csrf.failure(request)
    if reason:
        raise exceptions.PermissionDenied(CSRF_FAILED + reason)


class CanChat(permissions.BasePermission):
    """Signed in, or anonymous while ``ALLOW_ANONYMOUS`` is on (bound to the session)."""

    message = "Sign in to use the chat (anonymous conversations are not enabled)."

    def has_permission(self, request, view) -> bool:
        if is_signed_in(request):
            return True
        if not ragchat_settings.ALLOW_ANONYMOUS:
            return False
        if request.method not in permissions.SAFE_METHODS:
            enforce_csrf(request)
        return True


class IsSignedIn(permissions.BasePermission):
    message = "Sign in to see this."

    def has_permission(self, request, view) -> bool:
        return is_signed_in(request)


class IsStaff(permissions.BasePermission):
    message = "Only staff may see this."

    def has_permission(self, request, view) -> bool:
        return rules.is_staff(request.user)


class CanManageDocuments(permissions.BasePermission):
    """Reading: any signed-in user. Adding and deleting: ``DOCUMENT_PERMISSION`` (by default
    staff with ``django_ragchat.add_document`` and ``delete_document``, as in the admin)."""

    message = "You may not add or delete documents."

    def has_permission(self, request, view) -> bool:
        if not is_signed_in(request):
            return False
        return request.method in permissions.SAFE_METHODS or rules.can_manage_documents(request.user)


class CanUploadDocuments(permissions.BasePermission):
    """``DOCUMENT_PERMISSION`` (by default staff with ``django_ragchat.add_document`` and
    ``delete_document``) for every method: queued uploads are theirs to follow."""

    message = "You may not add or delete documents."

    def has_permission(self, request, view) -> bool:
        return is_signed_in(request) and rules.can_manage_documents(request.user)


def get_conversation(request, conversation_id) -> Conversation:
    """The conversation if the caller may read it; ``NotFound`` otherwise, whatever the reason."""
    try:
        return rules.get_conversation_for(request.user, conversation_id, caller_session_key(request))
    except Conversation.DoesNotExist:
        raise exceptions.NotFound() from None


def check_change(request, conversation: Conversation) -> None:
    """``PermissionDenied`` unless the caller may change ``conversation`` (which they can read)."""
    if not rules.can_change(request.user, conversation, caller_session_key(request)):
        raise exceptions.PermissionDenied("You may read this conversation but not change it.", code="forbidden")


def get_message(request, message_id) -> Message:
    """A message of a conversation the caller may read; ``NotFound`` otherwise."""
    try:
        message = Message.objects.select_related("conversation").get(pk=int(str(message_id)))
    except (ValueError, Message.DoesNotExist):
        raise exceptions.NotFound() from None
    if not (is_signed_in(request) or ragchat_settings.ALLOW_ANONYMOUS) or not rules.can_access(
        request.user, message.conversation, caller_session_key(request)
    ):
        raise exceptions.NotFound()
    return message


def visible_memory(request):
    """Memory records the caller may read: about them or their conversations; staff with
    ``view_memoryrecord``: all."""
    user = request.user
    if rules.may_review(user, "memoryrecord"):
        return MemoryRecord.objects.all()
    if is_signed_in(request):
        return MemoryRecord.objects.filter(Q(user=user) | Q(conversation__owner=user))
    session_key = caller_session_key(request)
    if session_key:
        return MemoryRecord.objects.filter(user__isnull=True, conversation__owner__isnull=True,
                                           conversation__session_key=session_key)
    return MemoryRecord.objects.none()


def can_change_memory(request, record: MemoryRecord) -> bool:
    """Records about the caller, or about a conversation they may change."""
    if is_signed_in(request) and record.user_id == request.user.pk:
        return True
    return record.conversation_id is not None and rules.can_change(
        request.user, record.conversation, caller_session_key(request)
    )
