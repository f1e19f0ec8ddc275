"""Who may see and change a conversation, in one place for every transport.

The API, the server-sent events view and the websocket consumer all look conversations up
through ``get_conversation_for``, which answers an unknown id and a foreign id the same way
(``Conversation.DoesNotExist``, a 404), so ids cannot be probed.

The rules themselves are swappable, each a dotted path in ``RAGCHAT``:

* ``CONVERSATION_PERMISSION``: who may *read* a conversation, ``(user, conversation,
  session_key=None) -> bool``; default ``is_owner_or_reviewer``: its owner, and staff with
  ``django_ragchat.view_conversation``, as in the admin (``is_owner_or_staff`` lets any staff
  member read every conversation).
* ``CONVERSATION_CHANGE_PERMISSION``: who may *change* one (send messages, rename, delete),
  same signature; default ``is_owner``, so reviewers read but write only their own.
  It is only asked about conversations the caller may read.
* ``DOCUMENT_PERMISSION``: who may add and delete documents, ``(user) -> bool``; default
  ``may_manage_documents``: staff with ``django_ragchat.add_document`` and
  ``django_ragchat.delete_document``, as in the admin (``is_staff`` lets any member of staff
  upload and delete).
* ``PROFILE_PERMISSION``: which profiles a user may start conversations with, ``(user,
  profile_name) -> bool``; default ``any_profile``. The default profile is always allowed, so
  every user has an assistant. The REST API and the OpenAI-compatible endpoint (where a profile
  is a model) ask it; a conversation keeps its profile once it exists.
"""

from __future__ import annotations

import uuid

from asgiref.sync import sync_to_async
from django.utils.module_loading import import_string

from django_ragchat.conf import ragchat_settings
from django_ragchat.models import Conversation
from django_ragchat.profiles import get_profile


def is_owner_or_staff(user, conversation, session_key: str | None = None) -> bool:
    """The owner, staff, or (for an anonymous conversation) the session that created it."""
    if user is not None and user.is_authenticated:
        return conversation.owner_id == user.pk or user.is_staff
    if conversation.owner_id is None and session_key:
        return conversation.session_key == session_key
    return False


def may_review(user, model_name: str) -> bool:
    """Whether ``user`` is staff with the ``view`` permission of django_ragchat's ``model_name``
    ("conversation", "memoryrecord", "feedback"): what the admin asks before showing other users'
    chat data (``manage.py ragchat_admin_group`` grants them). Being staff alone is not enough."""
    return is_staff(user) and user.has_perm(f"django_ragchat.view_{model_name}")


def is_owner_or_reviewer(user, conversation, session_key: str | None = None) -> bool:
    """The owner, staff who may review conversations (``may_review``), or (for an anonymous
    conversation) the session that created it."""
    return is_owner(user, conversation, session_key) or may_review(user, "conversation")


def is_owner(user, conversation, session_key: str | None = None) -> bool:
    """The owner, or (for an anonymous conversation) the session that created it."""
    if user is not None and user.is_authenticated:
        return conversation.owner_id == user.pk
    if conversation.owner_id is None and session_key:
        return conversation.session_key == session_key
    return False


def is_staff(user) -> bool:
    """Signed in and staff. As ``DOCUMENT_PERMISSION``: every member of staff may add and
    delete documents, with no model permission (the default before ``may_manage_documents``)."""
    return bool(user is not None and user.is_authenticated and user.is_staff)


def may_manage_documents(user) -> bool:
    """Whether ``user`` is staff with ``django_ragchat.add_document`` and
    ``django_ragchat.delete_document`` (superusers have both): the default
    ``DOCUMENT_PERMISSION``. The admin asks the same permissions before it uploads or deletes a
    document, and ``manage.py ragchat_admin_group --documents`` grants them, so the API lets
    the same people do the same things. Being staff alone is not enough."""
    return is_staff(user) and user.has_perms(["django_ragchat.add_document", "django_ragchat.delete_document"])


def any_profile(user, profile_name: str) -> bool:
    """Every user may use every profile (the default ``PROFILE_PERMISSION``)."""
    return True


def can_use_profile(user, profile_name: str) -> bool:
    """May ``user`` start conversations with the profile ``profile_name``? Always for the
    default profile; ``PROFILE_PERMISSION`` decides for the others (a name that is not a
    profile is never allowed)."""
    if profile_name == get_profile().name:
        return True
    if profile_name not in ragchat_settings.PROFILES:
        return False
    return bool(import_string(ragchat_settings.PROFILE_PERMISSION)(user, profile_name))


def usable_profiles(user) -> list[str]:
    """The names of the profiles ``user`` may use, the default first."""
    default = get_profile().name
    return [default] + [name for name in ragchat_settings.PROFILES
                        if name != default and can_use_profile(user, name)]


def can_access(user, conversation, session_key: str | None = None) -> bool:
    """May ``user`` read ``conversation`` (``CONVERSATION_PERMISSION``)?"""
    return import_string(ragchat_settings.CONVERSATION_PERMISSION)(user, conversation, session_key)


def can_change(user, conversation, session_key: str | None = None) -> bool:
    """May ``user`` send messages to, rename or delete ``conversation``
    (``CONVERSATION_CHANGE_PERMISSION``)? Ask only after ``can_access``."""
    return import_string(ragchat_settings.CONVERSATION_CHANGE_PERMISSION)(user, conversation, session_key)


def can_manage_documents(user) -> bool:
    """May ``user`` add and delete documents (``DOCUMENT_PERMISSION``)?"""
    return import_string(ragchat_settings.DOCUMENT_PERMISSION)(user)


def visible_conversations(user, session_key: str | None = None):
    """The conversations ``user`` (or the anonymous ``session_key``) may list: their own.

    Staff may *open* anyone's conversation by id, but their own list stays their own.
    """

    if user is not None and user.is_authenticated:
        return Conversation.objects.filter(owner=user)
    if ragchat_settings.ALLOW_ANONYMOUS and session_key:
        return Conversation.objects.filter(owner__isnull=True, session_key=session_key)
    return Conversation.objects.none()


def get_conversation_for(user, conversation_id, session_key: str | None = None, *, queryset=None):
    """The conversation if it exists and ``user`` may access it; else ``DoesNotExist``.

    An unknown id, a malformed id and another user's id are indistinguishable to the caller.
    ``queryset``: where to look it up (``Conversation.objects`` with annotations of the caller's).
    """

    try:
        conversation_id = uuid.UUID(str(conversation_id))
    except (TypeError, ValueError, AttributeError):
        raise Conversation.DoesNotExist("No such conversation.") from None
    if not (user is not None and user.is_authenticated) and not ragchat_settings.ALLOW_ANONYMOUS:
        raise Conversation.DoesNotExist("No such conversation.")
    conversation = (Conversation.objects if queryset is None else queryset).filter(pk=conversation_id).first()
    if conversation is None or not can_access(user, conversation, session_key):
        raise Conversation.DoesNotExist("No such conversation.")
    return conversation


async def aget_conversation_for(user, conversation_id, session_key: str | None = None):
    return await sync_to_async(get_conversation_for)(user, conversation_id, session_key)


def create_conversation(user, session_key: str | None = None, *, profile: str | None = None,
                        title: str = "", metadata: dict | None = None):
    """A new conversation owned by ``user``, or bound to ``session_key`` when anonymous use is
    allowed. Raises ``PermissionError`` for an anonymous caller when it is not."""

    profile_name = get_profile(profile).name  # raises UnknownProfile for a bad name
    if user is not None and user.is_authenticated:
        return Conversation.objects.create(owner=user, profile=profile_name, title=title, metadata=metadata or {})
    if not ragchat_settings.ALLOW_ANONYMOUS or not session_key:
        raise PermissionError("Sign in to chat (anonymous conversations are not enabled).")
    return Conversation.objects.create(session_key=session_key, profile=profile_name, title=title,
                                       metadata=metadata or {})
