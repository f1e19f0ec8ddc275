"""The chat page: the chat widget (``{% ragchat_widget %}``, ``static/django_ragchat/widget.js``)
on a page of its own. The widget is a dependency-free front end over the REST API and the
streaming transports (the websocket under ASGI, server-sent events otherwise); docs/widget.md.

Everything the widget shows that comes from the model or the documents is inserted as text
(``textContent``), never as HTML: model output is untrusted.
"""

from __future__ import annotations

from urllib.parse import urlencode

from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.contrib.auth.views import LoginView, LogoutView, redirect_to_login
from django.core.exceptions import ImproperlyConfigured
from django.core.handlers.asgi import ASGIRequest
from django.middleware.csrf import get_token
from django.shortcuts import render, resolve_url
from django.urls import NoReverseMatch, get_script_prefix, reverse, reverse_lazy
from django.views.decorators.http import require_safe

from django_ragchat.conf import ragchat_settings
from django_ragchat.events import PROTOCOL_VERSION
from django_ragchat.permissions import usable_profiles
from django_ragchat.profiles import get_profile, profile_title
from django_ragchat.transport.routing import WEBSOCKET_PATH

# Stands for a conversation id in the URL templates handed to the page's script.
ID_PLACEHOLDER = "00000000-0000-0000-0000-000000000000"


def page_config(request, profile: str = "") -> dict:
    """The URLs and settings the page's script reads (``json_script``, never inline code); with
    ``profile``, a widget's own: it starts conversations with it and lists only those."""
    try:
        api = {
            "conversations": reverse("ragchat_api:conversation-list"),
            "conversation": reverse("ragchat_api:conversation-detail", args=[ID_PLACEHOLDER]),
            "messages": reverse("ragchat_api:message-list", args=[ID_PLACEHOLDER]),
            "feedback": reverse("ragchat_api:message-feedback", args=[ID_PLACEHOLDER]),
            "feedbackList": reverse("ragchat_api:feedback-list"),
            "toolDecision": reverse("ragchat_api:tool-call-decision", args=[ID_PLACEHOLDER]),
            "cancel": reverse("ragchat_api:conversation-cancel", args=[ID_PLACEHOLDER]),
        }
    except NoReverseMatch:
        raise ImproperlyConfigured(
            'The chat page needs the REST API: add path("api/ragchat/", '
            'include("django_ragchat.api.urls")) to your URLconf.'
        ) from None
    if profile:
        profile = get_profile(profile).name  # UnknownProfile (ImproperlyConfigured) names the choices
        api["conversations"] += "?" + urlencode({"profile": profile})
    return {
        "protocol": PROTOCOL_VERSION,
        "profile": profile or None,
        # The profile a new conversation starts with, and the profiles whose conversations the
        # widget lists (its own, or those the caller may use), each saying whether it answers
        # with no language model (the extractive answerer) and its title: the page marks each
        # conversation with its profile's title when there are several, and shows its model
        # notice for the one open.
        "defaultProfile": profile or ragchat_settings.DEFAULT_PROFILE,
        "profiles": {name: {"extractive": is_extractive(name), "title": profile_title(name)}
                     for name in listed_profiles(request, profile)},
        "idPlaceholder": ID_PLACEHOLDER,
        "api": api,
        "stream": reverse("ragchat:stream", args=[ID_PLACEHOLDER]),
        "streamNew": reverse("ragchat:stream-new"),
        # Only an ASGI server can have the websocket; the page falls back to server-sent
        # events when it is absent or does not connect.
        "websocket": get_script_prefix() + WEBSOCKET_PATH if isinstance(request, ASGIRequest) else None,
        "csrfToken": get_token(request),
        "maxMessageChars": ragchat_settings.MAX_MESSAGE_CHARS,
        "citedSourcesOnly": cited_sources_only(request),
    }


def listed_profiles(request, profile: str = "") -> list[str]:
    """The profiles a widget lists the conversations of: its own, else those the caller may use
    (``PROFILE_PERMISSION``), the default first."""
    if profile:
        return [profile]
    try:
        return usable_profiles(getattr(request, "user", None) or AnonymousUser())
    except ImproperlyConfigured:  # a wrong default profile is reported by the turn and the system check
        return [ragchat_settings.DEFAULT_PROFILE]


def is_extractive(profile: str) -> bool:
    """Whether ``profile`` answers with no language model: sentences quoted from the documents,
    until a model is configured (false for a profile that cannot be read: a turn reports it)."""
    try:
        return get_profile(profile).llm == "extractive"
    except ImproperlyConfigured:
        return False


def cited_sources_only(request) -> bool:
    """Whether the widget shows this caller only the passages an answer cites
    (``CITED_SOURCES_ONLY``: ``True``, ``False`` or ``"signed_out"``). Any other value (which
    ``ragchat.E007`` reports) shows the cited ones only: the fewer passages, never more."""
    setting = ragchat_settings.CITED_SOURCES_ONLY
    if setting == "signed_out":
        user = getattr(request, "user", None)
        return not (user is not None and user.is_authenticated)
    return setting is not False


def may_chat(request) -> bool:
    """Whether the caller may chat: signed in, or anonymous chat is on (their session is started
    here, so the API, the stream and the websocket all see the same one)."""
    user = getattr(request, "user", None)  # absent without the auth middleware
    if user is not None and user.is_authenticated:
        return True
    session = getattr(request, "session", None)
    if not ragchat_settings.ALLOW_ANONYMOUS or session is None:
        return False
    if session.session_key is None:
        # An anonymous visitor's conversations are bound to their session: start it now.
        session.save()
    return True


@require_safe  # GET, and HEAD for uptime checks and link previews
def chat_page(request):
    """The chat page: your conversations, a new one, and the answer streaming with its sources."""
    if not may_chat(request):
        return redirect_to_login(request.get_full_path())
    # Said on the page: until a model is configured, answers are quoted, not written (issue #9),
    # for the profile of the conversation shown (the widget shows ``model_notice`` for those of
    # its profiles that have no model). ``notice`` is the default profile's, for templates made
    # before ``model_notice``.
    notice = MODEL_NOTICE if is_extractive(ragchat_settings.DEFAULT_PROFILE) else ""
    # A visitor chatting anonymously who has an account finds where to sign in (their own rows
    # answer only then), and comes back here.
    login_url = "" if request.user.is_authenticated else _login_url(request)
    return render(request, "django_ragchat/chat.html",
                  {"model_notice": MODEL_NOTICE, "notice": notice, "login_url": login_url})


def _login_url(request) -> str:
    """``settings.LOGIN_URL`` with ``?next=`` this page; "" when it names no URL (the system
    check ``ragchat.W031`` says so; the page still renders)."""
    try:
        login = resolve_url(settings.LOGIN_URL)
    except NoReverseMatch:
        return ""
    return f"{login}?{urlencode({'next': request.get_full_path()})}"


#: The chat page's notice for a conversation whose profile has no language model.
MODEL_NOTICE = ("Answers are sentences quoted from the documents, with their sources, until a language "
                "model is configured.")


class SignInView(LoginView):
    """The chat's own sign-in page, for any active user of the site (customers, not only staff:
    the admin's sign-in page refuses non-staff). A site without a sign-in page of its own points
    ``LOGIN_URL`` here (``"ragchat:login"``); after signing in, the visitor goes back where they
    were sent from (``?next=``), or to the chat page. Its template,
    ``django_ragchat/login.html``, can be overridden like any other."""

    template_name = "django_ragchat/login.html"
    redirect_authenticated_user = True
    next_page = reverse_lazy("ragchat:chat")

    def get_context_data(self, **kwargs):
        # The form carries ``?next=`` on to the POST (only a URL of this site: get_redirect_url
        # drops any other); LoginView's context names it by its value alone.
        return super().get_context_data(redirect_field_name=self.redirect_field_name,
                                        redirect_to=self.get_redirect_url(), **kwargs)


class SignOutView(LogoutView):
    """Signing out (POST, as Django's ``LogoutView``): back to the sign-in page. The chat's open
    websockets of that session are closed at once (``transport.sessions``)."""

    next_page = reverse_lazy("ragchat:login")
