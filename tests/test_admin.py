"""The admin as staff use it: transcripts with readable traces, read-only log, memory, documents,
one user's chat data, constant queries per list page, and untrusted text escaped everywhere."""

from __future__ import annotations

import inspect
import itertools
import json
import re
from datetime import timedelta
from urllib.parse import urlencode

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Group
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command
from django.db import connection
from django.db.models import Count
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape

from django_ragchat.admin import views as admin_views
from django_ragchat.admin.answerer_why import answerer_sentence
from django_ragchat.ingestion.pipeline import ingest_text
from django_ragchat.models import (
    ENDING_STAGES,
    ApiKey,
    Chunk,
    Conversation,
    Document,
    Feedback,
    MemoryRecord,
    Message,
    MessageSource,
    TurnTrace,
)
from django_ragchat.text import shorten
from django_ragchat.turn import pipeline
from django_ragchat.turn.pipeline import run_turn_sync

pytestmark = pytest.mark.django_db

XSS = '<img src=x onerror="alert(1)"><script>alert(2)</script>'
ESCAPED = "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;&lt;script&gt;alert(2)&lt;/script&gt;"


def url(name, *args):
    return reverse(f"admin:django_ragchat_{name}", args=args)


@pytest.fixture
def chatted(product_corpus, user):
    """A real two-turn conversation: the follow-up is rewritten and its answer cites a source."""
    conversation = Conversation.objects.create(owner=user)
    run_turn_sync(conversation, "Tell me about the Aurora X2 phone")
    result = run_turn_sync(conversation, "How much does it cost?")
    assert result.trace["queries"]["final"] != "How much does it cost?"  # the follow-up was rewritten
    assert MessageSource.objects.filter(message_id=result.message["id"], cited=True).exists()
    return conversation


# --- Conversation page -------------------------------------------------------------------------


def test_the_conversation_page_shows_the_transcript_and_each_answers_trace(admin_client, chatted):
    answer = Message.objects.filter(conversation=chatted, role="assistant").last()
    trace = TurnTrace.objects.get(message=answer).data
    cited = MessageSource.objects.filter(message=answer, cited=True).select_related("chunk").first()
    Feedback.objects.create(message=answer, user=chatted.owner, rating="down", comment="Too short")
    response = admin_client.get(url("conversation_change", chatted.pk))
    assert response.status_code == 200
    page = response.content.decode()
    transcript = page.split('id="ragchat-transcript"', 1)[1]
    # The transcript in order, as a conversation, not an inline formset.
    assert transcript.index("Tell me about the Aurora X2 phone") < transcript.index("How much does it cost?")
    assert answer.content.split("[")[0].strip()[:30] in transcript
    assert "messages-0-content" not in page
    assert "<h2>Tell me about the Aurora X2 phone</h2>" in page  # untitled: named by its first question
    # The trace: collapsed, the question as typed, the rewriting and who did it, hits, documents.
    assert transcript.count('<details class="ragchat-trace">') == 2  # collapsed: no "open"
    assert 'class="ragchat-rewritten">' + trace["queries"]["final"] in transcript
    assert "<code>followup</code>" in transcript
    assert "Documents the model saw" in transcript and "ragchat-badge-cited" in transcript
    # Two scales, each named: the retriever's similarity, the final (joined, post-processed) score.
    assert "retriever's score</th>" in transcript and "final score 0." in transcript
    # Each score says what scale it is on (a new user found two unexplained scales side by side).
    assert "Scores of different retrievers are not comparable" in transcript and "is not a similarity" in transcript
    assert escape(cited.title) + " — Pricing" in transcript
    assert "Stage timings" in transcript and "retrieval" in transcript
    assert "extractive" in transcript  # the model
    assert "Too short" in transcript  # the feedback on that answer
    # What each post-processor and response augmenter did, in the pipeline's order (a plugin
    # author's trial: nothing said which post-processor dropped a passage).
    assert "<h4>Post-processing</h4>" in transcript and "<h4>Answer after the model</h4>" in transcript
    assert (transcript.index("<h4>Retrieval</h4>") < transcript.index("<h4>Post-processing</h4>")
            < transcript.index("Documents the model saw") < transcript.index("<h4>Answer after the model</h4>")
            < transcript.index("Stage timings"))
    assert "<td><code>top_k</code></td>" in transcript and "<td><code>citations</code></td>" in transcript
    # The components the turn ran, as a table, not as raw JSON under "Other details".
    assert 'class="ragchat-components"' in transcript and "<td><code>synonyms</code></td>" in transcript
    assert "Other details" not in transcript
    # And the raw JSON, one click away.
    raw = admin_client.get(url("trace_json", chatted.pk, answer.pk))
    assert raw.status_code == 200 and raw.json()["queries"]["final"] == trace["queries"]["final"]
    question = Message.objects.filter(conversation=chatted, role="user").last()
    assert admin_client.get(url("trace_json", chatted.pk, question.pk)).status_code == 404  # no trace
    elsewhere = Conversation.objects.create(owner=chatted.owner)
    assert admin_client.get(url("trace_json", elsewhere.pk, answer.pk)).status_code == 404  # not its message
    # The trace's own admin page renders it the same way.
    trace_page = admin_client.get(url("turntrace_change", answer.trace.pk)).content.decode()
    assert trace["queries"]["final"] in trace_page
    # "Raw JSON" once on each page: a link to the stored trace (not also a block of it).
    assert trace_page.count("Raw JSON") == 1
    assert f'<a href="{url("trace_json", chatted.pk, answer.pk)}">Raw JSON</a>' in trace_page
    assert transcript.count("Raw JSON") == 2  # one for each of the two answers


def test_staff_rename_a_conversation_on_its_page(admin_client, chatted):
    response = admin_client.post(url("conversation_change", chatted.pk), {
        "title": "Aurora X2 pricing", "metadata": "{}",
        "memories-TOTAL_FORMS": "0", "memories-INITIAL_FORMS": "0",
        "memories-MIN_NUM_FORMS": "0", "memories-MAX_NUM_FORMS": "1000",
    })
    assert response.status_code == 302, response.content.decode()[:2000]
    chatted.refresh_from_db()
    assert chatted.title == "Aurora X2 pricing" and chatted.last_seq == 4  # the counter is untouched


def test_the_transcript_paginates_past_a_few_hundred_messages(admin_client, user):
    conversation = Conversation.objects.create(owner=user)
    Message.objects.bulk_create([
        Message(conversation=conversation, seq=i, role="user" if i % 2 else "assistant", content=f"message number {i}.")
        for i in range(1, 451)
    ])
    first = admin_client.get(url("conversation_change", conversation.pk)).content.decode()
    assert "message number 200." in first and "message number 201." not in first
    assert "Transcript (450 messages)" in first and 'href="?page=3#ragchat-transcript"' in first
    last = admin_client.get(url("conversation_change", conversation.pk) + "?page=3").content.decode()
    assert "message number 401." in last and "message number 450." in last and "message number 400." not in last


def test_traces_of_unknown_or_odd_shape_render_without_error(admin_client, user):
    conversation = Conversation.objects.create(owner=user)
    message = Message.objects.create(conversation=conversation, seq=1, role="assistant", content="x")
    data = {"question": "q", "queries": "not a dict", "retrieval": [{"hits": [{"chunk_id": 999999, "score": "?"}]}],
            "timings": {"llm": 3.0, "total": 4.0, "advisor": None}, "warnings": ["slow embedder"],
            "ended_by": {"stage": "advisors", "component": "cache", "kind": "answer", "reason": "cached"},
            "advisor": {"short_circuit": True, "by": "cache"}, "error": "boom",
            "supplied_guardrails": {"sent": "?", "left_out": 1, "refused": [None, 3, {"by": "g"}], "redacted": "x"}}
    TurnTrace.objects.create(message=message, profile="default", data=data)
    page = admin_client.get(url("conversation_change", conversation.pk)).content.decode()
    assert "Other details" in page and "short_circuit" in page  # a key added by a plugin
    assert "slow embedder" in page and "cached" in page and "boom" in page
    assert "chunk 999999 (gone since)" in page
    assert "The input guardrails left out 1 of the ? supplied messages (refused by g)" in page
    view = admin_views.build_trace_view(["not", "a", "dict"], {})
    assert view.question == "" and view.documents == []


def test_a_chunk_the_viewer_may_not_read_shows_as_hidden_not_as_gone(admin_client, admin_user, user):
    # A new user's trial: a customer's own order chunk (access ["user:N"]) showed to the superuser
    # as "chunk 10 (gone since)", which says it was re-ingested; it is there, and not theirs to read.
    document = Document.objects.create(source="orders/1", title="Order ORD-101", checksum="x")
    own = Chunk.objects.create(document=document, ordinal=0, text="Blue teapot", heading="Items", space="s1",
                               access=[f"user:{user.pk}"])
    staffs = Chunk.objects.create(document=document, ordinal=1, text="Red kettle", heading="Items", space="s1",
                                  access=[f"user:{admin_user.pk}"])
    conversation = Conversation.objects.create(owner=user)
    message = Message.objects.create(conversation=conversation, seq=1, role="assistant", content="x")
    trace = TurnTrace.objects.create(message=message, profile="default", data={"retrieval": [{"hits": [
        {"chunk_id": own.pk, "score": 1.0}, {"chunk_id": 999999, "score": 0.5},
        {"chunk_id": staffs.pk, "score": 0.4}]}]})
    for page in (url("conversation_change", conversation.pk), url("turntrace_change", trace.pk)):
        html = admin_client.get(page).content.decode()
        # The trial of a vet practice: "the asker or you" read as if the customer could not see
        # their own appointment; it is the member of staff who may not.
        assert f"chunk {own.pk} (hidden: you may not read it)" in html, page
        assert f"chunk {staffs.pk} (hidden: the asker may not read it now)" in html, page
        assert "chunk 999999 (gone since)" in html and f"chunk {own.pk} (gone since)" not in html
        assert "Blue teapot" not in html


@pytest.mark.parametrize(("followup", "sentence"), [
    ({"subject": "Loyalty card", "previous_subject": None, "subject_rule": "set", "attribute": None,
      "attribute_rule": "none"}, "Names Loyalty card."),
    ({"subject": "Nimbus Tab", "previous_subject": "Aurora X2", "subject_rule": "replaced",
      "attribute": "battery life", "attribute_rule": "inherited"},
     "Moves from Aurora X2 to Nimbus Tab; asks what the question before asked (battery life)."),
    ({"subject": None, "previous_subject": None, "subject_rule": "none", "attribute": "take",
      "attribute_rule": "new"}, "No subject of the site&#x27;s pages in play; asks about: take."),
])
def test_the_trace_says_how_a_follow_up_was_read_and_what_each_stage_did_in_words(admin_client, user, followup,
                                                                                    sentence):
    """A vet clinic's staff read "subject none, attribute new (take)" and a stage called "llm"
    for the offline answerer; the trace now says both in words, the names beside them, and
    still says what the follow-up did to the query."""
    conversation = Conversation.objects.create(owner=user)
    message = Message.objects.create(conversation=conversation, seq=2, role="assistant", content="x")
    trace = TurnTrace.objects.create(message=message, profile="default", data={
        "queries": {"original": "q", "final": "q", "followup": followup,
                    "transformed": [{"by": "followup", "text": "q Are you open?",
                                     "note": "follow-up: added the opening message 'Are you open?'; "
                                             "subject none, attribute new (take)"}]},
        "timings": {"query_transformers": 0.5, "llm": 2.0, "total": 3.0}})
    html = admin_client.get(url("turntrace_change", trace.pk)).content.decode()
    assert f'<dd class="ragchat-followup">{sentence}</dd>' in html
    assert "attribute new (take)" not in html  # the rule's raw text, said in words above
    # What it did is no rule: a bike shop's staff saw a rewritten query and no reason beside it.
    assert "follow-up: added the opening message &#x27;Are you open?&#x27;" in html
    assert 'answer written <code class="ragchat-stage">llm</code>' in html
    assert 'question rewritten <code class="ragchat-stage">query_transformers</code>' in html


def _assert_named_on_no_page(admin_client, trace, source, *words: str) -> None:
    """None of ``words`` on any admin page that shows ``source``'s answer or its trace."""
    message = source.message
    pages = [url("conversation_change", message.conversation_id), url("turntrace_change", trace.pk),
             url("message_change", message.pk), url("messagesource_changelist"),
             url("messagesource_change", source.pk)]
    for page in pages:
        html = admin_client.get(page).content.decode()
        assert not any(word in html for word in words), page


def test_a_source_the_viewer_may_not_read_is_named_nowhere_in_the_admin(admin_client, user):
    """The trace's retrieval table hid a restricted chunk's document, but "Documents the model
    saw", the transcript's sources and the message-source pages showed the title saved with the
    answer, and a search by it found the row. One rule now: a chunk the asker or the member of
    staff may not read now is named nowhere; a chunk replaced since keeps its saved name."""
    document = Document.objects.create(source="orders/ORD-101", title="Order ORD-101", checksum="x")
    own = Chunk.objects.create(document=document, ordinal=0, text="Blue teapot", heading="Items", space="s1",
                               access=[f"user:{user.pk}"])
    conversation = Conversation.objects.create(owner=user)
    message = Message.objects.create(conversation=conversation, seq=2, role="assistant", content="Shipped [1].")
    hidden = MessageSource.objects.create(message=message, chunk=own, rank=1, score=0.5, cited=True,
                                          title="Order ORD-101", source="orders/ORD-101")
    MessageSource.objects.create(message=message, chunk=None, rank=2, score=0.4, title="Delivery times",
                                 access=["public"])
    trace = TurnTrace.objects.create(message=message, profile="default", data={
        "retrieval": [{"hits": [{"chunk_id": own.pk, "score": 1.0}]}],
        "documents": [{"chunk_id": own.pk, "index": 1, "score": 0.5, "source": "orders/ORD-101"}]})
    _assert_named_on_no_page(admin_client, trace, hidden, "ORD-101", "Blue teapot")
    # In its place, words that do not say the asker may not read their own order.
    assert "(hidden: the asker or you may not read it)" in admin_client.get(
        url("messagesource_changelist")).content.decode()
    assert "Delivery times" in admin_client.get(url("conversation_change", conversation.pk)).content.decode()
    found = admin_client.get(url("messagesource_changelist"), {"q": "ORD-101"}).context["cl"].result_count
    assert found == 0
    assert admin_client.get(url("messagesource_changelist"), {"q": "Delivery"}).context["cl"].result_count == 1


def test_a_customers_row_gone_since_is_not_named_to_staff_who_could_not_read_it(admin_client, user):
    """A garage's trial: once a customer's brake check was cancelled (its row deleted, so its
    chunk), its title "Your booking: brake check for AL19 CEX" showed to staff under "Documents
    the model saw" and in the transcript's sources, which while the row existed hid it. A source
    keeps the access saved with the answer; gone since, it is named only to whom that lets read."""
    conversation = Conversation.objects.create(owner=user)
    message = Message.objects.create(conversation=conversation, seq=2, role="assistant", content="At 14:00 [1].")
    booking = MessageSource.objects.create(message=message, chunk=None, rank=1, score=0.5, cited=True,
                                           title="Your booking: brake check for AL19 CEX", source="bookings:7",
                                           access=[f"user:{user.pk}"])
    MessageSource.objects.create(message=message, chunk=None, rank=2, score=0.4, title="Opening hours",
                                 source="pages:1", access=["public"])
    trace = TurnTrace.objects.create(message=message, profile="default", data={
        "retrieval": [{"hits": [{"chunk_id": 999998, "score": 1.0}, {"chunk_id": 999999, "score": 0.9}]}],
        "documents": [{"chunk_id": 999998, "index": 1, "score": 0.5, "source": "bookings:7"},
                      {"chunk_id": 999999, "index": 2, "score": 0.4, "source": "pages:1"}]})
    _assert_named_on_no_page(admin_client, trace, booking, "AL19 CEX", "bookings:7")
    assert "Opening hours" in admin_client.get(url("turntrace_change", trace.pk)).content.decode()
    assert "Opening hours" in admin_client.get(url("conversation_change", conversation.pk)).content.decode()
    assert admin_client.get(url("messagesource_changelist"), {"q": "AL19"}).context["cl"].result_count == 0
    assert admin_client.get(url("messagesource_changelist"), {"q": "Opening"}).context["cl"].result_count == 1
    page = admin_client.get(url("conversation_change", conversation.pk)).content.decode()
    assert "a passage (hidden: gone since; you may not read it)" in page
    # A source saved before sources kept their access (migration 0011) says so, not whose it is.
    MessageSource.objects.filter(pk=booking.pk).update(access=[])
    page = admin_client.get(url("conversation_change", conversation.pk)).content.decode()
    assert "a passage (hidden: gone since; saved without who could read it)" in page and "AL19" not in page


# --- Conversation list -------------------------------------------------------------------------


def test_a_question_an_input_guardrail_refused_is_not_the_conversations_name_in_the_admin(
        admin_client, user, ragchat_settings_override, product_corpus):
    """A new user's helpdesk: a guardrail refused "password: Hunter2-xyz", and the conversation
    list named the conversation after it. The list and the conversation's heading name it after
    its first question that was not refused; the transcript still shows the refused one."""
    ragchat_settings_override(PROFILES={"default": {"options": {"blocked_phrases": {"phrases": ["password:"]}}}})
    conversation = Conversation.objects.create(owner=user)
    assert run_turn_sync(conversation, "password: Hunter2-xyz").trace["ended_by"]["stage"] == "input_guardrails"
    only_refused = Conversation.objects.create(owner=user)
    run_turn_sync(only_refused, "my password: Hunter2-xyz")
    listed = admin_client.get(url("conversation_changelist")).content.decode()
    assert "Hunter2" not in listed and f"Conversation {str(only_refused.pk)[:8]}" in listed
    page = admin_client.get(url("conversation_change", only_refused.pk)).content.decode()
    head, transcript = page.split('id="ragchat-transcript"', 1)
    assert f"<h2>Conversation {str(only_refused.pk)[:8]}</h2>" in head and "Hunter2" not in head
    assert "my password: Hunter2-xyz" in transcript  # kept in the transcript
    run_turn_sync(conversation, "How much does the Aurora X2 cost?")
    listed = admin_client.get(url("conversation_changelist")).content.decode()
    assert "Hunter2" not in listed and "How much does the Aurora X2 cost?" in listed
    page = admin_client.get(url("conversation_change", conversation.pk)).content.decode()
    assert "<h2>How much does the Aurora X2 cost?</h2>" in page


def test_the_conversation_list_shows_owner_question_counts_and_filters(admin_client, user, other_user):
    untitled = Conversation.objects.create(owner=user)
    Message.objects.create(conversation=untitled, seq=1, role="user", content="Where is my parcel?")
    answer = Message.objects.create(conversation=untitled, seq=2, role="assistant", content="On its way.",
                                    status="error")
    Feedback.objects.create(message=answer, user=user, rating="down")
    Feedback.objects.create(message=answer, user=other_user, rating="up")
    titled = Conversation.objects.create(owner=other_user, title="Warranty question", profile="support")
    Message.objects.create(conversation=titled, seq=1, role="user", content="Is the battery covered?")
    Message.objects.create(conversation=titled, seq=2, role="assistant", content="Yes.")
    anonymous = Conversation.objects.create(session_key="s" * 32)

    changelist = url("conversation_changelist")
    page = admin_client.get(changelist).content.decode()
    assert "Where is my parcel?" in page and "Warranty question" in page
    assert reverse("admin:django_ragchat_user_data", args=[user.pk]) in page  # the owner, linked to their chat data
    assert "👍 1" in page and "👎 1" in page

    def listed(query):
        response = admin_client.get(changelist + query)
        assert response.status_code == 200, query
        return {str(c.pk) for c in response.context["cl"].result_list}

    assert listed(f"?owner={user.pk}") == {str(untitled.pk)}
    assert listed("?owner=anonymous") == {str(anonymous.pk)}
    assert listed("?profile=support") == {str(titled.pk)}
    assert listed("?last_answer=error") == {str(untitled.pk)}
    assert listed("?last_answer=complete") == {str(titled.pk)}
    assert listed("?last_answer=none") == {str(anonymous.pk)}
    assert listed("?thumbs_down=yes") == {str(untitled.pk)}
    assert listed("?thumbs_down=no") == {str(titled.pk), str(anonymous.pk)}
    week_ago = urlencode({"updated_at__gte": str(timezone.now() - timedelta(days=7))})
    assert listed(f"?{week_ago}") == {str(untitled.pk), str(titled.pk), str(anonymous.pk)}
    assert listed("?q=battery") == {str(titled.pk)}  # message content
    assert listed("?q=bob") == {str(titled.pk)}  # owner
    assert listed(f"?q={str(untitled.pk)[:8]}") == set()  # a prefix is not an id: no error
    assert listed(f"?q={untitled.pk}") == {str(untitled.pk)}
    assert listed(f"?q={untitled.pk}&owner={other_user.pk}") == set()  # the filters still apply
    assert '<span title="thumbs down" class="ragchat-negative">👎 1</span>' in page


def test_a_profile_is_shown_by_its_title_with_its_name_beside_it(admin_client, user, ragchat_settings_override):
    """A new user's trial: the lists showed the settings' key ("support"). Staff read the title,
    with the key the settings and the filter's URL use beside it; untrusted, it is escaped."""
    ragchat_settings_override(PROFILES={"default": {}, "support": {"title": "Customer <b>support</b>"}})
    titled = Conversation.objects.create(owner=user, profile="support", title="Warranty question")
    plain = Conversation.objects.create(owner=user, title="Price question")
    shown = "Customer &lt;b&gt;support&lt;/b&gt; (support)"
    for page_url in (url("conversation_changelist"), url("conversation_change", titled.pk)):
        page = admin_client.get(page_url).content.decode()
        assert shown in page and "<b>support</b>" not in page, page_url
    page = admin_client.get(url("conversation_changelist")).content.decode()
    assert f'<a href="?profile=support">{shown}</a>' in page  # the filter
    assert f'<td class="field-profile_title">{shown}</td>' in page
    assert '<td class="field-profile_title">default</td>' in page  # no title: its name, once
    listed = admin_client.get(url("conversation_changelist"), {"profile": "support"}).context["cl"].result_list
    assert [c.pk for c in listed] == [titled.pk]
    message = Message.objects.create(conversation=plain, seq=2, role="assistant", content="x")
    Message.objects.create(conversation=titled, seq=2, role="assistant", content="y")
    support = TurnTrace.objects.create(message=titled.messages.get(), profile="support")
    trace = TurnTrace.objects.create(message=message, profile="default")
    page = admin_client.get(url("turntrace_changelist")).content.decode()
    assert f'<a href="?profile=support">{shown}</a>' in page and f'<td class="field-profile_title">{shown}</td>' in page
    assert admin_client.get(url("turntrace_changelist"), {"profile": "default"}).context["cl"].result_list[0] == trace
    assert shown in admin_client.get(url("turntrace_change", support.pk)).content.decode()


# --- Read-only log -----------------------------------------------------------------------------


def test_a_trace_json_url_with_an_id_no_row_can_have_is_404(admin_client, user):
    # <int:> takes any digits; past a 64-bit column the database refuses the query (SQLite:
    # OverflowError, PostgreSQL: DataError), which was a 500.
    conversation = Conversation.objects.create(owner=user)
    for message_id in (2**63, 10**30):
        assert admin_client.get(url("trace_json", conversation.pk, message_id)).status_code == 404


@pytest.mark.parametrize("owner", [str(2**63), "9" * 30, "\u00b9"])
def test_the_owner_filter_with_an_id_no_user_can_have_lists_nothing(admin_client, user, owner):
    # "¹" passes str.isdigit() but not int(); past 64 bits the database refuses the query: both 500s.
    Conversation.objects.create(owner=user)
    response = admin_client.get(url("conversation_changelist"), {"owner": owner})
    assert response.status_code == 200 and response.context["cl"].result_count == 0


def test_messages_sources_traces_and_feedback_are_read_only(admin_client, chatted):
    answer = Message.objects.filter(conversation=chatted, role="assistant").last()
    feedback = Feedback.objects.create(message=answer, user=chatted.owner, rating="up")
    source = MessageSource.objects.filter(message=answer).first()
    for name, obj in (("message", answer), ("messagesource", source), ("turntrace", answer.trace),
                      ("feedback", feedback)):
        changelist = admin_client.get(url(f"{name}_changelist"))
        assert changelist.status_code == 200, name
        assert "delete_selected" not in changelist.content.decode(), name
        change = admin_client.get(url(f"{name}_change", obj.pk))
        assert change.status_code == 200, name
        html = change.content.decode()
        assert 'name="_save"' not in html and 'name="_continue"' not in html, name
        assert url(f"{name}_delete", obj.pk) not in html, name
        assert admin_client.post(url(f"{name}_change", obj.pk), {}).status_code == 403, name
        assert admin_client.get(url(f"{name}_delete", obj.pk)).status_code == 403, name
        assert admin_client.get(url(f"{name}_add")).status_code == 403, name
    assert Message.objects.filter(pk=answer.pk).exists()
    # Labels, not ids: the source page has the heading, the score rounded, the text.
    html = admin_client.get(url("messagesource_change", source.pk)).content.decode()
    assert escape(source.chunk.heading) in html and f"{source.score:.4f}" in html and "MessageSource object" not in html
    # The message page shows its feedback and links its trace.
    html = admin_client.get(url("message_change", answer.pk)).content.decode()
    assert url("turntrace_change", answer.trace.pk) in html and "up — alice" in html
    assert answer.trace.data["queries"]["final"] in html  # the rewritten query, on the message's page
    traces = admin_client.get(url("turntrace_changelist") + "?q=alice").context["cl"].result_list
    assert {t.message_id for t in traces} == set(Message.objects.filter(role="assistant").values_list("pk", flat=True))
    traces = admin_client.get(url("turntrace_changelist") + f"?q={chatted.pk}").context["cl"].result_list
    assert len(traces) == 2


def test_the_tool_call_list_shows_times_rounded_and_orders_by_them(admin_client, chatted):
    from django_ragchat.models import ToolInvocation

    answer = Message.objects.filter(conversation=chatted, role="assistant").last()
    for index, (ms, status, name) in enumerate(((4.102614000203175, "done", "lookup_order"), (1234.5678901234567, "error", "slow_tool"),
                             (0.0, "pending", "cancel_order"))):
        ToolInvocation.objects.create(message=answer, call_id=f"call_{name}", index=index, name=name, status=status,
                                      ms=ms,
                                      requires_confirmation=status == "pending")
    response = admin_client.get(url("toolinvocation_changelist") + "?o=4")  # the time column, ascending
    html = response.content.decode()
    assert "4.1 ms" in html and "1,235 ms" in html and "4.102614" not in html and "1234.56" not in html
    assert "lookup_<wbr>order" in html and "needs approval" in html.lower()
    assert [c.name for c in response.context["cl"].result_list] == ["cancel_order", "lookup_order", "slow_tool"]
    html = admin_client.get(url("message_change", answer.pk)).content.decode()  # its tool calls, inline
    assert "4.1 ms" in html and "4.102614" not in html


def test_traces_filter_by_the_stage_that_ended_the_turn_early_or_none(admin_client, user):
    conversation = Conversation.objects.create(owner=user)
    ended = {}
    for seq, stage in enumerate(("", "advisors", "input_guardrails"), start=1):
        message = Message.objects.create(conversation=conversation, seq=seq, role="assistant", content=f"answer {seq}")
        ended[stage] = TurnTrace.objects.create(message=message, profile="default", ended_by=stage).pk
    page = admin_client.get(url("turntrace_changelist"))
    html = page.content.decode()
    # The filter offers every stage that may end a turn, and "none", each a link with its name.
    for value, label in (("none", "none (ran to the end)"), *((s, s) for s in ENDING_STAGES)):
        assert f'<a href="?ended_by={value}">{label}</a>' in html, value
    # The column says the same, not Django's "-" for an empty value.
    assert '<td class="field-ended_early_by">none (ran to the end)</td>' in html
    assert '<td class="field-ended_early_by">advisors</td>' in html
    # Each row's link reads as the answer's own ("assistant #2"), not the message's primary key.
    trace_url = url("turntrace_change", ended["advisors"])
    assert f'<a href="{trace_url}">Trace of assistant #2</a>' in html
    assert "<title>Trace of assistant #2 |" in admin_client.get(trace_url).content.decode()  # its page says the same
    # Its answer column holds the answer's words, not "assistant #2:" again; the time in ms.
    row = html.split(f'<a href="{trace_url}">Trace of assistant #2</a>')[1].split("</tr>")[0]
    assert ">answer 2</a>" in row and "assistant #2" not in row, row
    assert '<td class="field-total_time">0.0 ms</td>' in row, row
    for value, stage in (("none", ""), ("advisors", "advisors"), ("input_guardrails", "input_guardrails")):
        traces = admin_client.get(url("turntrace_changelist") + f"?ended_by={value}").context["cl"].result_list
        assert [t.pk for t in traces] == [ended[stage]], value
    assert "none (ran to the end)" in admin_client.get(url("turntrace_change", ended[""])).content.decode()


def test_the_stages_the_admin_filters_by_are_those_that_end_turns():
    source = inspect.getsource(pipeline)
    assert set(re.findall(r'_end\(turn, "(\w+)"', source)) == set(ENDING_STAGES)


LONG_ANSWER = "The <b>Aurora X2</b> costs $699 with 256 GB of storage, a wonderfully bright display"
LONG_ANSWER_LABEL = "assistant #2: The <b>Aurora X2</b> costs $699 with 256 GB of storage, a…"


def test_links_to_an_answer_cut_its_text_at_a_word_and_escape_it(admin_client, user):
    conversation = Conversation.objects.create(owner=user, title="Prices")
    answer = Message.objects.create(conversation=conversation, seq=2, role="assistant", content=LONG_ANSWER)
    trace = TurnTrace.objects.create(message=answer, profile="default")
    Feedback.objects.create(message=answer, user=user, rating="up")
    assert str(answer) == LONG_ANSWER_LABEL  # not "..., a wo"
    link = f'<a href="{url("message_change", answer.pk)}">{escape(LONG_ANSWER_LABEL)}</a>'
    for page in (url("turntrace_changelist"), url("turntrace_change", trace.pk), url("feedback_changelist")):
        html = admin_client.get(page).content.decode()
        if "turntrace" in page:  # named "Trace of assistant #2" already: the answer's words alone
            assert link.replace(escape("assistant #2: "), "") in html, page
        else:
            assert link in html, page
        assert "<b>Aurora" not in html, page  # model output is text, never HTML
    assert str(MemoryRecord(kind="fact", content=LONG_ANSWER)) == "fact: " + LONG_ANSWER_LABEL.split(": ", 1)[1]


@pytest.mark.parametrize(("text", "limit", "short"), [
    ("alpha beta gamma", 16, "alpha beta gamma"),  # fits: whole
    ("alpha beta gamma", 14, "alpha beta…"),  # never "alpha beta gam"
    ("alpha beta gamma", 10, "alpha beta…"),  # the space just past the limit: "beta" is whole
    ("alpha, beta gamma", 8, "alpha…"),  # no trailing comma before the ellipsis
    ("supercalifragilistic word", 10, "supercalif…"),  # one word longer than the room: cut in it
    ("  line\n\n breaks  ", 20, "line breaks"),  # on one line
])
def test_shorten_cuts_at_a_word_boundary(text, limit, short):
    assert shorten(text, limit) == short


def test_deleting_a_conversation_in_the_admin_still_works(admin_client, chatted):
    confirm = admin_client.get(url("conversation_delete", chatted.pk)).content.decode()
    assert "Messages: 4" in confirm and "Turn traces: 2" in confirm  # counted, not listed
    response = admin_client.post(url("conversation_delete", chatted.pk), {"post": "yes"})
    assert response.status_code == 302
    assert not Conversation.objects.exists() and not Message.objects.exists() and not TurnTrace.objects.exists()


# --- Memory ------------------------------------------------------------------------------------


def test_a_memory_record_needs_a_user_or_a_conversation(admin_client, user):
    response = admin_client.post(url("memoryrecord_add"), {"kind": "fact", "content": "Likes tea", "user": "",
                                                           "conversation": "", "metadata": "{}"})
    assert response.status_code == 200
    assert "A memory record is about a user or a conversation" in response.content.decode()
    assert "is violated" not in response.content.decode()  # the database constraint's raw message
    assert not MemoryRecord.objects.exists()
    response = admin_client.post(url("memoryrecord_add"), {"kind": "fact", "content": "Likes tea", "user": user.pk,
                                                           "conversation": "", "metadata": "{}"})
    assert response.status_code == 302
    record = MemoryRecord.objects.get()
    response = admin_client.post(url("memoryrecord_change", record.pk), {
        "kind": "fact", "content": "Likes green tea", "user": user.pk, "conversation": "", "metadata": "{}"})
    assert response.status_code == 302
    record.refresh_from_db()
    assert record.content == "Likes green tea"


def test_a_memory_records_metadata_is_read_as_lines_of_text_and_kept_when_staff_correct_it(admin_client, user):
    """It was a raw JSON text area: staff could break what the summary memory wrote."""
    record = MemoryRecord.objects.create(user=user, kind="summary", content="They talked about tea",
                                         metadata={"model": "<b>m</b>", "folded_messages": 6, "ids": [1, 2]})
    page = admin_client.get(url("memoryrecord_change", record.pk)).content.decode()
    assert 'name="metadata"' not in page
    assert "<dt>folded messages</dt><dd>6</dd>" in page and "<dd>[1, 2]</dd>" in page
    assert "<dd>&lt;b&gt;m&lt;/b&gt;</dd>" in page and "<b>m</b>" not in page
    response = admin_client.post(url("memoryrecord_change", record.pk), {
        "kind": "summary", "content": "They talked about green tea", "user": user.pk, "conversation": "",
        "metadata": "{}"})
    assert response.status_code == 302
    record.refresh_from_db()
    assert record.content == "They talked about green tea" and record.metadata["folded_messages"] == 6


def test_memory_records_filter_by_user_kind_and_conversation(admin_client, user, other_user):
    conversation = Conversation.objects.create(owner=user)
    mine = MemoryRecord.objects.create(user=user, kind="fact", content="Alice likes tea")
    summary = MemoryRecord.objects.create(conversation=conversation, kind="summary", content="They talked")
    MemoryRecord.objects.create(user=other_user, kind="fact", content="Bob likes coffee")

    def listed(query):
        response = admin_client.get(url("memoryrecord_changelist") + query)
        assert response.status_code == 200, query
        return {r.pk for r in response.context["cl"].result_list}

    assert listed(f"?user__id__exact={user.pk}") == {mine.pk}
    assert listed("?kind__exact=summary") == {summary.pk}
    assert listed(f"?conversation__id__exact={conversation.pk}") == {summary.pk}
    assert listed("?q=coffee") == {MemoryRecord.objects.get(content="Bob likes coffee").pk}
    assert admin_client.post(url("memoryrecord_delete", mine.pk), {"post": "yes"}).status_code == 302
    assert not MemoryRecord.objects.filter(pk=mine.pk).exists()


def test_staff_need_the_reviewers_group_to_correct_memory(client, staff_user, user):
    record = MemoryRecord.objects.create(user=user, kind="fact", content="Alice likes tea")
    client.force_login(staff_user)
    change = url("memoryrecord_change", record.pk)
    assert client.get(change).status_code == 403  # staff alone: no model permission
    call_command("ragchat_admin_group", stdout=open("/dev/null", "w"))  # noqa: SIM115
    staff_user.groups.add(Group.objects.get(name="Chat reviewers"))
    assert client.get(change).status_code == 200
    response = client.post(change, {"kind": "fact", "content": "Alice likes coffee", "user": user.pk,
                                    "conversation": "", "metadata": "{}"})
    assert response.status_code == 302
    record.refresh_from_db()
    assert record.content == "Alice likes coffee"
    assert client.get(url("conversation_changelist")).status_code == 200  # reading is in the group
    assert client.post(url("conversation_delete", Conversation.objects.create(owner=user).pk),
                       {"post": "yes"}).status_code == 403  # deleting is not


# --- Documents and chunks ----------------------------------------------------------------------


def test_add_document_is_an_upload_that_runs_ingestion(admin_client):
    page = admin_client.get(url("document_add"))
    assert page.status_code == 200 and 'type="file"' in page.content.decode()
    upload = SimpleUploadedFile("guide.md", b"# Guide\n\n## Setup\nPlug it in and wait for the light.\n")
    response = admin_client.post(url("document_add"), {"file": upload, "source": "", "title": "",
                                                       "content_type": "", "profile": ""}, follow=True)
    assert response.redirect_chain[0][1] == 302
    document = Document.objects.get(source="upload/guide.md")
    assert document.chunks.count() == 1 and document.chunks.first().embedding is not None
    assert "Ingested upload/guide.md: created, 1 chunk." in response.content.decode()  # not "1 chunks"
    # A file that is not UTF-8, or of unknown type, is a form error; nothing is stored.
    bad = admin_client.post(url("document_add"), {"file": SimpleUploadedFile("x.md", b"\xff\xfe\x00bad")})
    assert bad.status_code == 200 and "not UTF-8" in bad.content.decode()
    unknown = admin_client.post(url("document_add"), {"file": SimpleUploadedFile("x.bin", b"text")})
    assert unknown.status_code == 200 and "Unknown file type" in unknown.content.decode()
    assert Document.objects.count() == 1


@pytest.mark.django_db(transaction=True)  # the worker closes the connection when it is done
def test_a_large_upload_goes_to_the_task_worker_when_the_site_has_one(admin_client, ragchat_settings_override):
    ragchat_settings_override(TASK_BACKEND="database", BACKGROUND_INGEST_BYTES=100)
    text = b"# Guide\n\n## Setup\n" + b"Plug it in and wait for the light. " * 10
    response = admin_client.post(url("document_add"), {"file": SimpleUploadedFile("guide.md", text)}, follow=True)
    assert "Queued upload/guide.md" in response.content.decode()
    assert not Document.objects.filter(source="upload/guide.md").exists()
    call_command("db_worker", "--batch", "--backend", "database", "--no-startup-delay", verbosity=0)
    assert Document.objects.get(source="upload/guide.md").chunks.exists()


def test_documents_list_chunks_and_spaces_and_chunks_show_heading_and_text(admin_client, product_corpus):
    page = admin_client.get(url("document_changelist")).content.decode()
    space = Chunk.objects.values_list("space", flat=True).first()
    assert f"{space} (" in page
    document = Document.objects.get(source="products/aurora-x2.md")
    chunk = document.chunks.get(heading__contains="Pricing")
    assert admin_client.get(url("chunk_add")).status_code == 403  # no "add chunk"
    chunks = admin_client.get(url("chunk_changelist") + f"?document__id__exact={document.pk}")
    assert chunks.status_code == 200 and {c.document_id for c in chunks.context["cl"].result_list} == {document.pk}
    html = admin_client.get(url("chunk_change", chunk.pk)).content.decode()
    assert escape(chunk.heading) in html and "costs $699" in html and 'name="_save"' not in html
    html = admin_client.get(url("document_change", document.pk)).content.decode()
    assert f"{space}: {document.chunks.count()}" in html


def test_documents_are_reingested_from_their_files_and_deleted(admin_client, tmp_path, product_corpus):
    path = tmp_path / "faq.md"
    path.write_text("# FAQ\n\n## Returns\nReturns are free for thirty days.\n")
    call_command("ragchat_ingest", str(path), stdout=open("/dev/null", "w"))  # noqa: SIM115
    faq = Document.objects.get(source__endswith="/faq.md")
    path.write_text("# FAQ\n\n## Returns\nReturns are free for sixty days.\n")
    uploaded = Document.objects.get(source="products/aurora-x2.md")
    response = admin_client.post(url("document_changelist"), {
        "action": "reingest", "_selected_action": [faq.pk, uploaded.pk]}, follow=True)
    text = response.content.decode()
    assert "1 updated" in text and "products/aurora-x2.md" in text and "upload these again" in text
    assert "Re-ingested 1 document: 1 updated." in text  # not "1 document(s)"
    assert "sixty days" in faq.chunks.get().text
    # Delete: the confirmation page counts the chunks instead of listing them.
    confirm = admin_client.post(url("document_changelist"), {"action": "delete_selected",
                                                             "_selected_action": [uploaded.pk]})
    assert confirm.status_code == 200
    count = uploaded.chunks.count()
    assert f"Chunks: {count}" in confirm.content.decode()
    admin_client.post(url("document_changelist"), {"action": "delete_selected", "_selected_action": [uploaded.pk],
                                                   "post": "yes"})
    assert not Document.objects.filter(pk=uploaded.pk).exists()
    assert not Chunk.objects.filter(document_id=uploaded.pk).exists()


# --- One user's chat data ----------------------------------------------------------------------


def test_a_users_chat_data_is_counted_exported_and_erased(admin_client, chatted, user, other_user):
    answer = Message.objects.filter(conversation=chatted, role="assistant").last()
    Feedback.objects.create(message=answer, user=user, rating="up")
    Feedback.objects.create(message=answer, user=other_user, rating="down")  # on alice's conversation
    MemoryRecord.objects.create(user=user, kind="fact", content="Alice likes tea")
    MemoryRecord.objects.create(conversation=chatted, kind="summary", content="About the Aurora X2")
    bobs = Conversation.objects.create(owner=other_user)
    bobs_message = Message.objects.create(conversation=bobs, seq=1, role="assistant", content="Hi")
    Feedback.objects.create(message=bobs_message, user=user, rating="down")  # alice rated bob's answer
    bobs_memory = MemoryRecord.objects.create(user=other_user, kind="fact", content="Bob likes coffee")
    alices_key, secret = ApiKey.create_key(user, name="laptop")
    bobs_key, _ = ApiKey.create_key(other_user, name="bob's")

    page = admin_client.get(url("user_data", user.pk))
    assert page.status_code == 200
    counts = page.context["counts"]
    assert counts == {"conversations": 1, "messages": 4, "sources": MessageSource.objects.count(),
                      "tool calls": 0, "traces": 2, "memory records": 2, "feedback": 3, "API keys": 1}
    assert "Yes, erase this chat data" in page.content.decode()

    export = admin_client.get(url("user_data_export", user.pk))
    assert export["Content-Disposition"].startswith("attachment")
    data = json.loads(export.content)
    assert data["user"]["username"] == "alice"
    [conversation] = data["conversations"]
    assert [m["content"] for m in conversation["messages"]][0] == "Tell me about the Aurora X2 phone"
    assert conversation["messages"][3]["trace"]["queries"]["final"] and conversation["messages"][3]["sources"]
    assert {m["content"] for m in data["memory"]} == {"Alice likes tea", "About the Aurora X2"}
    assert len(data["feedback"]) == 3
    assert [k["name"] for k in data["api_keys"]] == ["laptop"] and secret not in export.content.decode()
    assert alices_key.digest not in export.content.decode()

    response = admin_client.post(url("user_data", user.pk), {"confirm": "yes"})
    assert response.status_code == 302
    assert not Conversation.objects.filter(owner=user).exists()
    assert not MemoryRecord.objects.filter(user=user).exists() and not Feedback.objects.filter(user=user).exists()
    assert not TurnTrace.objects.exists() and not MessageSource.objects.exists()
    # Bob's data stays (except his rating of Alice's answer, which went with it).
    assert Message.objects.filter(pk=bobs_message.pk).exists() and MemoryRecord.objects.filter(pk=bobs_memory.pk).exists()
    assert Feedback.objects.count() == 0
    # Her API key is gone, so it no longer signs in to the OpenAI-compatible endpoint; Bob's stays.
    assert not ApiKey.objects.filter(pk=alices_key.pk).exists() and ApiKey.objects.filter(pk=bobs_key.pk).exists()
    assert user.__class__.objects.filter(pk=user.pk).exists()  # the account itself stays
    entry = LogEntry.objects.get(object_id=str(user.pk))  # and its admin history says who erased what
    assert "Erased the django-ragchat chat data: 1 conversation, 4 messages" in entry.get_change_message()


def test_the_erase_page_says_what_stays_and_counts_the_documents_indexed_for_the_user(
        admin_client, user, other_user, ragchat_settings_override):
    """A new user's trial: the erase page did not say that the documents a model source indexed
    for that user (access ``user:<id>``) stay, and its paragraph left out the API keys it counts.
    It counts them by source, says why they stay (the site's rows) and how they go."""
    from tests.sources_app.models import Article

    ragchat_settings_override(PLUGINS=["tests.sources_plugin"])
    mine = Article.objects.create(title="Your booking: The Seagull", body="Row F, seats 11 and 12.", owner=user)
    Article.objects.create(title="Bob's booking", body="Row A.", owner=other_user)
    Article.objects.create(title="Opening hours", body="From 9 to 5.")  # everyone's
    call_command("ragchat_sync", "articles", "--no-progress", stdout=open("/dev/null", "w"))  # noqa: SIM115
    ingest_text("upload/alice-contract.md", "# Contract\n\nSigned.", access=[f"user:{user.pk}", "staff"])
    Conversation.objects.create(owner=user)
    response = admin_client.get(url("user_data", user.pk))
    assert response.context["documents_kept"] == {"": 1, "articles": 1}
    page = response.content.decode()
    kept = page.split("<h2>What erasing leaves</h2>", 1)[1]
    assert "Model source <code>articles</code></td><td class=\"ragchat-num\">1</td>" in kept
    assert "Files and uploads</td><td class=\"ragchat-num\">1</td>" in kept
    assert f"<code>user:{user.pk}</code>" in kept and "the next sync indexes the rows again" in kept
    erase = page.split('id="ragchat-erase"', 1)[1]
    assert "API keys of the OpenAI-compatible endpoint, which stop working" in erase
    assert "the documents indexed for this user stay" in erase
    assert admin_client.post(url("user_data", user.pk), {"confirm": "yes"}).status_code == 302
    assert Document.objects.filter(source=f"articles:{mine.pk}").exists()  # the site's data stays...
    mine.delete()
    call_command("ragchat_sync", "articles", "--no-progress", stdout=open("/dev/null", "w"))  # noqa: SIM115
    assert not Document.objects.filter(source=f"articles:{mine.pk}").exists()  # ...and follows its row
    page = admin_client.get(url("user_data", user.pk)).content.decode()
    assert "Model source <code>" not in page and "Files and uploads</td>" in page
    other = admin_client.get(url("user_data", other_user.pk))
    assert other.context["documents_kept"] == {"articles": 1}
    assert "Files and uploads ingested" not in other.content.decode()


def test_the_chat_data_page_and_its_erasure_say_one_conversation_not_1_conversations(admin_client, user):
    """A new user's trial: "Erased the chat data of alice: 1 conversations, 1 memory records"."""
    conversation = Conversation.objects.create(owner=user)
    Message.objects.create(conversation=conversation, seq=1, role="user", content="Is the VPN down?")
    MemoryRecord.objects.create(user=user, kind="fact", content="Works on floor 3")
    ApiKey.create_key(user, name="laptop")
    assert admin_views.counted(admin_views.UserChatData(user).counts()) == \
        "1 conversation, 1 message, 1 memory record, 1 API key"
    page = admin_client.get(url("user_data", user.pk)).content.decode()
    assert "counted above (1 conversation, 1 message, 1 memory record, 1 API key)" in page
    response = admin_client.post(url("user_data", user.pk), {"confirm": "yes"}, follow=True)
    said = "1 conversation, 1 message, 1 memory record, 1 API key."
    assert f"Erased the chat data of alice: {said}" in response.content.decode()
    assert LogEntry.objects.get(object_id=str(user.pk)).get_change_message() == \
        f"Erased the django-ragchat chat data: {said}"
    assert admin_views.counted(admin_views.UserChatData(user).counts()) == "no chat data"
    MemoryRecord.objects.create(user=user, kind="fact", content="a")
    MemoryRecord.objects.create(user=user, kind="fact", content="b")
    assert admin_views.counted(admin_views.UserChatData(user).counts()) == "2 memory records"


def test_user_chat_data_is_reached_from_the_user_admin_and_needs_permissions(admin_client, client, staff_user,
                                                                             user):
    response = admin_client.post(reverse("admin:auth_user_changelist"), {
        "action": "user_chat_data_action", "_selected_action": [user.pk]})
    assert response.status_code == 302 and response["Location"] == url("user_data", user.pk)
    search = admin_client.get(url("user_data_search") + "?q=ali").content.decode()
    assert url("user_data", user.pk) in search
    assert admin_client.get(url("user_data", "nope")).status_code == 404
    client.force_login(staff_user)
    assert client.get(url("user_data", user.pk)).status_code == 403
    assert client.get(url("user_data_export", user.pk)).status_code == 403
    call_command("ragchat_admin_group", stdout=open("/dev/null", "w"))  # noqa: SIM115
    staff_user.groups.add(Group.objects.get(name="Chat reviewers"))
    assert client.get(url("user_data_export", user.pk)).status_code == 200
    Conversation.objects.create(owner=user)
    assert client.post(url("user_data", user.pk), {"confirm": "yes"}).status_code == 403  # no delete permissions
    assert Conversation.objects.filter(owner=user).exists()


# --- Constant queries per list page ------------------------------------------------------------


_row_numbers = itertools.count()


def make_rows(n: int, owner) -> None:
    """``n`` rows of every model, each with the relations its list shows."""
    for i in itertools.islice(_row_numbers, n):
        document = Document.objects.create(source=f"doc-{owner.pk}-{i}.md", title=f"Doc {i}", checksum="x")
        chunk = Chunk.objects.create(document=document, ordinal=0, text=f"Text {i}", heading="H", space="s1")
        Chunk.objects.create(document=document, ordinal=0, text=f"Text {i}", heading="H", space="s2")
        conversation = Conversation.objects.create(owner=owner, title="" if i % 2 else f"Title {i}")
        Message.objects.create(conversation=conversation, seq=1, role="user", content=f"Question {i}")
        answer = Message.objects.create(conversation=conversation, seq=2, role="assistant", content=f"Answer {i}")
        MessageSource.objects.create(message=answer, chunk=chunk, rank=1, score=0.5, cited=True, title="Doc")
        TurnTrace.objects.create(message=answer, profile="default",
                                 data={"question": "q", "retrieval": [{"hits": [{"chunk_id": chunk.pk, "score": 1}]}],
                                       "documents": [{"index": 1, "chunk_id": chunk.pk, "score": 0.5}]})
        Feedback.objects.create(message=answer, user=owner, rating="down" if i % 2 else "up", comment="c")
        MemoryRecord.objects.create(user=owner, conversation=conversation, kind="fact", content=f"Fact {i}")


LISTS = ["conversation", "message", "messagesource", "turntrace", "feedback", "memoryrecord", "document", "chunk"]


@pytest.mark.parametrize("name", LISTS)
def test_every_list_page_runs_a_constant_number_of_queries(admin_client, django_user_model, name):
    owner = django_user_model.objects.create_user("owner")
    changelist = url(f"{name}_changelist")
    filters = {"conversation": "?thumbs_down=no&last_answer=complete&owner=signed_in"}.get(name, "")

    def queries() -> int:
        admin_client.get(changelist + filters)  # warm caches (content types, sessions)
        with CaptureQueriesContext(connection) as captured:
            response = admin_client.get(changelist + filters)
        assert response.status_code == 200
        return len(captured)

    make_rows(3, owner)
    few = queries()
    make_rows(12, owner)
    many = queries()
    rows = admin_client.get(changelist + filters).context["cl"].result_count
    assert rows >= 7, rows
    assert few == many, f"{name}: {few} queries for a few rows, {many} for more"


def test_the_conversation_page_runs_a_constant_number_of_queries(admin_client, django_user_model):
    owner = django_user_model.objects.create_user("owner")
    make_rows(1, owner)
    conversation = Conversation.objects.get()
    answer = conversation.messages.get(role="assistant")
    page = url("conversation_change", conversation.pk)

    def queries() -> int:
        admin_client.get(page)
        with CaptureQueriesContext(connection) as captured:
            assert admin_client.get(page).status_code == 200
        return len(captured)

    few = queries()
    chunk = Chunk.objects.first()
    for seq in range(3, 23, 2):
        Message.objects.create(conversation=conversation, seq=seq, role="user", content="More?")
        more = Message.objects.create(conversation=conversation, seq=seq + 1, role="assistant", content="Yes [1]")
        MessageSource.objects.create(message=more, chunk=chunk, rank=1, score=0.5, cited=True)
        TurnTrace.objects.create(message=more, profile="default", data=answer.trace.data)
        Feedback.objects.create(message=more, user=owner, rating="up")
    assert few == queries()


# --- Untrusted text ----------------------------------------------------------------------------


def test_model_output_documents_and_user_text_are_escaped_everywhere(admin_client, django_user_model):
    owner = django_user_model.objects.create_user("evil" + "x")
    document = Document.objects.create(source="evil.md", title=XSS, checksum="x")
    chunk = Chunk.objects.create(document=document, ordinal=0, text=XSS, heading=XSS, space="s1")
    conversation = Conversation.objects.create(owner=owner, title=XSS)
    untitled = Conversation.objects.create(owner=owner)
    Message.objects.create(conversation=untitled, seq=1, role="user", content=XSS)
    question = Message.objects.create(conversation=conversation, seq=1, role="user", content=XSS)
    answer = Message.objects.create(conversation=conversation, seq=2, role="assistant", content=XSS,
                                    metadata={"error": {"code": XSS, "message": XSS}})
    source = MessageSource.objects.create(message=answer, chunk=chunk, rank=1, score=0.5, cited=True,
                                          title=XSS, source=XSS)
    trace = TurnTrace.objects.create(message=answer, profile="default", data={
        "question": XSS, "queries": {"original": XSS, "transformed": [{"by": XSS, "text": XSS, "note": XSS}],
                                     "expanded": [XSS], "final": XSS + "!"},
        "retrieval": [{"retriever": XSS, "query": XSS, "hits": [{"chunk_id": chunk.pk, "score": 1.0}]}],
        "documents": [{"index": 1, "chunk_id": chunk.pk, "score": 0.5, "source": XSS}],
        "timings": {XSS: 1.0}, "model": XSS, "usage": {XSS: XSS}, "warnings": [XSS], "error": {"code": XSS},
        "ended_by": {"stage": XSS}, XSS: XSS,
        "answerer": {"outcome": "declined", "asked": [XSS], "subjects": [XSS], "missing": XSS, "attempts": [
            {"reason": "below_threshold", "closest": {"passage": 1, "sentence": 2, "coverage": 0.1}}]},
    }, ended_by=XSS)
    feedback = Feedback.objects.create(message=answer, user=owner, rating="down", comment=XSS)
    memory = MemoryRecord.objects.create(conversation=conversation, kind="fact", content=XSS)
    pages = [
        url("conversation_changelist"), url("conversation_change", conversation.pk),
        url("message_changelist"), url("message_change", answer.pk), url("message_change", question.pk),
        url("messagesource_changelist"), url("messagesource_change", source.pk),
        url("turntrace_changelist"), url("turntrace_change", trace.pk),
        url("feedback_changelist"), url("feedback_change", feedback.pk),
        url("memoryrecord_changelist"), url("memoryrecord_change", memory.pk),
        url("document_changelist"), url("document_change", document.pk),
        url("chunk_changelist"), url("chunk_change", chunk.pk),
        url("user_data", owner.pk), url("user_data_search") + "?q=evil",
    ]
    for page in pages:
        response = admin_client.get(page)
        assert response.status_code == 200, page
        html = response.content.decode()
        assert "<img src=x" not in html and "<script>alert" not in html, page
    conversation_page = admin_client.get(url("conversation_change", conversation.pk)).content.decode()
    assert conversation_page.count(ESCAPED) >= 10


def test_a_chat_reviewer_reaches_every_page_the_admin_links_them_to(client, user, product_corpus):
    """A member of the group ``ragchat_admin_group`` makes (added by its ``--add``) follows
    every link of the pages docs/admin.md describes, two clicks deep from the admin's index:
    none answers 403 or 404. An owner's name leads to their chat data page, where the export is."""
    import io
    import re

    from django.contrib.auth import get_user_model

    conversation = Conversation.objects.create(owner=user)
    result = run_turn_sync(conversation, "How much does the Aurora X2 cost?")
    Feedback.objects.create(message_id=result.message["id"], user=user, rating="down", comment="Too short")
    memory = MemoryRecord.objects.create(user=user, conversation=conversation, kind="summary",
                                         content="Asked about prices")
    reviewer = get_user_model().objects.create_user("rita", password="pw")
    out = io.StringIO()
    call_command("ragchat_admin_group", "--add", "rita", stdout=out)
    assert "Added to it, as staff: rita." in out.getvalue()
    reviewer.refresh_from_db()
    assert reviewer.is_staff and reviewer.groups.filter(name="Chat reviewers").exists()
    client.force_login(reviewer)

    # Not followed: signing out, and the pages that change or delete (reading is what is checked).
    skip = re.compile(r"/(logout|password_change|delete|add)/")
    seen, queue = {}, ["/admin/", url("conversation_change", conversation.pk)]
    for depth in range(3):
        next_queue = []
        for page in queue:
            if page in seen:
                continue
            response = client.get(page)
            seen[page] = response.status_code
            if depth < 2 and response.status_code == 200 and response["Content-Type"].startswith("text/html"):
                links = re.findall(r'href="(/admin/[^"]*)"', response.content.decode())
                next_queue += [link.replace("&amp;", "&") for link in links if not skip.search(link)]
        queue = next_queue
    refused = {page: status for page, status in seen.items() if status >= 400}
    assert not refused, refused
    assert url("user_data", user.pk) in seen and url("user_data_export", user.pk) in seen
    assert f"/admin/django_ragchat/conversation/{conversation.pk}/trace/" in " ".join(seen)
    assert not any(page.startswith("/admin/auth/") for page in seen)  # nothing links them to the user admin
    record = client.get(url("memoryrecord_change", memory.pk)).content.decode()  # editable by them
    assert "/admin/auth/" not in record and url("user_data", user.pk) in record
    with pytest.raises(CommandError):
        call_command("ragchat_admin_group", "--add", "nobody", stdout=io.StringIO())


def _nested_links(html: str) -> list[str]:
    """The ``<a`` tags opened inside another link (a browser closes the outer one: its text is lost)."""
    found, depth = [], 0
    for tag in re.finditer(r"<(/?)a\b[^>]*>", html):
        if tag.group(1):
            depth = max(0, depth - 1)
        else:
            if depth:
                found.append(html[max(0, tag.start() - 120):tag.end()])
            depth += 1
    return found


def test_no_list_page_nests_a_link_in_the_row_link(admin_client, chatted):
    """Each list's first column links to its row; a column that is itself a link (the message)
    must not be that one, or the row's link wraps another and clicking it opens the wrong page."""
    from django.contrib import admin as django_admin

    Feedback.objects.create(message=Message.objects.filter(conversation=chatted, role="assistant").last(),
                            user=chatted.owner, rating="up")
    models = [m for m in django_admin.site._registry if m._meta.app_label == "django_ragchat"]
    for model in models:
        page = admin_client.get(reverse(f"admin:django_ragchat_{model._meta.model_name}_changelist"))
        assert page.status_code == 200, model
        rows = page.content.decode().split('id="result_list"', 1)[-1]
        assert not _nested_links(rows), (model.__name__, _nested_links(rows)[:1])


def breadcrumbs(page: str) -> tuple[str, list[str]]:
    """The element Django's breadcrumbs use on ``page`` ("ol" or "div") and their texts."""
    match = re.search(r'<(ol|div) class="breadcrumbs">(.*?)</\1>', page, re.S)
    assert match, "no breadcrumbs"
    texts = [t.strip() for t in re.split(r"<[^>]+>|&rsaquo;|›", match.group(2)) if t.strip()]
    return match.group(1), texts


def test_the_apps_own_pages_write_breadcrumbs_as_the_running_django_does(admin_client, user):
    # Django 6 writes <ol class="breadcrumbs">, styled per item; a <div> of links showed unstyled.
    own, _ = breadcrumbs(admin_client.get(url("document_changelist")).content.decode())
    pages = {
        url("user_data_search"): ["Home", "RAG chat", "User chat data"],
        url("user_data", user.pk): ["Home", "RAG chat", "User chat data", str(user)],
        url("document_add"): ["Home", "RAG chat", "Documents", "Upload a document"],
    }
    for page_url, expected in pages.items():
        element, texts = breadcrumbs(admin_client.get(page_url).content.decode())
        assert (element, texts) == (own, expected), page_url


def test_a_chunk_is_named_by_its_heading_and_part(product_corpus):
    chunk = Chunk.objects.exclude(heading="").order_by("document", "ordinal").first()
    assert str(chunk) == f"{chunk.heading}, part {chunk.ordinal + 1}"
    chunk.heading = ""
    assert str(chunk) == f"Document {chunk.document_id}, part {chunk.ordinal + 1}"


def test_a_documents_page_shows_its_text_by_chunk(admin_client, product_corpus):
    document = Document.objects.annotate(n=Count("chunks")).filter(n__gt=1).first()
    chunks = list(document.chunks.order_by("ordinal"))
    page = admin_client.get(url("document_change", document.pk)).content.decode()
    shown = page.split('class="ragchat-document-chunks"', 1)[1].split("</ol>", 1)[0]
    for chunk in chunks:
        assert url("chunk_change", chunk.pk) in shown and escape(str(chunk)) in shown
    assert escape(admin_views.chunk_snippet(chunks[0])) in shown


def test_a_traces_prompt_and_history_read_as_sentences():
    prompt = {"budget": 7089, "history_budget": 2481, "history_tokens": 640, "context_budget": 6449,
              "tokens": 1210, "documents_dropped_for_budget": 1, "new_key": 3}
    # The context budget is what the passages may fill: "6,449 left for the passages" after
    # "1,210 tokens" read as what the prompt left unused (a new user's trial).
    assert admin_views.prompt_sentence(prompt) == (
        "1,210 tokens (budget 7,089); history 640 of its 2,481; "
        "passages may fill 6,449 (the budget less the history); "
        "1 passage dropped for the budget; new_key: 3")
    assert admin_views.prompt_sentence({"tokens": 90, "documents_dropped_for_budget": 0}) == "90 tokens"
    assert admin_views.history_sentence({"messages": 10, "seqs": [1, 10], "supplied": 2}) == (
        "10 earlier messages (#1 to #10); 2 supplied by the client")
    assert admin_views.history_sentence({"messages": 0, "seqs": []}) == "0 earlier messages"
    assert admin_views.history_sentence({"messages": 1, "seqs": [3, 3]}) == "1 earlier message (#3)"


def test_the_trace_says_why_the_offline_answerer_answered_or_declined(admin_client, chatted):
    """A new user's trial: the trace showed what was retrieved and the answer "The documents
    don't say anything about ...", but not why no passage sentence was taken."""
    declined = run_turn_sync(chatted, "Does the Aurora X2 come with a leather case?")
    why = declined.trace["answerer"]
    assert why["outcome"] == "declined" and why["attempts"][0]["reason"] == "below_threshold", why
    closest = why["attempts"][0]["closest"]
    assert closest["sentence"] >= 1 and 0 <= closest["coverage"] < why["thresholds"]["min_coverage"], why
    # Where the sentence is, never its text: a document's words stay where access and redactors apply.
    assert set(closest) == {"passage", "sentence", "coverage", "similarity"}
    answered = TurnTrace.objects.filter(message__conversation=chatted).order_by("pk")[1].data["answerer"]
    assert answered["outcome"] == "answered" and answered["picked"][0]["coverage"] > 0, answered

    page = admin_client.get(url("conversation_change", chatted.pk)).content.decode()
    assert page.count("<dt>Why this answer</dt>") == 3
    assert "Declined: no sentence states “" in page
    assert f"The closest, sentence {closest['sentence']} of passage [{closest['passage']}] (" in page
    assert "Answered with " in page and "of the asked words by weight (synonyms count)" in page


@pytest.mark.parametrize("why, said", [
    ({"outcome": "answered", "asked": ["warranty"], "subjects": ["aurora x2"],
      "picked": [{"passage": 2, "sentence": 1, "coverage": 1.0, "similarity": 0.81}],
      "thresholds": {"min_coverage": 0.5, "min_similarity": 0.7}},
     "Asked about “warranty” of “aurora x2”. Answered with 1 sentence of passage [2] (Aurora X2 — Warranty); the "
     "first matches 100% of the asked words by weight (synonyms count) and is 0.81 similar in meaning."),
    ({"outcome": "declined", "asked": ["box", "office"], "missing": "box office hours",
      "attempts": [{"reason": "below_threshold", "closest": {"passage": 1, "sentence": 3,
                                                             "coverage": 0.25, "similarity": 0.4}}],
      "thresholds": {"min_coverage": 0.5}},
     "Asked about “box”, “office”. Declined: no sentence states “box office hours”. The closest, sentence 3 of "
     "passage [1], matches 25% of the asked words by weight (synonyms count); a sentence answers with at least 50% of them."),
    # A part answered and the rest declined: the answer quotes a sentence, then declines a word.
    ({"outcome": "declined", "asked": ["watering", "day", "owns"], "missing": "owns",
      "picked": [{"passage": 2, "sentence": 2, "coverage": 1.0, "similarity": 0.85}], "parts": {"asked": 2, "unanswered": 1},
      "attempts": [{"reason": "below_threshold", "closest": {"passage": 2, "sentence": 2, "coverage": 0.0,
                                                             "similarity": -0.13}}],
      "thresholds": {"min_coverage": 0.5}},
     "Asked about “watering”, “day”, “owns”. Answered with 1 sentence of passage [2] (Aurora X2 — Warranty); the "
     "first matches 100% of its part's asked words by weight (synonyms count). 1 of the question's 2 parts found "
     "no sentence. The rest declined: no sentence states “owns”. The closest, sentence 2 of passage [2] (Aurora X2 "
     "— Warranty), matches 0% of the asked words by weight (synonyms count); a sentence answers with at least 50% of them."),
    ({"outcome": "declined", "asked": ["price"], "attempts": [{"reason": "no_amount"}], "thresholds": {}},
     "Asked about “price”. Declined: no sentence states what was asked. The question asks for an amount, and no "
     "sentence on its subject states one."),
    ({"outcome": "unknown_subject", "unknown": ["Galaxy S9"]},
     "Declined: the question names “Galaxy S9”, which no passage is about."),
    ({"outcome": "no_passages"}, "No passage had a sentence to answer from."),
    ({"outcome": "answered", "picked": [{"passage": 2}, {"passage": 3}],
      "by_date": {"order": "window", "window": "this week"}},
     "Answered with 2 sentences of passages [2] (Aurora X2 — Warranty), [3]; it quotes the asker's own rows "
     "dated this week, earliest first."),
    # Odd shapes (a plugin's or another version's trace) leave parts out, never an error.
    ({"outcome": "declined", "asked": "x", "attempts": ["y", {"closest": "z"}], "thresholds": []},
     "Declined: no sentence states what was asked. No sentence answered (None)."),
    ({"outcome": "answered", "by_date": {"order": "latest"}}, "Answered with 0 sentences."),
    # One row listed "from the earliest" has no order to tell (a bed and breakfast's re-check).
    ({"outcome": "answered", "picked": [{"passage": 3}], "by_date": {"order": "earliest"}},
     "Answered with 1 sentence of passage [3]."),
    ({}, ""), ("declined", ""),
])
def test_the_answerers_reasons_read_as_sentences(why, said):
    # The passages the reader may read are named (passage 1 here is hidden from them).
    assert answerer_sentence(why, passages={2: "Aurora X2 — Warranty"}) == said


def test_what_post_processors_and_augmenters_changed_shows_in_order_with_their_notes_escaped(admin_client, user):
    """The trace's ``postprocess`` and ``response_augmenters`` (``turn.changes``) in words: the
    passages each post-processor dropped, added or moved, by title, and what each augmenter did
    to the answer; a component's note and its name are untrusted text."""
    document = Document.objects.create(source="evil.md", title=XSS, checksum="x")
    dropped = Chunk.objects.create(document=document, ordinal=0, text="t", heading="Prices", space="s1")
    kept = Chunk.objects.create(document=document, ordinal=1, text="u", heading="Warranty", space="s1")
    conversation = Conversation.objects.create(owner=user)
    message = Message.objects.create(conversation=conversation, seq=2, role="assistant", content="x")
    trace = TurnTrace.objects.create(message=message, profile="default", data={
        "question": "q",
        "postprocess": [
            {"by": "similarity_threshold", "in": 3, "out": 3, "dropped": [], "added": [], "reordered": False},
            {"by": XSS, "in": 3, "out": 2, "dropped": [dropped.pk, 999999], "added": [], "reordered": True,
             "order": [kept.pk], "rescored": 2},
        ],
        "response_augmenters": [
            {"by": "citations", "changed": ["citations"]},
            {"by": "references", "changed": ["text"], "note": XSS,
             "text": {"before": 120, "after": 162, "at": 120, "removed": 0, "inserted": 42}},
            {"by": "redact", "changed": ["text"], "streamed": {"in": 90, "out": 84, "changed": True, "tail": 0},
             "text": {"before": 1200, "after": 1196, "at": 40, "removed": 12, "inserted": 8}},
            {"by": "quiet", "changed": []},
        ],
        "timings": {"postprocess": 0.2, "response_augmenters": 0.1, "total": 1.0}})
    for page in (url("conversation_change", conversation.pk), url("turntrace_change", trace.pk)):
        html = admin_client.get(page).content.decode()
        assert "<img src=x" not in html and "<script>alert" not in html, page
        section = html.split('class="ragchat-trace-section ragchat-trace-postprocess"', 1)[1].split("</section>")[0]
        assert "<td><code>similarity_threshold</code></td>" in section and "no change" in section
        assert f"<code>{ESCAPED}</code>" in section and "3 → 2" in section
        assert f"<li>{ESCAPED} — Prices</li>" in section and "chunk 999999 (gone since)" in section
        assert "Reordered; first now:" in section and f"<li>{ESCAPED} — Warranty</li>" in section
        assert "New scores for 2 passages." in section
        answer = html.split('class="ragchat-trace-section ragchat-trace-augmenters"', 1)[1].split("</section>")[0]
        assert "added 42 characters at the end (120 → 162 characters)" in answer
        assert f'<span class="ragchat-note ragchat-component-note">({ESCAPED})</span>' in answer
        assert ("replaced 12 characters with 8 characters at character 40 (1,200 → 1,196 characters); "
                "changed the text as it streamed (90 → 84 characters)") in answer
        assert "citations changed" in answer and '<span class="ragchat-note">no change</span>' in answer
        assert "Other details" not in html


def test_the_traces_one_line_says_what_post_processing_and_the_augmenters_changed(admin_client, chatted, user):
    """The collapsed trace's summary named neither stage though the trace records both (a new
    user's trial): now "post-processing kept 2 of 3" and the augmenters that changed the text,
    whose names are untrusted text."""
    answer = Message.objects.filter(conversation=chatted, role="assistant").last()
    page = admin_client.get(url("conversation_change", chatted.pk)).content.decode()
    summaries = re.findall(r'<span class="ragchat-trace-summary">(.*?)</span>', page)
    steps = answer.trace.data["postprocess"]  # top_k kept 4 of the 6 found
    kept = f"post-processing kept {steps[-1]['out']} of {steps[0]['in']}"
    assert steps[-1]["out"] < steps[0]["in"] and all(f" · {kept} · " in line for line in summaries), summaries
    conversation = Conversation.objects.create(owner=user)
    message = Message.objects.create(conversation=conversation, seq=2, role="assistant", content="x")
    trace = TurnTrace.objects.create(message=message, profile="default", data={
        "question": "q", "documents": [{"chunk_id": 1}, {"chunk_id": 2}],
        "postprocess": [{"by": "similarity_threshold", "in": 3, "out": 3, "dropped": [], "added": [], "reordered": False},
                        {"by": "top_k", "in": 3, "out": 2, "dropped": [7], "added": [], "reordered": False}],
        "response_augmenters": [{"by": "citations", "changed": ["citations"]},
                                {"by": XSS, "changed": ["text"], "text": {"before": 1, "after": 2, "at": 1,
                                                                          "removed": 0, "inserted": 1}}]})
    line = f"post-processing kept 2 of 3 · 2 documents given · answer changed by {ESCAPED}"
    assert f'<span class="ragchat-trace-summary">{line}</span>' in admin_client.get(
        url("conversation_change", conversation.pk)).content.decode()
    assert f'<p class="ragchat-trace-summary">{line}</p>' in admin_client.get(
        url("turntrace_change", trace.pk)).content.decode()


def _chain(*counts, query="", **last):
    """Post-processing steps passing ``counts`` passages along; ``last`` goes in the last step."""
    steps = [{"by": f"p{i}", "in": a, "out": b, "dropped": [0] * max(a - b, 0), "added": [], "reordered": False,
              **({"query": query} if query else {})} for i, (a, b) in enumerate(itertools.pairwise(counts))]
    steps[-1].update(last)
    return steps


@pytest.mark.parametrize(("steps", "said"), [
    ([], ""),
    (_chain(6, 6), ""),  # nothing changed: nothing said
    (_chain(7, 7, 4), "post-processing kept 4 of 7"),
    (_chain(5, 4, query="a") + _chain(5, 3, query="b"), "post-processing kept 7 of 10"),  # a search tool's chains
    (_chain(4, 6, added=[1, 2]), "post-processing: 4 → 6 passages"),
    (_chain(4, 4, reordered=True), "post-processing reordered the passages"),
    (_chain(4, 4, rescored=2), "post-processing rescored the passages"),
    (_chain(4, 4, dropped=[1], added=[2]), "post-processing changed the passages"),
    (_chain(4, 3, **{"in": "?"}), "post-processing changed the passages"),  # no number rather than a wrong one
])
def test_what_post_processing_did_is_said_in_a_few_words(steps, said):
    assert admin_views.postprocess_summary(steps) == said


@pytest.mark.parametrize(("names", "said"), [
    ([], ""),
    (["a"], "answer changed by a"),
    (["a", "b"], "answer changed by a, b"),
    (["a", "b", "c"], "answer changed by 3 augmenters"),
])
def test_the_augmenters_that_changed_the_text_are_named_and_citations_alone_are_not(names, said):
    steps = [{"by": "citations", "changed": ["citations", "sources"]}] + [{"by": n, "changed": ["text"]} for n in names]
    assert admin_views.augmenters_summary(steps) == said


@pytest.mark.parametrize(("step", "sentence"), [
    ({"changed": []}, "no change"),
    ({"changed": ["text"], "text": {"before": 10, "after": 11, "at": 0, "removed": 0, "inserted": 1}},
     "added 1 character at the start (10 → 11 characters)"),
    ({"changed": ["text"], "text": {"before": 10, "after": 12, "at": 4, "removed": 0, "inserted": 2}},
     "added 2 characters at character 4 (10 → 12 characters)"),
    ({"changed": ["text", "sources"], "text": {"before": 10, "after": 7, "at": 7, "removed": 3, "inserted": 0}},
     "removed 3 characters from the end (10 → 7 characters); sources changed"),
    ({"changed": ["text"], "text": {"before": 10, "after": 8, "at": 2, "removed": 2, "inserted": 0}},
     "removed 2 characters at character 2 (10 → 8 characters)"),
    ({"changed": ["text"], "streamed": {"in": 5, "out": 5, "changed": False, "tail": 12}},
     "streamed 12 characters after the model's last piece"),
    ({"changed": ["text"], "text": "odd"}, "changed the text"),
])
def test_what_a_response_augmenter_did_reads_as_a_sentence(step, sentence):
    assert admin_views.answer_change_sentence(step) == sentence


def test_stage_timings_are_listed_in_the_pipelines_order():
    """A new user's trial (PostgreSQL): the trace listed "llm, join, memory, prompt, retrieval,
    postprocess", jsonb's order of keys (by length), neither the pipeline's nor by time."""
    from django_ragchat.admin.views import TraceView, _read_timings

    view = TraceView(data={})
    _read_timings(view, {"timings": {"llm": 9.0, "join": 0.1, "mine": 0.3, "memory": 1.0, "prompt": 0.2,
                                     "retrieval": 3.0, "postprocess": 0.1, "total": 14.0}})
    assert [t.stage for t in view.timings] == ["memory", "retrieval", "join", "postprocess", "prompt", "llm", "mine"]


def test_a_transformer_that_left_the_question_as_it_was_says_so(admin_client, user):
    # A vet practice's trial: "Transformed by followup: When is my next appointment? (no history)"
    # read as a change where there was none.
    conversation = Conversation.objects.create(owner=user)
    message = Message.objects.create(conversation=conversation, seq=1, role="assistant", content="x")
    trace = TurnTrace.objects.create(message=message, profile="default", data={
        "question": "When is my next appointment?",
        "queries": {"original": "When is my next appointment?", "final": "When is my next appointment? vet", "transformed": [
            {"by": "followup", "text": "When is my next appointment?", "note": "no history"},
            {"by": "synonyms", "text": "When is my next appointment? vet", "note": "added vet"}]}})
    html = admin_client.get(url("turntrace_change", trace.pk)).content.decode()
    assert "Left as it was by <code>followup</code>" in html and "no history" in html
    assert "Transformed by <code>synonyms</code>" in html
    assert "Transformed by <code>followup</code>" not in html


@pytest.mark.parametrize(("changelist", "query"), [
    ("conversation_changelist", "profile=%00"), ("document_changelist", "origin=%00"),
    ("document_changelist", "content_type=%00"), ("chunk_changelist", "space=%00"),
    ("feedback_changelist", "rating__exact=%00"), ("memoryrecord_changelist", "kind__exact=%00"),
    ("message_changelist", "role__exact=%00"), ("toolinvocation_changelist", "status__exact=%00"),
    ("turntrace_changelist", "ended_by=%00"), ("message_changelist", "q=a%00b"),
])
def test_a_nul_character_in_a_list_filter_is_django_s_invalid_lookup_answer(admin_client, changelist, query):
    """An outside probe: a NUL in a filter's value reached PostgreSQL, which refuses it in text (a 500
    on eleven filters). Django's answer to a lookup it cannot use: the list again, with "?e=1"."""
    response = admin_client.get(f"{url(changelist)}?{query}")
    assert response.status_code == 302 and response["Location"].endswith("?e=1"), response.status_code
