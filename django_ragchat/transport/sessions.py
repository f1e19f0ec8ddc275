"""Sessions and sign-in: an anonymous visitor's conversations follow them when they sign in,
and a session's websockets close when it is logged out.

Anonymous conversations are bound to the Django session key (``Conversation.session_key``), and
``django.contrib.auth.login`` changes that key (``cycle_key``, against session fixation) before
``user_logged_in`` is sent. The key the visitor had is still the session cookie of the request
that signed them in: ``move_anonymous_conversations`` gives the conversations bound to it to the
user. Only a key the browser presented moves anything, and only to the user it signed in as.

Every chat socket joins its session's channel-layer group (``session_group``); a logout
(``user_logged_out``, sent before Django flushes the session) tells that group, and each of
its sockets, whichever worker holds it, sends ``session_ended`` and closes with 4401 at once
(``close_session_sockets``). Sockets also check their session again on every frame they
receive and before they relay a turn's events, which covers what sends no signal (an expired
session, a session deleted from the store) and sites without a channel layer. Both receivers
are connected in ``AppConfig.ready``.
"""

from __future__ import annotations

import hashlib
import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings

from django_ragchat.models import Conversation

logger = logging.getLogger(__name__)


def session_group(session_key: str) -> str:
    """The channel-layer group of the sockets opened with this session (the key is hashed: group
    names are stored by the layer, and a session key is a credential)."""
    return f"ragchat.session.{hashlib.sha256(session_key.encode()).hexdigest()[:40]}"


def close_session_sockets(sender, request, user, **kwargs) -> bool:
    """``user_logged_out`` receiver: every chat socket of the session being logged out is told
    and closed (4401). ``False`` when there is no channel layer to reach them, or it failed
    (logged; the sockets then find out at their next frame)."""
    key = getattr(getattr(request, "session", None), "session_key", None)
    if not key:
        return False
    layer = get_channel_layer()
    if layer is None:
        return False
    try:
        async_to_sync(layer.group_send)(session_group(key), {"type": "ragchat.session_ended"})
    except Exception:
        logger.exception("ragchat: could not tell the sockets of a session that it was logged out")
        return False
    return True


def move_anonymous_conversations(sender, request, user, **kwargs) -> int:
    """``user_logged_in`` receiver: the request's previous anonymous conversations become the
    user's own. Returns how many moved (0 without a request, e.g. ``force_login`` in tests)."""

    if request is None or user is None or not getattr(user, "pk", None):
        return 0
    previous = getattr(request, "COOKIES", {}).get(settings.SESSION_COOKIE_NAME)
    session = getattr(request, "session", None)
    if not previous or previous == getattr(session, "session_key", None):
        return 0  # no earlier session, or it was kept: nothing bound to another key
    return Conversation.objects.filter(owner__isnull=True, session_key=previous).update(owner=user, session_key="")
