"""Bad input never reaches a 500: nested JSON, query parameters, NUL characters; the same code
for the same cause on every transport."""

from __future__ import annotations

import base64
import json

import pytest

from django_ragchat.models import Conversation, Feedback, Message
from django_ragchat.transport import jsonbody
from tests.live_servers import caller_for, open_socket, receive, send

NESTED = "[" * 5_000 + "]" * 5_000  # past the parser's recursion limit, under the size limits
JUST_TOO_DEEP = '{"content": ' + "[" * 40 + "]" * 40 + "}"


@pytest.fixture
def signed_in(client, user):
    client.force_login(user)
    return client


def test_loads_refuses_depth_and_recursion():
    assert jsonbody.loads('{"a": [1, {"b": 2}]}') == {"a": [1, {"b": 2}]}
    assert jsonbody.loads("[" * 32 + "]" * 32) is not None
    for text in (NESTED, "[" * 33 + "]" * 33, "{", b"\xff"):
        with pytest.raises(jsonbody.JSONRefused):
            jsonbody.loads(text)


WRITE_ENDPOINTS = [
    ("post", "/api/ragchat/conversations/"),
    ("patch", "/api/ragchat/conversations/{c}/"),
    ("post", "/api/ragchat/conversations/{c}/messages/"),
    ("post", "/api/ragchat/messages/{a}/feedback/"),
    ("put", "/api/ragchat/messages/{a}/feedback/"),
    ("patch", "/api/ragchat/memory/{m}/"),
]


@pytest.mark.parametrize("body", [NESTED, JUST_TOO_DEEP])
@pytest.mark.parametrize(("method", "path"), WRITE_ENDPOINTS)
def test_nested_json_is_a_parse_error_on_every_json_endpoint(signed_in, user, method, path, body):
    from django_ragchat.models import MemoryRecord

    conversation = Conversation.objects.create(owner=user)
    Message.objects.create(conversation=conversation, seq=1, role="user", content="Hi")
    answer = Message.objects.create(conversation=conversation, seq=2, role="assistant", content="Hello",
                                    status=Message.Status.COMPLETE)
    memory = MemoryRecord.objects.create(user=user, kind="fact", content="likes tea")
    url = path.format(c=conversation.pk, a=answer.pk, m=memory.pk)
    response = getattr(signed_in, method)(url, data=body, content_type="application/json")
    assert response.status_code == 400, response.content
    assert response.json()["code"] == "parse_error"
    assert Message.objects.filter(conversation=conversation).count() == 2


def test_nested_json_on_the_sse_endpoint_is_a_parse_error(signed_in, user):
    conversation = Conversation.objects.create(owner=user)
    response = signed_in.post(f"/chat/conversations/{conversation.pk}/stream/", data=NESTED,
                              content_type="application/json")
    assert response.status_code == 400
    assert json.loads(response.content)["code"] == "parse_error"


def test_nested_json_on_the_websocket_is_a_parse_error_and_the_socket_stays(asgi, user):
    with open_socket(asgi, caller_for(user)) as ws:
        ws.send(JUST_TOO_DEEP.replace('{"content"', '{"type": "message", "content"'))
        assert receive(ws)["code"] == "parse_error"
        ws.send(NESTED)
        assert receive(ws)["code"] == "parse_error"
        send(ws, type="ping")
        assert receive(ws)["type"] == "pong"
    assert not Conversation.objects.exists()


@pytest.mark.parametrize("query", [
    "limit=-1", "limit=0", "limit=1.5", "limit=null", "limit=%00", "limit=abc", "limit=99999999999",
    "offset=-1", "offset=2.0", "offset=%00", "offset=99999999999999999999",
])
def test_pagination_parameters_are_validated(signed_in, query):
    response = signed_in.get(f"/api/ragchat/conversations/?{query}")
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "invalid"
    assert set(body["errors"]) == {query.split("=")[0]}


def test_a_limit_above_the_maximum_is_clamped(signed_in):
    assert signed_in.get("/api/ragchat/conversations/?limit=100000").status_code == 400
    assert signed_in.get("/api/ragchat/conversations/?limit=100").status_code == 200


@pytest.mark.parametrize("query", ["rating=%00", "rating=sideways", "rating="])
def test_feedback_rating_filter_is_validated(signed_in, query):
    response = signed_in.get(f"/api/ragchat/feedback/?{query}")
    assert response.status_code == 400
    assert set(response.json()["errors"]) == {"rating"}


def test_feedback_rating_filter_filters(signed_in, user):
    conversation = Conversation.objects.create(owner=user)
    answer = Message.objects.create(conversation=conversation, seq=1, role="assistant", content="A",
                                    status=Message.Status.COMPLETE)
    Feedback.objects.create(message=answer, user=user, rating="up")
    assert len(signed_in.get("/api/ragchat/feedback/?rating=up").json()["results"]) == 1
    assert len(signed_in.get("/api/ragchat/feedback/?rating=down").json()["results"]) == 0


@pytest.mark.parametrize("after", ["%00", "-1", "1e3", "99999999999999"])
def test_after_is_validated(signed_in, user, after):
    conversation = Conversation.objects.create(owner=user)
    response = signed_in.get(f"/api/ragchat/conversations/{conversation.pk}/messages/?after={after}")
    assert response.status_code == 400
    assert set(response.json()["errors"]) == {"after"}


def test_an_empty_body_is_a_parse_error_on_rest_and_sse_alike(signed_in, user):
    conversation = Conversation.objects.create(owner=user)
    rest = signed_in.post(f"/api/ragchat/conversations/{conversation.pk}/messages/", data="",
                          content_type="application/json")
    sse = signed_in.post(f"/chat/conversations/{conversation.pk}/stream/", data="",
                         content_type="application/json")
    assert (rest.status_code, rest.json()["code"]) == (400, "parse_error")
    assert (sse.status_code, json.loads(sse.content)["code"]) == (400, "parse_error")
    assert not Message.objects.exists()


def test_patch_without_a_title_changes_nothing(signed_in, user):
    conversation = Conversation.objects.create(owner=user, title="Kept")
    response = signed_in.patch(f"/api/ragchat/conversations/{conversation.pk}/", data={},
                               content_type="application/json")
    assert response.status_code == 200
    assert response.json()["title"] == "Kept"


@pytest.mark.parametrize("title", ["a\x00b", "\ud800"])
def test_nul_and_surrogates_in_text_are_refused(signed_in, title):
    response = signed_in.post("/api/ragchat/conversations/", data=json.dumps({"title": title}),
                              content_type="application/json")
    assert response.status_code == 400
    assert not Conversation.objects.exists()


def test_sse_refuses_an_anonymous_caller_as_the_api_does(client, user, ragchat_settings_override):
    ragchat_settings_override(ALLOW_ANONYMOUS=False)
    conversation = Conversation.objects.create(owner=user)
    sse = client.post(f"/chat/conversations/{conversation.pk}/stream/", data='{"content": "Hi"}',
                      content_type="application/json")
    rest = client.post(f"/api/ragchat/conversations/{conversation.pk}/messages/", data='{"content": "Hi"}',
                       content_type="application/json")
    assert (sse.status_code, json.loads(sse.content)["code"]) == (rest.status_code, rest.json()["code"]) \
        == (403, "not_authenticated")


def test_wrong_basic_credentials_are_authentication_failed(client, user):
    # DRF's default authentication classes list SessionAuthentication first, which sends no
    # WWW-Authenticate challenge, so DRF answers 403 rather than 401 (docs/api.md says so).
    token = base64.b64encode(f"{user.username}:wrong".encode()).decode()
    response = client.get("/api/ragchat/conversations/", HTTP_AUTHORIZATION=f"Basic {token}")
    assert response.status_code == 403
    assert response.json()["code"] == "authentication_failed"
    assert "WWW-Authenticate" not in response.headers
    assert not Conversation.objects.exists()


# --- no body, too many fields, sizes (issue 22) -------------------------------------------------


def endpoint_objects(user):
    from django_ragchat.models import MemoryRecord

    conversation = Conversation.objects.create(owner=user, title="Kept")
    Message.objects.create(conversation=conversation, seq=1, role="user", content="Hi")
    answer = Message.objects.create(conversation=conversation, seq=2, role="assistant", content="Hello",
                                    status=Message.Status.COMPLETE)
    Conversation.objects.filter(pk=conversation.pk).update(last_seq=2)  # as a turn leaves it
    memory = MemoryRecord.objects.create(user=user, kind="fact", content="likes tea")
    return conversation, answer, memory


@pytest.mark.parametrize(("method", "path"), WRITE_ENDPOINTS)
def test_no_body_creates_and_changes_nothing(signed_in, user, method, path):
    conversation, answer, memory = endpoint_objects(user)
    before = (Conversation.objects.count(), Feedback.objects.count(), Message.objects.count())
    url = path.format(c=conversation.pk, a=answer.pk, m=memory.pk)
    response = getattr(signed_in, method)(url, data="", content_type="application/json")
    assert (response.status_code, response.json()["code"]) == (400, "parse_error"), response.content
    assert (Conversation.objects.count(), Feedback.objects.count(), Message.objects.count()) == before
    memory.refresh_from_db()
    conversation.refresh_from_db()
    assert memory.updated_at == memory.created_at or memory.content == "likes tea"
    assert conversation.title == "Kept"


@pytest.mark.parametrize(("method", "path"), WRITE_ENDPOINTS)
def test_more_fields_than_django_allows_is_too_many_fields(signed_in, user, method, path):
    conversation, answer, memory = endpoint_objects(user)
    body = {"content": "Hi", "rating": "up", "title": "New", **{f"unknown{i}": 1 for i in range(100_000)}}
    url = path.format(c=conversation.pk, a=answer.pk, m=memory.pk)
    response = getattr(signed_in, method)(url, data=json.dumps(body), content_type="application/json")
    assert (response.status_code, response.json()["code"]) == (400, "too_many_fields")
    assert Conversation.objects.count() == 1 and Message.objects.count() == 2 and not Feedback.objects.exists()


def test_too_many_fields_is_the_same_code_on_every_transport(signed_in, user, asgi_server, transactional_db):
    conversation = Conversation.objects.create(owner=user)
    body = json.dumps({"content": "Hi", **{f"k{i}": 0 for i in range(1_001)}})  # DATA_UPLOAD_MAX_NUMBER_FIELDS + 1
    sse = signed_in.post(f"/chat/conversations/{conversation.pk}/stream/", data=body, content_type="application/json")
    assert (sse.status_code, json.loads(sse.content)["code"]) == (400, "too_many_fields")
    with open_socket(asgi_server, caller_for(user)) as ws:
        ws.send(body)
        assert receive(ws)["code"] == "too_many_fields"
    assert not Message.objects.exists()


def test_memory_content_is_capped_in_the_api_and_the_admin(signed_in, user, admin_client):
    from django_ragchat.models import MEMORY_MAX_CHARS, MemoryRecord

    memory = MemoryRecord.objects.create(user=user, kind="fact", content="likes tea")
    too_long = "x" * (MEMORY_MAX_CHARS + 1)
    response = signed_in.patch(f"/api/ragchat/memory/{memory.pk}/", data=json.dumps({"content": too_long}),
                               content_type="application/json")
    assert (response.status_code, response.json()["code"]) == (400, "invalid")
    response = admin_client.post(f"/admin/django_ragchat/memoryrecord/{memory.pk}/change/", {
        "kind": "fact", "user": user.pk, "content": too_long, "metadata": "{}"})
    assert response.status_code == 200 and b"at most 20000 characters" in response.content
    memory.refresh_from_db()
    assert memory.content == "likes tea"


def test_too_many_fields_is_too_many_fields_on_the_openai_endpoint_too(client, user):
    from django_ragchat.models import ApiKey

    key = ApiKey.create_key(user)[1]
    # A client's long history: 2 keys a message, 501 messages (DATA_UPLOAD_MAX_NUMBER_FIELDS is 1,000).
    body = {"model": "default", "messages": [{"role": "user", "content": "Hi"}] * 501}
    response = client.post("/openai/v1/chat/completions", data=json.dumps(body), content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {key}")
    assert (response.status_code, response.json()["error"]["code"]) == (400, "too_many_fields")
    assert not Message.objects.exists()


def test_an_upload_nested_too_deeply_to_parse_is_invalid_document(client, uploader):
    from django.core.files.uploadedfile import SimpleUploadedFile

    from django_ragchat.models import Document

    client.force_login(uploader)
    response = client.post("/api/ragchat/documents/", {"file": SimpleUploadedFile("deep.html", b"<div>" * 100_000)})
    assert (response.status_code, response.json()["code"]) == (400, "invalid_document")
    assert not Document.objects.exists()


# --- an outside probe of a help desk on PostgreSQL under gunicorn (7 December) ------------------


def test_a_signed_out_caller_is_not_authenticated_before_any_csrf_check_on_every_transport(user,
                                                                                          ragchat_settings_override):
    """Without a CSRF cookie, a signed-out POST to the stream was ``csrf_failed`` while the REST
    API said ``not_authenticated``: the same caller, two codes."""
    from django.test import Client

    ragchat_settings_override(ALLOW_ANONYMOUS=False)
    conversation = Conversation.objects.create(owner=user)
    client = Client(enforce_csrf_checks=True)
    for url in (f"/chat/conversations/{conversation.pk}/stream/", "/chat/stream/",
                f"/api/ragchat/conversations/{conversation.pk}/messages/"):
        response = client.post(url, data='{"content": "Hi"}', content_type="application/json")
        assert (response.status_code, json.loads(response.content)["code"]) == (403, "not_authenticated"), url
    assert not Message.objects.exists()


FORM_BODIES = [
    ("multipart/form-data; boundary=b", b'--b\r\nContent-Disposition: form-data; name="content"\r\n\r\nHi\r\n--b--\r\n'),
    ("multipart/form-data", b"content=Hi"),  # no boundary: Django cannot parse it
    ("application/x-www-form-urlencoded", b"content=Hi"),
]


@pytest.mark.parametrize(("content_type", "body"), FORM_BODIES)
def test_a_form_body_with_the_csrf_token_is_415_on_every_transport(user, content_type, body):
    """A multipart body on the stream was a 500: the CSRF check read the form, and the view could
    no longer read the body; without a boundary, Django's HTML 400 page."""
    from django.test import Client

    conversation = Conversation.objects.create(owner=user)
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    client.cookies["csrftoken"] = secret = "a" * 32
    for url in (f"/chat/conversations/{conversation.pk}/stream/", "/chat/stream/",
                f"/api/ragchat/conversations/{conversation.pk}/messages/"):
        response = client.post(url, data=body, content_type=content_type, HTTP_X_CSRFTOKEN=secret)
        assert response["Content-Type"].startswith("application/json"), (url, response.content[:200])
        assert (response.status_code, json.loads(response.content)["code"]) == (415, "unsupported_media_type"), url
    assert not Message.objects.exists() and Conversation.objects.count() == 1


@pytest.mark.parametrize("content_type", ["", "application/vnd.api+json", "application/problem+json; charset=utf-8"])
def test_a_body_with_no_content_type_or_a_json_suffix_is_json_on_every_transport(signed_in, user, content_type):
    """docs/protocol.md: ``…+json`` or none declared is read as JSON, alike on REST and server-sent
    events; the REST API answered both 415."""
    conversation = Conversation.objects.create(owner=user)
    for url in ("/chat/stream/", f"/api/ragchat/conversations/{conversation.pk}/messages/"):
        response = signed_in.post(url, data='{"content": 42}', content_type=content_type)
        assert (response.status_code, json.loads(response.content)["code"]) == (400, "invalid_type"), url


@pytest.mark.parametrize("title", ["\u200b", "\u200b\u200d\ufeff", " \u2060 "])
def test_a_title_that_shows_nothing_is_no_title(signed_in, user, title):
    """A zero-width title made the conversation's entry in the list invisible."""
    created = signed_in.post("/api/ragchat/conversations/", data=json.dumps({"title": title}),
                             content_type="application/json")
    assert created.status_code == 201 and created.json()["title"] == "", created.content
    conversation = Conversation.objects.create(owner=user, title="Kept")
    renamed = signed_in.patch(f"/api/ragchat/conversations/{conversation.pk}/", data=json.dumps({"title": title}),
                              content_type="application/json")
    assert renamed.status_code == 200 and renamed.json()["title"] == ""


@pytest.mark.parametrize("path", ["docs/", "redoc/", "schema/"])
def test_options_on_the_api_documentation_pages(client, path):
    """``OPTIONS /api/ragchat/docs/`` was a 500 (DRF's metadata, rendered with a page's renderer)."""
    response = client.options(f"/api/ragchat/{path}")
    assert response.status_code == 200 and "GET" in response["Allow"]


def test_a_missing_csrf_token_is_csrf_failed_in_the_same_words_on_every_transport(user):
    """A council site's trial: the REST API answered a session write without its CSRF token 403
    ``permission_denied`` ("CSRF Failed: ...", DRF's words) where the server-sent events and
    OpenAI-compatible endpoints said ``csrf_failed``: one cause, two codes."""
    from django.test import Client

    conversation = Conversation.objects.create(owner=user)
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    answers = {}
    for url in (f"/chat/conversations/{conversation.pk}/stream/", "/chat/stream/",
                f"/api/ragchat/conversations/{conversation.pk}/messages/", "/api/ragchat/conversations/"):
        response = client.post(url, data='{"content": "Hi"}', content_type="application/json")
        body = json.loads(response.content)
        answers[url] = (response.status_code, body["code"], body.get("detail") or body.get("message"))
    assert {answer[:2] for answer in answers.values()} == {(403, "csrf_failed")}, answers
    assert len({answer[2] for answer in answers.values()}) == 1, answers
    assert not Message.objects.exists() and Conversation.objects.count() == 1
