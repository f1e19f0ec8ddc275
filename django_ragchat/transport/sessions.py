"""Sessions and sign-in: an anonymous visitor's conversations follow them when they sign in.

Anonymous conversations are bound to the Django session key (``Conversation.session_key``), and
``django.contrib.auth.login`` changes that key (``cycle_key``, against session fixation) before
``user_logged_in`` is sent. The key the visitor had is still the session cookie of the request
that signed them in: ``move_anonymous_conversations`` gives the conversations bound to it to the
user. Only a key the browser presented moves anything, and only to the user it signed in as.
Connected in ``AppConfig.ready``.
"""

from __future__ import annotations

from django.conf import settings

from django_ragchat.models import Conversation


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
