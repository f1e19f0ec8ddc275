"""No user reads another's rows through the assistant (issue 23).

Two users and a member of staff; private rows (one of each user, one for staff only), each
holding a unique word and a secret. Every private word is asked by every other user over the REST
API, the websocket and server-sent events (real uvicorn), with a profile that runs the built-in
retrievers, two plugin retrievers (one reading the ORM with no regard for access, one built on
``django_ragchat.search`` without naming its reader) and query expansion whose variants match
every secret. Zero chunks, sources, trace entries or answer text of another's rows, and the
documents API never lists them. Control: each asker does find their own row the same way, so a
retrieval that found nothing at all could not pass.
"""

from __future__ import annotations

import json

import pytest

from django_ragchat.models import Chunk, Conversation, Document, TurnTrace
from tests.live_servers import caller_for, open_socket, post_stream, read_turn, send
from tests.settings import ISOLATION_PROFILE
from tests.sources_app.models import Article

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROWS = {
    # owner -> (word, secret)
    "alice": ("Zanzibarite", "The Zanzibarite locker code is ALC-4471."),
    "bob": ("Quokkafluff", "The Quokkafluff locker code is BOB-8823."),
    "staff": ("Marzipanix", "The Marzipanix door code is STF-5150."),
}


@pytest.fixture
def private_rows(ragchat_settings_override, user, other_user, staff_user):
    """The rows, synced live by the tests' article source, and the ids of each one's chunks."""
    ragchat_settings_override(PLUGINS=["tests.sources_plugin", "tests.isolation_plugin"],
                              PROFILES={"default": {}, "isolation": ISOLATION_PROFILE})
    people = {"alice": user, "bob": other_user, "staff": staff_user}
    rows = {}
    for name, (word, secret) in ROWS.items():
        access = {"staff_only": True} if name == "staff" else {"owner": people[name]}
        article = Article.objects.create(title=word, body=secret, **access)
        chunks = set(Chunk.objects.filter(document__origin="articles", document__object_pk=str(article.pk))
                     .values_list("pk", flat=True))
        assert chunks, name
        rows[name] = (word, secret, chunks, f"articles:{article.pk}")
    Article.objects.create(title="Gingerwhale", body="The Gingerwhale festival starts in June.")
    return people, rows


def question(word: str) -> str:
    return f"What is the {word} code?"


def check(turn_output: str, trace: dict, chunk_ids: set[int], rows, asker: str) -> None:
    """Nothing of another's row in what the asker got (``turn_output``: every event or response
    body, as text) nor in the saved trace (the admin's trace view reads it)."""
    trace_text = json.dumps(trace)
    for owner, (_word, secret, chunks, source) in rows.items():
        if owner == asker:
            continue
        assert not chunks & chunk_ids, (asker, owner)
        for text in (turn_output, trace_text):
            assert secret.split()[-1].rstrip(".") not in text, (asker, owner)
            assert source not in text, (asker, owner)


def trace_chunk_ids(trace: dict) -> set[int]:
    ids = {h["chunk_id"] for r in trace.get("retrieval", []) for h in r.get("hits", [])}
    return ids | {d["chunk_id"] for d in trace.get("documents", [])}


def last_trace(conversation) -> dict:
    return TurnTrace.objects.filter(message__conversation=conversation).order_by("-pk").values_list(
        "data", flat=True).first()


def test_over_the_rest_api(private_rows, client):
    people, rows = private_rows
    for asker, user in people.items():
        client.force_login(user)
        conversation = Conversation.objects.create(owner=user, profile="isolation")
        url = f"/api/ragchat/conversations/{conversation.pk}/messages/"
        for owner, (word, secret, chunks, _) in rows.items():
            response = client.post(url, {"content": question(word)}, content_type="application/json")
            assert response.status_code == 201, response.content
            body = response.json()
            found = {s["chunk_id"] for s in body["assistant_message"]["sources"]}
            trace = last_trace(conversation)
            if owner == asker:  # control: the asker's own row is found by the same turn
                assert found & chunks and secret.split()[-1].rstrip(".") in body["assistant_message"]["content"]
                continue
            listing = client.get(url).content.decode()
            check(response.content.decode() + listing, trace, found | trace_chunk_ids(trace), rows, asker)
            # The plugin retriever that ignores access did find the row: the turn dropped it.
            assert any("dropped" in w for w in trace.get("warnings", [])), trace.get("warnings")
        documents = client.get("/api/ragchat/documents/?limit=100").content.decode()
        check(documents, {}, set(), rows, asker)


def test_over_the_websocket(private_rows, asgi):
    people, rows = private_rows
    for asker, user in people.items():
        conversation = Conversation.objects.create(owner=user, profile="isolation")
        ws = open_socket(asgi, caller_for(user))
        try:
            for owner, (word, _secret, chunks, _) in rows.items():
                send(ws, type="message", content=question(word), conversation_id=str(conversation.pk))
                frames = read_turn(ws)
                assert frames[-1]["type"] == "done", frames[-1]
                found = {s["chunk_id"] for f in frames for s in f.get("sources", []) + f.get("message", {}).get(
                    "sources", [])}
                if owner == asker:
                    assert found & chunks
                    continue
                trace = last_trace(conversation)
                check(json.dumps(frames), trace, found | trace_chunk_ids(trace), rows, asker)
        finally:
            ws.close()


def test_over_server_sent_events(private_rows, asgi):
    people, rows = private_rows
    for asker, user in people.items():
        conversation = Conversation.objects.create(owner=user, profile="isolation")
        caller = caller_for(user)
        for owner, (word, _secret, chunks, _) in rows.items():
            response, events = post_stream(asgi, caller, conversation.pk, question(word))
            assert response.status_code == 200 and events[-1]["type"] == "done", events
            found = {s["chunk_id"] for e in events for s in e.get("sources", []) + e.get("message", {}).get(
                "sources", [])}
            if owner == asker:
                assert found & chunks
                continue
            trace = last_trace(conversation)
            check(json.dumps(events), trace, found | trace_chunk_ids(trace), rows, asker)


def test_anonymous_visitors_read_public_rows_only(private_rows, ragchat_settings_override):
    from django_ragchat.turn.pipeline import run_turn_sync

    _, rows = private_rows
    for word, _, _, _ in rows.values():
        conversation = Conversation.objects.create(session_key="visitor", profile="isolation")
        result = run_turn_sync(conversation, question(word))
        check(json.dumps(result.message), result.trace, trace_chunk_ids(result.trace), rows, asker="")
    result = run_turn_sync(Conversation.objects.create(session_key="visitor", profile="isolation"),
                           "When does the Gingerwhale festival start?")
    assert "June" in result.answer
    assert Document.objects.count() == 4
