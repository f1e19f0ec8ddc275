"""The chat widget's server side: the ``{% ragchat_widget %}`` tag, the chat page that uses it,
the server-sent events endpoint that starts a conversation only once its first message is
accepted, and the feedback list filtered by conversation (which the widget reads). The widget
itself runs in Chromium in tests/test_browser.py."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from django.conf import settings as django_settings
from django.contrib.sessions.backends.db import SessionStore
from django.core.exceptions import ImproperlyConfigured
from django.shortcuts import resolve_url
from django.template import Context, Template, engines
from django.utils.html import escape

from django_ragchat.conf import ragchat_settings
from django_ragchat.models import Conversation, Feedback, Message
from tests.live_servers import anonymous_caller, caller_for, parse_sse, sse_headers, wait_for

QUESTION = "How much does the Aurora X2 cost?"


def render_tag(request, arguments: str = "") -> str:
    return engines["django"].from_string("{% load ragchat %}{% ragchat_widget " + arguments + " %}").render(
        {}, request)


def widget_config(html: str) -> dict:
    match = re.search(r'<script id="(ragchat-[0-9a-f]{8}-config)" type="application/json">(.*?)</script>', html, re.S)
    assert match, html
    assert f'data-ragchat-widget="{match.group(1)}"' in html
    return json.loads(match.group(2))


@pytest.mark.django_db
def test_the_tag_renders_the_widget_with_its_config_and_module(rf, user):
    request = rf.get("/products/")
    request.user = user
    request.session = SessionStore()
    html = render_tag(request, 'label="Product questions"')
    config = widget_config(html)
    assert config["streamNew"] == "/chat/stream/"
    assert config["stream"] == f"/chat/conversations/{config['idPlaceholder']}/stream/"
    assert config["api"]["feedback"] == f"/api/ragchat/messages/{config['idPlaceholder']}/feedback/"
    assert config["api"]["feedbackList"] == "/api/ragchat/feedback/"
    assert config["websocket"] is None  # a WSGI request: server-sent events only
    assert config["csrfToken"]
    assert 'aria-label="Product questions"' in html
    noticed = engines["django"].from_string("{% load ragchat %}{% ragchat_widget notice=text %}").render(
        {"text": "<b>Answers</b> quote the documents."}, request)  # a variable's text is escaped
    assert '<p class="ragchat-notice" role="note">&lt;b&gt;Answers&lt;/b&gt; quote the documents.</p>' in noticed
    assert "ragchat-notice" not in html
    assert '<script type="module" src="/static/django_ragchat/widget.js"></script>' in html
    assert 'href="/static/django_ragchat/widget.css"' in html
    # No inline code: the only other script is the JSON config.
    assert len(re.findall(r"<script", html)) == 2
    # Two widgets on a page have different ids.
    assert widget_config(render_tag(request))["csrfToken"] and render_tag(request) != render_tag(request)


@pytest.mark.django_db
def test_a_widget_with_a_profile_says_it_and_lists_only_its_conversations(rf, user, ragchat_settings_override):
    from django_ragchat.profiles import UnknownProfile

    ragchat_settings_override(PROFILES={"default": {}, "shouting": {}})
    request = rf.get("/products/")
    request.user = user
    request.session = SessionStore()
    config = widget_config(render_tag(request, 'profile="shouting"'))
    assert config["profile"] == "shouting"
    assert config["api"]["conversations"] == "/api/ragchat/conversations/?profile=shouting"
    assert widget_config(render_tag(request))["profile"] is None
    with pytest.raises(UnknownProfile, match="No profile named 'nope'"):
        render_tag(request, 'profile="nope"')


def no_vip(user, name):
    """A PROFILE_PERMISSION: every profile but "vip"."""
    return name != "vip"


MODEL_NOTICE = '<p class="ragchat-notice ragchat-model-notice" role="note"{}>Answers are sentences quoted'


@pytest.mark.django_db
def test_the_page_says_each_of_its_profiles_and_whether_it_has_a_language_model(client, rf, user,
                                                                                ragchat_settings_override):
    """A new user's helpdesk with two profiles: the chat page's notice ("... until a language
    model is configured") followed the default profile, whichever conversation was open, and the
    list did not say which conversation was whose. The page now knows, per profile it lists,
    whether it answers with no model (the widget shows the notice and the profile names from it)."""
    ragchat_settings_override(PROFILES={"default": {}, "support": {"llm": "openai", "title": "Customer support"},
                                        "vip": {}, "broken": {"top_k": 0}},
                              PROFILE_PERMISSION="tests.test_widget.no_vip")
    request = rf.get("/products/")
    request.user = user
    request.session = SessionStore()
    config = widget_config(render_tag(request))
    assert config["defaultProfile"] == "default" and config["profile"] is None
    # Each with its title, what the page shows for it (a new user's list said "support"); the
    # name where it has none.
    assert config["profiles"] == {"default": {"extractive": True, "title": "default"},
                                  "support": {"extractive": False, "title": "Customer support"},
                                  "broken": {"extractive": False, "title": "broken"}}  # not "vip": not the caller's business
    own = widget_config(render_tag(request, 'profile="support"'))
    assert own["defaultProfile"] == "support"
    assert own["profiles"] == {"support": {"extractive": False, "title": "Customer support"}}
    # The chat page: the notice is there for the widget to show, shown at first for the profile
    # a new conversation starts with.
    client.force_login(user)
    assert MODEL_NOTICE.format("") in client.get("/chat/").content.decode()
    ragchat_settings_override(DEFAULT_PROFILE="support")
    assert MODEL_NOTICE.format(" hidden") in client.get("/chat/").content.decode()
    # No profile without a model: no notice at all.
    ragchat_settings_override(PROFILES={"default": {"llm": "openai"}, "support": {"llm": "openai"}},
                              DEFAULT_PROFILE="default")
    assert "ragchat-model-notice" not in client.get("/chat/").content.decode()


@pytest.mark.django_db
def test_an_anonymous_visitor_gets_a_session_or_a_sign_in_link(rf, settings):
    from django.contrib.auth.models import AnonymousUser

    settings.LOGIN_URL = "/accounts/login/"
    request = rf.get("/products/?page=2")
    request.user = AnonymousUser()
    request.session = SessionStore()
    settings.RAGCHAT = {**settings.RAGCHAT, "ALLOW_ANONYMOUS": False}
    html = render_tag(request)
    assert 'href="/accounts/login/?next=/products/%3Fpage%3D2"' in html and "data-ragchat-widget" not in html
    assert request.session.session_key is None
    settings.RAGCHAT = {**settings.RAGCHAT, "ALLOW_ANONYMOUS": True}
    widget_config(render_tag(request))
    assert request.session.session_key  # started: the visitor's conversations are bound to it


def message_box(html: str) -> str:
    (box,) = re.findall(r'<textarea class="ragchat-input".*?></textarea>', html, re.S)
    return box


@pytest.mark.django_db
def test_a_site_sets_the_message_boxs_placeholder(rf, client, user, tmp_path, settings):
    """A new user's trial: the box's "Ask a question about the documents…" could not be
    changed. The tag's ``placeholder`` sets it, escaped (a variable's text too); ``""`` leaves
    none; the chat page takes it from a site template that extends the app's (docs/widget.md)."""
    request = rf.get("/help/")
    request.user = user
    request.session = SessionStore()
    assert 'placeholder="Ask a question about the documents…"' in message_box(render_tag(request))
    assert 'placeholder="Ask about an order…"' in message_box(render_tag(request, 'placeholder="Ask about an order…"'))
    assert "placeholder" not in message_box(render_tag(request, 'placeholder=""'))
    hint = '"><script>alert(1)</script> & <b>more</b>'
    untrusted = engines["django"].from_string("{% load ragchat %}{% ragchat_widget placeholder=hint %}").render(
        {"hint": hint}, request)
    assert f'placeholder="{escape(hint)}"' in message_box(untrusted)
    assert "<script>alert" not in untrusted and "<b>more" not in untrusted
    # The chat page: a site's own django_ragchat/chat.html, as docs/widget.md writes it.
    (tmp_path / "django_ragchat").mkdir()
    (tmp_path / "django_ragchat" / "chat.html").write_text(
        '{% extends "django_ragchat/chat.html" %}{% load ragchat %}\n'
        '{% block content %}{% ragchat_widget model_notice=model_notice placeholder="Ask the help desk…" %}'
        "{% endblock %}\n")
    settings.TEMPLATES = [{**settings.TEMPLATES[0], "DIRS": [tmp_path]}]
    client.force_login(user)
    page = client.get("/chat/").content.decode()
    assert 'placeholder="Ask the help desk…"' in message_box(page) and "Sign out" in page


@pytest.mark.django_db
def test_an_anonymous_visitor_on_the_chat_page_is_shown_where_to_sign_in(client, user, ragchat_settings_override):
    """A garage's trial: with anonymous chat on, the chat page gave a customer who has an account
    no way to sign in (their own bookings answer only then); a signed-in user has "Sign out"."""
    ragchat_settings_override(ALLOW_ANONYMOUS=True)
    page = client.get("/chat/?x=1").content.decode()
    assert f'<a href="{resolve_url(django_settings.LOGIN_URL)}?next=%2Fchat%2F%3Fx%3D1">Sign in</a>' in page
    client.force_login(user)
    page = client.get("/chat/").content.decode()
    assert "Sign out" in page and ">Sign in</a>" not in page


def test_the_tag_says_what_is_missing_without_the_request():
    with pytest.raises(ImproperlyConfigured, match="context_processors.request"):
        Template("{% load ragchat %}{% ragchat_widget %}").render(Context({}))


@pytest.mark.django_db
def test_the_chat_page_is_the_widget(client, user):
    client.force_login(user)
    response = client.get("/chat/")
    assert response.status_code == 200
    html = response.content.decode()
    widget_config(html)
    assert "<title>Chat</title>" in html


def test_the_chat_page_answers_head_and_refuses_other_methods(client, user):
    client.force_login(user)
    head = client.head("/chat/")
    assert head.status_code == 200 and head["Content-Type"].startswith("text/html")
    assert client.post("/chat/").status_code == 405


@pytest.mark.django_db
@pytest.mark.parametrize("next_url, lands", [("/api/ragchat/docs/?tab=2", "/api/ragchat/docs/?tab=2"),
                                             ("https://evil.example/", "/chat/"), ("", "/chat/")])
def test_the_chat_sign_in_page_sends_the_visitor_back_where_they_came_from(client, user, next_url, lands):
    """``LOGIN_URL = "ragchat:login"`` serves every ``@login_required`` page of the site: the form
    carries ``?next=`` to the POST, and only a URL of this site is followed."""
    user.set_password("a long secret")
    user.save()
    page = client.get("/chat/login/", {"next": next_url} if next_url else {}).content.decode()
    carried = next_url if next_url.startswith("/") else ""
    assert f'<input type="hidden" name="next" value="{escape(carried)}">' in page
    response = client.post("/chat/login/", {"username": user.username, "password": "a long secret",
                                            "next": next_url})
    assert response.status_code == 302 and response["Location"] == lands


def test_the_example_projects_pages_use_the_tag():
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "example_project" / "templates" / "example"
    assert "{% ragchat_widget" in (root / "embed.html").read_text()


# --- server-sent events: a new conversation --------------------------------------------------


@pytest.fixture(params=["wsgi", "asgi"])
def server(request):
    return request.getfixturevalue(request.param)


def post_new(server, caller, body, timeout: float = 20.0):
    with httpx.Client(cookies=caller.cookies, timeout=timeout) as client:
        with client.stream("POST", f"{server.url}/chat/stream/", json=body, headers=sse_headers(caller)) as response:
            if response.headers.get("content-type", "").startswith("text/event-stream"):
                return response, parse_sse(response.iter_lines())
            response.read()
            return response, []


@pytest.mark.django_db(transaction=True)
def test_a_first_message_over_sse_creates_its_conversation_once_accepted(server, product_corpus, user):
    caller = caller_for(user)
    response, events = post_new(server, caller, {"content": QUESTION})
    assert response.status_code == 200, response.text
    ack, done = events[0], events[-1]
    assert ack["type"] == "ack" and done["type"] == "done"
    conversation = Conversation.objects.get()
    assert str(conversation.pk) == ack["conversation_id"] == done["message"]["conversation_id"]
    assert conversation.owner == user
    assert list(conversation.messages.values_list("role", "status")) == [("user", "complete"), ("assistant", "complete")]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("body", "status", "code"), [
    ({"content": "   "}, 400, "empty"),
    ({"content": 42}, 400, "invalid_type"),
    ({"content": "x" * (ragchat_settings.MAX_MESSAGE_CHARS + 1)}, 413, "too_long"),
])
def test_a_refused_first_message_over_sse_creates_nothing(server, user, body, status, code, settings):
    caller = caller_for(user)
    response, events = post_new(server, caller, body)
    assert (response.status_code, response.json()["code"]) == (status, code)
    assert not Conversation.objects.exists() and not Message.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_first_message_refused_over_a_limit_leaves_no_conversation(server, user, product_corpus, openai_server):
    """Refused after validation (no stream slot left): the conversation made for it goes too."""
    openai_server.token_delay = 0.2
    openai_server.when("", " ".join(f"word{i}" for i in range(100)))
    caller = caller_for(user)
    busy = [Conversation.objects.create(owner=user, profile="fake") for _ in range(3)]  # MAX_CONCURRENT_STREAMS
    clients, streams = [], []
    try:
        for conversation in busy:
            client = httpx.Client(cookies=caller.cookies, timeout=20)
            clients.append(client)
            stream = client.stream("POST", f"{server.url}/chat/conversations/{conversation.pk}/stream/",
                                   json={"content": QUESTION}, headers=sse_headers(caller))
            response = stream.__enter__()
            streams.append((stream, response.iter_lines()))
            assert next(streams[-1][1]) == "event: ack"
        response, _ = post_new(server, caller, {"content": QUESTION})
        assert response.status_code == 429 and response.json()["code"] == "too_many_streams"
        assert set(Conversation.objects.values_list("pk", flat=True)) == {c.pk for c in busy}
    finally:
        for stream, _ in streams:
            stream.__exit__(None, None, None)
        for client in clients:
            client.close()
    wait_for(lambda: not Message.objects.filter(status="streaming").exists())


@pytest.mark.django_db(transaction=True)
def test_an_anonymous_first_message_over_sse_is_bound_to_the_session(asgi, product_corpus):
    caller = anonymous_caller()
    response, events = post_new(asgi, caller, {"content": QUESTION})
    assert response.status_code == 200, response.text
    conversation = Conversation.objects.get(pk=events[0]["conversation_id"])
    assert conversation.owner is None and conversation.session_key == caller.sessionid


# --- feedback of one conversation ------------------------------------------------------------


@pytest.mark.django_db
def test_the_feedback_list_filters_by_conversation(client, user, other_user):
    mine = [Conversation.objects.create(owner=user) for _ in range(2)]
    theirs = Conversation.objects.create(owner=other_user)
    for conversation, owner in ((mine[0], user), (mine[1], user), (theirs, other_user)):
        message = Message.objects.create(conversation=conversation, seq=1, role="assistant", content="a",
                                         status="complete")
        Feedback.objects.create(message=message, user=owner, rating="up")
    client.force_login(user)
    listed = client.get("/api/ragchat/feedback/", {"conversation": str(mine[0].pk)}).json()["results"]
    assert [f["message_id"] for f in listed] == [mine[0].messages.get().pk]
    assert client.get("/api/ragchat/feedback/", {"conversation": str(theirs.pk)}).json()["results"] == []
    response = client.get("/api/ragchat/feedback/", {"conversation": "not-a-uuid"})
    assert response.status_code == 400 and "conversation" in json.dumps(response.json())
    assert len(client.get("/api/ragchat/feedback/").json()["results"]) == 2



@pytest.mark.django_db
@pytest.mark.parametrize(("setting", "anonymous", "signed_in"), [
    ("signed_out", True, False), (True, True, True), (False, False, False)])
def test_cited_sources_only_follows_the_setting_and_who_is_asking(rf, user, ragchat_settings_override,
                                                                  setting, anonymous, signed_in):
    from django.contrib.auth.models import AnonymousUser

    from django_ragchat.conf import DEFAULTS

    assert DEFAULTS["CITED_SOURCES_ONLY"] == "signed_out"  # on by default for signed-out pages
    ragchat_settings_override(CITED_SOURCES_ONLY=setting, ALLOW_ANONYMOUS=True)
    shown = {}
    for who, caller in (("anonymous", AnonymousUser()), ("signed_in", user)):
        request = rf.get("/products/")
        request.user = caller
        request.session = SessionStore()
        shown[who] = widget_config(render_tag(request))["citedSourcesOnly"]
    assert shown == {"anonymous": anonymous, "signed_in": signed_in}
