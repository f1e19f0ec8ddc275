"""Who may call what: every endpoint for every kind of caller, through the real stack.

The expected statuses are read from the permission tables in docs/api.md, so the documented
matrix and the tested one cannot drift apart; ``test_the_documented_matrix_covers_every_endpoint``
checks the tables are complete. Wherever a 404 is expected, the body must equal the body for
an id that does not exist at all: a foreign id cannot be told from an unknown one.
"""

from __future__ import annotations

import importlib
import itertools
import json
import re
from pathlib import Path

import pytest
from django.conf import settings
from django.core.cache import cache
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from django_ragchat.models import Conversation, Document, Feedback, MemoryRecord, Message, ToolInvocation

pytestmark = pytest.mark.django_db

API = "/api/ragchat"
DOCS = Path(__file__).resolve().parent.parent / "docs" / "api.md"
UNKNOWN = {"C": "0b3f2a47-0000-4000-8000-000000000000", "A": "987654", "M": "987654", "D": "987654",
           "T": "0b3f2a47-0000-4000-8000-000000000001", "P": "987654", "W": "0b3f2a47-0000-4000-8000-000000000002"}


def read_matrix(heading: str) -> tuple[list[str], dict[str, list[int]]]:
    """The table under ``heading`` in docs/api.md: its caller columns and, per endpoint, the
    statuses in column order."""
    lines = DOCS.read_text().split(f"\n{heading}\n", 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = list(itertools.takewhile(lambda line: line.startswith("|"), lines[start:]))
    header = [cell.strip() for cell in rows[0].strip("|").split("|")]
    table = {}
    for row in rows[2:]:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        table[cells[0].strip("`")] = [int(re.match(r"\d+", cell).group()) for cell in cells[1:]]
    return header[1:], table


SIGNED_IN_COLUMNS, SIGNED_IN_MATRIX = read_matrix("### Signed-in users' objects")
ANONYMOUS_COLUMNS, ANONYMOUS_MATRIX = read_matrix("### Anonymous conversations")


@pytest.fixture(autouse=True)
def _clear_limits():
    cache.clear()
    yield
    cache.clear()


def session_client(session_key: str | None = None) -> APIClient:
    """A client carrying a (new, or the given) anonymous session."""
    client = APIClient()
    if session_key is None:
        store = importlib.import_module(settings.SESSION_ENGINE).SessionStore()
        store.create()
        session_key = store.session_key
    client.cookies[settings.SESSION_COOKIE_NAME] = session_key
    return client


def signed_in(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def conversation_with_answer(**owner) -> tuple[Conversation, Message]:
    conversation = Conversation.objects.create(last_seq=2, **owner)
    Message.objects.create(conversation=conversation, seq=1, role="user", content="Hello?")
    answer = Message.objects.create(conversation=conversation, seq=2, role="assistant", content="Hi.")
    return conversation, answer


@pytest.fixture
def world(user, other_user, reviewer, django_user_model, ragchat_settings_override):
    """alice's conversation C with answer A (rated by alice and by the reviewer), alice's memory
    record M, a document D, a queued upload's task T (on the database task backend), a tool
    call P awaiting alice's approval in an answer being written in another of her
    conversations W, and an anonymous session's conversation with the same."""
    from django_ragchat import tasks

    ragchat_settings_override(TASK_BACKEND="database")
    queued = tasks.enqueue(tasks.ingest_upload, "upload/t.md", "# T\n\nText.", "", "markdown", None)
    conversation, answer = conversation_with_answer(owner=user)
    Feedback.objects.create(message=answer, user=user, rating="up")
    Feedback.objects.create(message=answer, user=reviewer, rating="down")
    clerk = django_user_model.objects.create_user("clerk", password="pw", is_staff=True)  # staff, no permission
    memory = MemoryRecord.objects.create(user=user, kind="fact", content="Likes tablets.")
    document = Document.objects.create(source="kb/a.md", title="A", checksum="0" * 64)
    writing = Conversation.objects.create(owner=user, last_seq=2)
    Message.objects.create(conversation=writing, seq=1, role="user", content="Cancel ORD-18.")
    streaming = Message.objects.create(conversation=writing, seq=2, role="assistant", status="streaming")
    pending = ToolInvocation.objects.create(message=streaming, call_id="c1", name="cancel_order",
                                            arguments='{"order_number": "ORD-18"}', requires_confirmation=True)

    visitor = session_client()
    session_key = visitor.cookies[settings.SESSION_COOKIE_NAME].value
    anon_conversation, anon_answer = conversation_with_answer(session_key=session_key)
    anon_memory = MemoryRecord.objects.create(conversation=anon_conversation, kind="summary", content="Greeted.")
    return {
        "ids": {"C": conversation.pk, "A": answer.pk, "M": memory.pk, "D": document.pk, "T": queued.id,
                "P": pending.pk, "W": writing.pk},
        "anonymous_ids": {"C": anon_conversation.pk, "A": anon_answer.pk, "M": anon_memory.pk},
        "clients": {
            "owner": signed_in(user), "other user": signed_in(other_user), "reviewer": signed_in(reviewer),
            "staff": signed_in(clerk),
            "anonymous (off)": session_client(), "anonymous (on)": session_client(),
            "its session": visitor, "another session": session_client(), "signed-in user": signed_in(other_user),
        },
    }


def call(client: APIClient, endpoint: str, ids: dict):
    """Make the request ``endpoint`` ("METHOD path" with {C}, {A}, {M}, {D} placeholders)."""
    method, path = endpoint.split(" ", 1)
    url = f"{API}/" + re.sub(r"\{(\w)\}", lambda m: str(ids[m.group(1)]), path)
    if method == "GET":
        return client.get(url)
    if method == "DELETE":
        return client.delete(url)
    if endpoint == "POST documents/":
        return client.post(url, {"file": SimpleUploadedFile("new.md", b"# New\n\nText.")}, format="multipart")
    body = {
        "POST conversations/": {"title": "New"},
        "PATCH conversations/{C}/": {"title": "Renamed"},
        "POST conversations/{C}/messages/": {"content": "What is new?"},
        "POST messages/{A}/feedback/": {"rating": "down", "comment": "Too short."},
        "PATCH memory/{M}/": {"content": "Likes phones."},
        "POST tool-calls/{P}/decision/": {"approve": False},
        "POST conversations/{W}/cancel/": {},
        "POST conversations/{C}/cancel/": {},
    }[endpoint]
    return getattr(client, method.lower())(url, json.dumps(body), content_type="application/json")


def check(world, client, endpoint, ids, expected):
    response = call(client, endpoint, ids)
    assert response.status_code == expected, (endpoint, response.content)
    if expected == 404:
        # The same answer as for an id that was never there.
        unknown = call(client, endpoint, {**ids, **UNKNOWN})
        assert (unknown.status_code, unknown.content) == (404, response.content)
    if expected >= 400:
        assert set(response.json()) == {"code", "detail"}


@pytest.mark.parametrize("endpoint", SIGNED_IN_MATRIX)
@pytest.mark.parametrize("actor", SIGNED_IN_COLUMNS)
def test_signed_in_users_objects(world, ragchat_settings_override, actor, endpoint):
    ragchat_settings_override(ALLOW_ANONYMOUS=actor != "anonymous (off)")
    expected = SIGNED_IN_MATRIX[endpoint][SIGNED_IN_COLUMNS.index(actor)]
    check(world, world["clients"][actor], endpoint, world["ids"], expected)


@pytest.mark.parametrize("endpoint", ANONYMOUS_MATRIX)
@pytest.mark.parametrize("actor", ANONYMOUS_COLUMNS)
def test_anonymous_conversations(world, ragchat_settings_override, actor, endpoint):
    ragchat_settings_override(ALLOW_ANONYMOUS=True)
    expected = ANONYMOUS_MATRIX[endpoint][ANONYMOUS_COLUMNS.index(actor)]
    check(world, world["clients"][actor], endpoint, world["anonymous_ids"], expected)


def test_anonymous_conversations_are_closed_when_anonymous_use_is_off(world):
    for endpoint in ANONYMOUS_MATRIX:
        response = call(world["clients"]["its session"], endpoint, world["anonymous_ids"])
        assert response.status_code == 403 and response.json()["code"] == "not_authenticated"


# What each caller finds in the lists: (C in conversations/, M in memory/, alice's feedback in feedback/).
LISTED = {
    "owner": (True, True, True),
    "other user": (False, False, False),
    "reviewer": (False, True, True),  # reviewers open anyone's conversation by id; their list is their own
    "staff": (False, False, False),  # being staff alone reads nobody else's chats
    "anonymous (on)": (False, False, False),
}


@pytest.mark.parametrize("actor", LISTED)
def test_lists_show_only_what_the_caller_may_see(world, ragchat_settings_override, user, actor):
    ragchat_settings_override(ALLOW_ANONYMOUS=True)
    client = world["clients"][actor]
    ids = world["ids"]
    conversations = {c["id"] for c in client.get(f"{API}/conversations/").json()["results"]}
    memory = {m["id"] for m in client.get(f"{API}/memory/").json()["results"]}
    feedback = {f["id"] for f in client.get(f"{API}/feedback/").json()["results"]}
    alices_feedback = Feedback.objects.get(user=user).pk
    assert (str(ids["C"]) in conversations, ids["M"] in memory, alices_feedback in feedback) == LISTED[actor]
    if actor != "reviewer":
        anonymous = world["anonymous_ids"]
        assert str(anonymous["C"]) not in conversations and anonymous["M"] not in memory


def test_the_documented_matrix_covers_every_endpoint():
    from django_ragchat.api.urls import urlpatterns

    routes = {str(p.pattern) for p in urlpatterns} - {"docs/", "redoc/"}
    documented = {re.sub(r"\{\w\}", "<>", e.split(" ", 1)[1]) for e in SIGNED_IN_MATRIX}
    assert {re.sub(r"<[^>]+>", "<>", r) for r in routes} == documented
    assert SIGNED_IN_COLUMNS == ["owner", "other user", "reviewer", "staff", "anonymous (off)", "anonymous (on)"]
    assert ANONYMOUS_COLUMNS == ["its session", "another session", "signed-in user", "reviewer", "staff"]


DOCUMENT_ENDPOINTS = ["POST documents/", "GET documents/tasks/{T}/", "DELETE documents/{D}/"]


@pytest.mark.parametrize("rule, permissions, allowed", [
    (None, [], False),  # staff alone: the admin would refuse them too
    (None, ["add_document"], False),  # both are needed
    (None, ["add_document", "delete_document"], True),  # what ragchat_admin_group --documents grants
    (None, ["superuser"], True),
    ("django_ragchat.permissions.is_staff", [], True),  # the old rule, for a site that wants it
], ids=["staff", "add only", "add and delete", "superuser", "is_staff rule"])
def test_documents_are_managed_with_the_admins_permissions(world, ragchat_settings_override, django_user_model,
                                                           rule, permissions, allowed):
    """Uploading, following a queued upload and deleting documents take staff with
    ``django_ragchat.add_document`` and ``delete_document``, as the admin asks (the default
    ``DOCUMENT_PERMISSION``, ``may_manage_documents``); ``is_staff`` lets every member of staff."""
    from django.contrib.auth.models import Permission

    if rule:
        ragchat_settings_override(DOCUMENT_PERMISSION=rule)
    clerk = django_user_model.objects.get(username="clerk")  # the world's staff, with no permission
    if permissions == ["superuser"]:
        clerk.is_superuser = True
        clerk.save()
    else:
        clerk.user_permissions.add(*Permission.objects.filter(content_type__app_label="django_ragchat",
                                                              codename__in=permissions))
    client = signed_in(clerk)
    answers = [call(client, endpoint, world["ids"]) for endpoint in DOCUMENT_ENDPOINTS]
    if allowed:
        assert [r.status_code for r in answers] == [201, 200, 204], [r.content for r in answers]
        assert not Document.objects.filter(pk=world["ids"]["D"]).exists()
    else:
        for endpoint, response in zip(DOCUMENT_ENDPOINTS, answers, strict=True):
            assert (response.status_code, response.json()) == (
                403, {"code": "permission_denied", "detail": "You may not add or delete documents."}), endpoint
        assert list(Document.objects.values_list("pk", flat=True)) == [world["ids"]["D"]]


def anyone_signed_in(user) -> bool:
    return user.is_authenticated


def test_the_rules_are_swappable(world, ragchat_settings_override):
    ragchat_settings_override(CONVERSATION_CHANGE_PERMISSION="django_ragchat.permissions.is_owner_or_staff",
                              DOCUMENT_PERMISSION="tests.test_permissions_matrix.anyone_signed_in")
    reviewer, other = world["clients"]["reviewer"], world["clients"]["other user"]
    assert call(reviewer, "PATCH conversations/{C}/", world["ids"]).status_code == 200
    assert call(other, "POST documents/", world["ids"]).status_code == 201
    # Reading is its own rule: still closed to the other user.
    assert call(other, "GET conversations/{C}/", world["ids"]).status_code == 404


@pytest.mark.parametrize("key", ["CONVERSATION_CHANGE_PERMISSION", "DOCUMENT_PERMISSION"])
def test_a_rule_that_cannot_be_imported_is_a_system_check_error(ragchat_settings_override, key):
    from django_ragchat import checks

    ragchat_settings_override(**{key: "nowhere.callable"})
    errors = [e for e in checks.check_settings() if e.id == "ragchat.E006"]
    assert len(errors) == 1 and key in errors[0].msg
