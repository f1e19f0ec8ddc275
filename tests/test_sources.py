"""Model sources (docs/sources.md): the site's own models as knowledge, kept in sync live and by
``ragchat_sync``, each answer limited to what the asker may read. On SQLite and PostgreSQL (the
suite runs on both).

Live sync acts after the transaction commits, so these tests run in autocommit
(``transactional_db``): a save commits at once, as in a view without ATOMIC_REQUESTS.
"""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group, Permission
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.timezone import localtime

from django_ragchat.access import PUBLIC_ONLY, Principals, access_tokens, principals_for, principals_of_user_id
from django_ragchat.models import Chunk, Conversation, Document, SourceState
from django_ragchat.sources import get_source, paused, sources, sync
from django_ragchat.turn.pipeline import run_turn_sync
from tests.sources_app.models import Article, Note, Page, Tag
from tests.sources_plugin import CountingEmbedder

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sources_on(ragchat_settings_override):
    """The test sources, embedded by the counting embedder (the hashing one, counted)."""
    CountingEmbedder.embedded.clear()
    ragchat_settings_override(PLUGINS=["tests.sources_plugin"], PROFILES={"default": {"embedder": "counting"}})
    yield
    CountingEmbedder.embedded.clear()


def ask(user, question: str):
    """One turn in a new conversation of ``user`` (``None``: anonymous)."""
    conversation = Conversation.objects.create(owner=user, session_key="" if user else "anon")
    return run_turn_sync(conversation, question)


def sources_of(result) -> set[str]:
    return {s["source"] for s in result.message["sources"]}


def found(result, obj, name: str = "articles") -> bool:
    """Whether the answer was given ``obj``'s document as a source."""
    return f"{name}:{obj.pk}" in sources_of(result)


def chunk_texts(article) -> str:
    return "\n".join(Chunk.objects.filter(document__origin="articles", document__object_pk=str(article.pk))
                     .values_list("text", flat=True))


def indexed(article) -> Document | None:
    return Document.objects.filter(origin="articles", object_pk=str(article.pk)).first()


# --- Create, edit, delete ------------------------------------------------------------------------


def test_create_edit_and_delete_reach_answers_when_save_returns(sources_on, user):
    article = Article.objects.create(title="Zorbex 9", body="The Zorbex 9 costs $321 and weighs two kilos.")
    result = ask(user, "How much does the Zorbex 9 cost?")
    assert "$321" in result.answer and f"articles:{article.pk}" in sources_of(result)

    article.body = "The Zorbex 9 costs $299 and weighs two kilos."
    article.save()
    result = ask(user, "How much does the Zorbex 9 cost?")
    assert "$299" in result.answer and "$321" not in result.answer

    article.delete()
    assert indexed(article) is None
    result = ask(user, "How much does the Zorbex 9 cost?")
    assert "$299" not in result.answer and not any(s.startswith("articles:") for s in sources_of(result))


def test_an_unchanged_resave_embeds_nothing_and_a_change_embeds_again(sources_on):
    article = Article.objects.create(title="Quillon", body="The Quillon pen writes for a year.")
    assert any("Quillon pen" in text for text in CountingEmbedder.embedded)
    chunks = list(Chunk.objects.filter(document__origin="articles").values_list("pk", flat=True))
    CountingEmbedder.embedded.clear()
    article.save()
    Article.objects.get(pk=article.pk).save()
    assert CountingEmbedder.embedded == []
    assert list(Chunk.objects.filter(document__origin="articles").values_list("pk", flat=True)) == chunks
    article.body = "The Quillon pen writes for two years."
    article.save()
    assert any("two years" in text for text in CountingEmbedder.embedded)


def test_a_change_of_access_alone_is_stored_without_embedding(sources_on, user, other_user):
    article = Article.objects.create(title="Vantablue", body="Vantablue paint absorbs light.")
    CountingEmbedder.embedded.clear()
    article.owner = user
    article.save()
    assert CountingEmbedder.embedded == []
    document = indexed(article)
    assert document.access == [f"user:{user.pk}"]
    assert all(a == [f"user:{user.pk}"] for a in Chunk.objects.filter(document=document).values_list("access", flat=True))
    assert found(ask(user, "What is Vantablue paint?"), article)
    assert not found(ask(other_user, "What is Vantablue paint?"), article)
    assert not found(ask(None, "What is Vantablue paint?"), article)


def test_a_row_leaving_the_queryset_leaves_the_index(sources_on, user):
    article = Article.objects.create(title="Glimmerstone", body="Glimmerstone glows at night.")
    assert indexed(article) is not None
    article.published = False
    article.save()
    assert indexed(article) is None
    assert not found(ask(user, "Does Glimmerstone glow?"), article)
    article.published = True
    article.save()
    assert found(ask(user, "Does Glimmerstone glow?"), article)


def test_an_object_readable_by_nobody_is_not_indexed(sources_on, ragchat_settings_override):
    from tests import sources_plugin

    class Nobody(sources_plugin.ArticleSource):
        def access(self, obj):
            return []

    source = Nobody()
    article = Article.objects.create(title="Hushwing", body="Hushwing owls fly silently.")
    assert indexed(article) is not None
    report = sync(source, pks=[article.pk])
    assert report.counts["removed"] == 1 and indexed(article) is None


def test_bulk_update_is_caught_by_ragchat_sync_since(sources_on, user):
    kept = Article.objects.create(title="Brindlecap", body="Brindlecap mushrooms are edible.")
    hidden = Article.objects.create(title="Sootfern", body="Sootfern grows in caves.")
    old = Article.objects.create(title="Elderbloom", body="Elderbloom flowers in May.")
    Article.objects.filter(pk=old.pk).update(updated_at=timezone.now() - timedelta(days=3))
    # Bulk updates send no signals: the index still has the old texts.
    Article.objects.filter(pk=kept.pk).update(body="Brindlecap mushrooms are poisonous.", updated_at=timezone.now())
    Article.objects.filter(pk=hidden.pk).update(published=False)
    assert "edible" in chunk_texts(kept) and indexed(hidden) is not None

    CountingEmbedder.embedded.clear()
    out = io.StringIO()
    call_command("ragchat_sync", "--since", "1h", "--no-progress", stdout=out)
    lines = out.getvalue().splitlines()
    articles = next(line for line in lines if line.startswith("articles (since)"))
    assert "1 updated" in articles and "1 removed" in articles and "0 created" in articles
    assert lines[-1].startswith("Synced 2 source(s):")
    # Only the recent object was looked at (the three-day-old one was not even rendered).
    # (the unpublished one is not in the queryset any more: it is only removed).
    assert "1 object(s)" in articles and not any("Elderbloom" in t for t in CountingEmbedder.embedded)
    assert indexed(hidden) is None and "poisonous" in chunk_texts(kept)
    assert found(ask(user, "Are Brindlecap mushrooms poisonous?"), kept)


def test_ragchat_sync_is_idempotent_and_names_unknown_sources(sources_on):
    with paused():  # a big import: nothing is indexed until ragchat_sync
        for n in range(5):
            Article.objects.create(title=f"Item {n}", body=f"Item {n} is number {n}.")
        Page.objects.create(heading="Opening hours", content="We open at nine.")
    assert not Document.objects.filter(origin__in=["articles", "pages"]).exists()
    out = io.StringIO()
    call_command("ragchat_sync", "--no-progress", stdout=out)
    assert "5 created" in out.getvalue() and "Synced 2 source(s): 6 created" in out.getvalue()
    out = io.StringIO()
    CountingEmbedder.embedded.clear()
    call_command("ragchat_sync", "articles", "--no-progress", stdout=out)
    assert out.getvalue().splitlines()[-1] == ("Synced 1 source(s): 0 created, 0 updated, 0 access only, "
                                               "5 unchanged, 0 removed, 0 failed; every object was indexed as it "
                                               "is already (saves and deletes are synced live)")
    assert CountingEmbedder.embedded == []
    state = SourceState.objects.get(name="articles")
    assert state.last_sync["counts"]["unchanged"] == 5 and state.last_sync_finished_at is not None
    with pytest.raises(CommandError, match="No model source named nope; registered: articles, pages"):
        call_command("ragchat_sync", "nope")
    with pytest.raises(CommandError, match="--since"):
        call_command("ragchat_sync", "--since", "yesterday-ish")


def test_a_template_source_renders_its_template(sources_on, user):
    page = Page.objects.create(heading="Opening hours", content="The shop opens at nine and closes at six.")
    document = Document.objects.get(origin="pages", object_pk=str(page.pk))
    headings = set(Chunk.objects.filter(document=document).values_list("heading", flat=True))
    assert document.title == "Page object (%d)" % page.pk and "Opening hours > Content" in headings
    assert found(ask(user, "When does the shop open?"), page, "pages")


def test_an_object_whose_text_fails_fails_alone(sources_on, monkeypatch):
    good = Article.objects.create(title="Goodwood", body="Goodwood is oak.")
    with paused():
        bad = Article.objects.create(title="Badwood", body="Badwood is pine.")
    source = get_source("articles")
    original = type(source).text
    monkeypatch.setattr(type(source), "text", lambda self, obj: 1 / 0 if obj.pk == bad.pk else original(self, obj))
    report = sync(source)
    assert report.counts["failed"] == 1 and report.failures[0][0] == str(bad.pk)
    assert "ZeroDivisionError" in report.failures[0][1] and indexed(good) is not None
    assert "ZeroDivisionError" in SourceState.objects.get(name="articles").last_error


# --- What the text depends on --------------------------------------------------------------------


def test_a_dependent_model_reaches_its_objects_text(sources_on, user):
    first = Article.objects.create(title="Pelican case", body="The Pelican case is waterproof.")
    second = Article.objects.create(title="Heron case", body="The Heron case floats.")
    note = Note.objects.create(article=first, text="It survives a drop of ten metres.")
    assert "ten metres" in Chunk.objects.filter(document=indexed(first)).values_list("text", flat=True)[0]
    note.article = second  # moves: both articles are indexed again
    note.save()
    assert not any("ten metres" in t for t in Chunk.objects.filter(document=indexed(first)).values_list("text", flat=True))
    assert any("ten metres" in t for t in Chunk.objects.filter(document=indexed(second)).values_list("text", flat=True))
    note.delete()
    assert not any("ten metres" in t for t in Chunk.objects.filter(document__origin="articles")
                   .values_list("text", flat=True))


def test_many_to_many_changes_on_either_side_reach_the_metadata(sources_on):
    article = Article.objects.create(title="Loom", body="The Loom weaves.")
    tag = Tag.objects.create(name="textiles")
    article.tags.add(tag)
    assert indexed(article).metadata["tags"] == ["textiles"]
    tag.name = "weaving"
    tag.save()
    assert indexed(article).metadata["tags"] == ["weaving"]
    tag.articles.clear()  # the reverse side
    assert indexed(article).metadata["tags"] == []
    tag.articles.add(article)
    assert indexed(article).metadata["tags"] == ["weaving"]
    tag.delete()  # the link goes with it: the article is indexed again without the tag
    assert indexed(article).metadata["tags"] == []
    article.tags.add(Tag.objects.create(name="looms"))
    from django_ragchat import search
    from django_ragchat.access import UNRESTRICTED
    from django_ragchat.plugins import embedder_for
    from django_ragchat.profiles import get_profile
    embedder = embedder_for(get_profile("default"))
    hits = search.vector_search(embedder.space, embedder.embed(["loom"])[0], 5,
                                filters={"metadata": {"tags": ["weaving"]}}, principals=UNRESTRICTED)
    assert hits == []  # nothing is tagged "weaving" any more
    hits = search.vector_search(embedder.space, embedder.embed(["loom"])[0], 5,
                                filters={"metadata": {"tags": ["looms"]}}, principals=UNRESTRICTED)
    assert {h.document_id for h in hits} == {indexed(article).pk}


def test_a_rolled_back_transaction_enqueues_nothing(sources_on):
    with pytest.raises(RuntimeError), transaction.atomic():
        Article.objects.create(title="Ghost", body="Ghost article.")
        raise RuntimeError
    assert not Document.objects.filter(origin="articles").exists()
    with transaction.atomic():
        article = Article.objects.create(title="Solid", body="Solid article.")
        article.body = "Solid article, edited twice."
        article.save()
        assert indexed(article) is None  # not before the commit
    assert "edited twice" in Chunk.objects.filter(document=indexed(article)).values_list("text", flat=True)[0]


# --- One user's rows: "What did I book?" (docs/sources.md) --------------------------------------

THEATRE_PAGES = [
    ("Hamlet", "Hamlet runs at the Rex Theatre from 10 to 28 June 2025, Tuesday to Saturday at 7:30pm. "
               "Tickets cost £24. The play lasts three hours with one interval."),
    ("The Seagull", "The Seagull runs at the Rex Theatre from 1 to 19 July 2025 at 7pm. Tickets cost £20."),
    ("Booking and tickets", "Book tickets online or at the box office, open daily from noon. "
                            "You can cancel a booking up to 24 hours before the show for a full refund."),
]
# What docs/sources.md's BookingSource writes, and the same facts written as a record.
WRITTEN_AS_ASKED = ("Your booking: Hamlet",
                    "You booked 2 seats for Hamlet at the Rex Theatre on Saturday 14 June 2025 at 19:30: row F, "
                    "seats 12 and 13. Your booking reference is 1042.")
WRITTEN_AS_A_RECORD = ("Booking #1042", "Hamlet\n\n14/06/2025 19:30, row F, seats 12-13.")
MY_QUESTIONS = [
    ("What did I book?",), ("When is my booking?",), ("Which seats did I book?",), ("What time is my show?",),
    ("What's on at the Rex in June?", "What did I book?"),
    ("Tell me about Hamlet", "When is my booking?"),
    ("How do I cancel a booking?", "When is my booking?"),
    ("How do I cancel a booking?", "Thanks. Now, when is my booking?"),
    ("How do I cancel a booking?", "When is my Hamlet booking?"),
    ("What's on at the Rex in June?", "When is my booking?"),
]


@pytest.fixture
def theatre(ragchat_settings_override, other_user):
    """The theatre's public pages and another user's booking; the default profile (the offline
    answerer, the semantic embedder)."""
    ragchat_settings_override(PLUGINS=["tests.bookings_plugin"], PROFILES={"default": {}})
    for title, body in THEATRE_PAGES:
        Article.objects.create(title=title, body=body)
    Article.objects.create(title="Your booking: The Seagull, Friday 4 July 2025", owner=other_user,
                           body="You booked 1 seat for The Seagull at the Rex Theatre on Friday 4 July 2025 at 19:00: "
                                "row B, seat 3. Your booking reference is 2077.")


def answered_from(booking, user, questions) -> tuple[bool, dict]:
    """Whether the last answer of a conversation of ``questions`` quotes and cites ``booking``."""
    conversation = Conversation.objects.create(owner=user)
    for question in questions:
        result = run_turn_sync(conversation, question)
    quoted = "14 June 2025" in result.answer or "14/06/2025" in result.answer
    return quoted and found(result, booking, "theatre"), result.trace


def test_a_booking_written_as_its_user_asks_answers_their_my_questions(theatre, user, other_user):
    booking = Article.objects.create(title=WRITTEN_AS_ASKED[0], body=WRITTEN_AS_ASKED[1], owner=user)
    answered = {}
    for questions in MY_QUESTIONS:
        answered[questions], trace = answered_from(booking, user, questions)
        if questions == ("What's on at the Rex in June?", "When is my booking?"):
            # "When is my booking?" has one word of its own: the opening message is searched with it.
            assert trace["queries"]["final"] == "When is my booking? What's on at the Rex in June?"
    missed = [questions for questions, ok in answered.items() if not ok]
    assert len(missed) <= 1, missed  # docs/sources.md: 9 of 10
    assert {("What did I book?",), ("When is my booking?",), ("Which seats did I book?",),
            ("What's on at the Rex in June?", "What did I book?"),
            ("How do I cancel a booking?", "When is my Hamlet booking?")}.isdisjoint(missed), missed
    # Another user's "my booking" is theirs: this one is never found for them.
    assert not answered_from(booking, other_user, ("What did I book?",))[0]


def test_my_rows_are_listed_together_when_each_states_what_was_asked(theatre, user):
    """A vet practice's trial: "What appointments do I have?" was answered with one appointment
    of two (the other was a source, not in the answer): every row of the source that states the
    question as well as the best one is listed, and another user's never is (``theatre``)."""
    Article.objects.create(title=WRITTEN_AS_ASKED[0], body=WRITTEN_AS_ASKED[1], owner=user)
    Article.objects.create(title="Your booking: The Seagull, Friday 11 July 2025", owner=user,
                           body="You booked 1 seat for The Seagull at the Rex Theatre on Friday 11 July 2025 at 19:00: "
                                "row C, seat 5. Your booking reference is 2101.")
    # "Which bookings do I have?" and "What have I booked?" found the public booking page first
    # (its "cancel a booking"): a question about the asker's own things is answered by their rows.
    for question in ("What did I book?", "Which seats did I book?", "Which bookings do I have?", "What have I booked?"):
        answer = ask(user, question).answer
        assert "14 June 2025" in answer and "11 July 2025" in answer, (question, answer)
        assert "4 July 2025" not in answer and "2077" not in answer, answer  # the other user's booking
    answer = ask(user, "When is my Hamlet booking?").answer
    assert "14 June 2025" in answer and "11 July 2025" not in answer, answer


def test_a_date_in_a_rows_title_is_no_name_its_owner_asks_about(ragchat_settings_override, user, other_user):
    """A bike shop's trial: an order titled "..., placed Saturday 28 November 2026" made that date
    the subject of its passage, and its owner's "What are your opening hours on Saturday?" was
    declined as about opening hours "for Saturday 28 November 2026" (other users were answered)."""
    ragchat_settings_override(PLUGINS=["tests.bookings_plugin"], PROFILES={"default": {}})
    Article.objects.create(title="About Spoke & Sprocket", body=(
        "Spoke & Sprocket is a bike parts shop in Leeds. Our shop is open Monday to Friday from 9am to 6pm "
        "and on Saturday from 10am to 4pm. We are closed on Sundays."))
    Article.objects.create(title="Delivery", body="Standard delivery within the UK takes 2 to 4 working days.")
    Article.objects.create(title="Your order SS-1014, placed Saturday 28 November 2026", owner=user,
                           body="You ordered 2 Trailgrip 29 tyres for $109.98. Your order SS-1014 was shipped.")
    for asker in (user, other_user):
        answer = ask(asker, "What are your opening hours on Saturday?").answer
        assert "10am to 4pm" in answer and "November" not in answer, answer


SHOP_PAGES = [
    ("Delivery", "Standard delivery within the UK takes 2 to 4 working days and costs $4.95. "
                 "Orders over $60 ship free."),
    ("Returns", "You can return unused parts within 30 days. Print the returns label from your order email."),
]


def _shop_with_orders(ragchat_settings_override, orders: list[tuple]) -> list[Article]:
    """The shop's public pages and ``orders`` ((owner, number, text)), each its owner's alone,
    titled "Your order <number>"; the order articles, in order."""
    ragchat_settings_override(PLUGINS=["tests.bookings_plugin"], PROFILES={"default": {}})
    for title, body in SHOP_PAGES:
        Article.objects.create(title=title, body=body)
    return [Article.objects.create(title=f"Your order {number}", owner=owner, body=body)
            for owner, number, body in orders]


def test_a_question_about_my_things_is_answered_by_my_rows_not_the_pages(ragchat_settings_override, user,
                                                                        other_user):
    """A bike shop's trial: "What orders do I have?" and "Which orders have I placed?" quoted the
    delivery page's "Orders over $60 ship free" beside the asker's two orders. A question about
    the asker's own things ("my", "do I have", "did I") is answered by the rows only they may read
    when one states all the best page sentence does; "How do I return my order?" is still the
    returns page's: no order states "return"."""
    _shop_with_orders(ragchat_settings_override, [
        (user, "SS-1014", "You ordered 2 Trailgrip 29 tyres for $109.98. Your order SS-1014 was shipped."),
        (user, "SS-1021", "You ordered 1 Roadline chain for $29.50. Your order SS-1021 is being packed."),
        (other_user, "SS-1007", "You ordered 1 Roadline chain for $29.50. Your order SS-1007 was delivered.")])
    for question in ("What orders do I have?", "Which orders have I placed?", "What did I order?"):
        answer = ask(user, question).answer
        assert "SS-1014" in answer and "SS-1021" in answer and "ship free" not in answer, (question, answer)
        assert "SS-1007" not in answer, answer
        # Stated by the orders, not named by a decline's list of what was found: "placed" is the
        # asker's act, which their row records ("You ordered ...").
        assert "$109.98" in answer and "$29.50" in answer and "don't say" not in answer, (question, answer)
    assert "returns label" in ask(user, "How do I return my order?").answer
    # The other customer's own order, and no page, answers them; the pages answer anyone else.
    answer = ask(other_user, "What orders do I have?").answer
    assert "SS-1007" in answer and "SS-1014" not in answer and "SS-1021" not in answer, answer
    assert "ship free" in ask(None, "Which orders ship free?").answer


def test_an_order_written_as_sources_md_writes_it_answers_its_customers_questions(ragchat_settings_override, user,
                                                                                  other_user):
    """docs/sources.md's order text (an outside trial asked which words it needs): the nouns
    customers ask with ("carrier", "status") are in the sentence, the question's own words and
    "my" are not needed."""
    delivered = date_format(localtime() + timedelta(days=4), "l j F Y")
    order, _ = _shop_with_orders(ragchat_settings_override, [
        (user, "ORD-17", "Your order ORD-17 is shipped (status: shipped), with the carrier PostNord. "
                         f"It should be delivered on {delivered}."),
        (other_user, "ORD-18", "Your order ORD-18 is processing (status: processing).")])
    for question in ("Where is my order?", "Has my order shipped?", "Which carrier is my order with?",
                     "What is the status of my order?"):
        answer = ask(user, question).answer
        assert answer.startswith("Your order ORD-17 is shipped") and "ORD-18" not in answer, (question, answer)
    assert ask(user, "When will my order be delivered?").answer.startswith(f"It should be delivered on {delivered}")
    order.body = f"Your order ORD-17 is shipped (status: shipped), with PostNord. It should be delivered on {delivered}."
    order.save()
    assert "don't say anything about carrier" in ask(user, "Which carrier is my order with?").answer


def test_a_question_about_another_persons_things_is_not_answered_by_my_rows(ragchat_settings_override, user,
                                                                            other_user):
    """A shop's trial: alice's "What is bob's order number?" quoted her own order ("Your order
    ORD-17 was shipped ..."): "order" and "number" were stated, only "bob" was not. A bare
    possessive no passage writes names someone else; "my friend's" or "today's" does not."""
    _shop_with_orders(ragchat_settings_override, [
        (user, "ORD-17", "You ordered a Blue Kettle for $40. Your order ORD-17 was shipped on 2 December."),
        (other_user, "ORD-18", "You ordered a Red Toaster for $30. Your order ORD-18 is being packed.")])
    for question in ("What is bob's order number?", "Has bob\N{RIGHT SINGLE QUOTATION MARK}s order shipped?",
                     "What is the order number of bob?"):
        answer = ask(user, question).answer
        assert "don't mention bob" in answer and "ORD-1" not in answer, (question, answer)
    assert "ORD-17" in ask(user, "What is my order number?").answer
    assert "mention" not in ask(user, "What is today's status of my order?").answer  # read as a window
    assert "ORD-17" in ask(user, "Has my daughter's kettle order shipped?").answer
    assert "ORD-17" in ask(user, "What is the number of my order?").answer  # "of my order" names no one
    # The asker's own name is theirs: by username, first name or full name (a trial's note).
    user.first_name, user.last_name = "Alicia", "Jones"
    user.save()
    for question in ("What is alice's order number?", "What is Alicia's order number?",
                     "Has Alicia Jones's order shipped?"):
        answer = ask(user, question).answer
        assert "ORD-17" in answer and "ORD-18" not in answer, (question, answer)
    assert "don't mention" in ask(user, "What is Jones's order number?").answer  # a surname alone: a relative's


def test_a_numbered_thing_the_asker_has_not_is_declined_not_answered_with_their_others(ragchat_settings_override,
                                                                                     user, other_user):
    """An allotment site's trial: "What is the watering day for plot 12?" asked by the renter of
    plots 4 and 7 quoted both of theirs (plot 12 is another gardener's, hidden from her). A row's
    title names its thing by kind and number ("Your plot: plot 7"), so a number of that kind
    that no row found names is a thing the passages are not about, as an unknown name is."""
    ragchat_settings_override(PLUGINS=["tests.bookings_plugin"], PROFILES={"default": {}})
    Article.objects.create(title="Fees", body="A full plot costs 60 pounds a year and a half plot 35 pounds a year.")
    for owner, number, day in ((user, 4, "Tuesday"), (user, 7, "Thursday"), (other_user, 12, "Monday")):
        Article.objects.create(title=f"Your plot: plot {number}", owner=owner,
                               body=f"You rent plot {number}. Your watering day for plot {number} is {day}.")
    for question in ("What is the watering day for plot 12?", "Tell me about plot 12"):
        answer = ask(user, question).answer
        assert "don't mention plot 12" in answer and "Tuesday" not in answer and "Monday" not in answer, answer
    assert ask(user, "What is the watering day for plot 4?").answer.startswith("Your watering day for plot 4 is Tuesday")
    assert "Monday" in ask(other_user, "What is the watering day for plot 12?").answer
    conversation = Conversation.objects.create(owner=user)
    run_turn_sync(conversation, "What is my watering day for plot 7?")
    answer = run_turn_sync(conversation, "What is the watering day for plot 12, and who owns it?").answer
    assert "don't mention plot 12" in answer and "Thursday" not in answer, answer
    assert "60 pounds" in ask(user, "How much does a full plot cost per year?").answer  # a page names no number


def test_a_follow_up_pointing_at_a_pages_topic_is_not_answered_from_another_page(ragchat_settings_override, user):
    """The allotment site's trial: "And what is not allowed in it?" after "What can I put in the
    compost?" quoted the water rules' "Hosepipes are not allowed". "it" is the compost, the
    title of a page found: asked as the same question typed whole is (declined here: "not
    allowed" and "do not put" share no word), never answered from another page."""
    ragchat_settings_override(PLUGINS=["tests.bookings_plugin"], PROFILES={"default": {}})
    Article.objects.create(title="Water rules", body="Hosepipes are not allowed on the allotments; please water "
                                                     "with watering cans filled at the standpipes.")
    Article.objects.create(title="Compost", body="The compost bays are behind the tool shed. Do not put diseased "
                                                 "plants, cooked food or plastic in the compost.")
    Article.objects.create(title="Fees", body="The annual rent for a full plot is 60 pounds, due on 1 March.")
    conversation = Conversation.objects.create(owner=user)
    assert "compost" in run_turn_sync(conversation, "What can I put in the compost?").answer
    answer = run_turn_sync(conversation, "And what is not allowed in it?").answer
    assert "Hosepipes" not in answer, answer
    assert "Hosepipes" not in ask(user, "What is not allowed in the compost?").answer


def test_a_recipe_named_by_its_last_words_is_the_subject_not_the_one_asked_of_before(ragchat_settings_override,
                                                                                  user):
    """A recipe site's trial: "How many people does the lentil soup serve?" after a question on
    the Vegetable Curry was searched with "Vegetable Curry" added and answered with the curry's
    ingredient list ("Rice to serve"). "lentil soup" names the Red Lentil Soup (all but its first
    word), in the search and in the answer."""
    ragchat_settings_override(PLUGINS=["tests.bookings_plugin"], PROFILES={"default": {}})
    for title, ingredients in (("Red Lentil Soup", "200 g red lentils\n1 onion\n1 litre vegetable stock"),
                               ("Vegetable Curry", "1 onion\n2 tablespoons curry paste\n200 g spinach\nRice to serve"),
                               ("Pancakes", "100 g plain flour\n2 eggs\nLemon wedges and sugar to serve")):
        Article.objects.create(title=title, body=f"## Ingredients\n\n{ingredients}\n\n## Cooking time\n\n"
                                                 f"The {title} takes 30 minutes to cook.")
    conversation = Conversation.objects.create(owner=user)
    run_turn_sync(conversation, "How long does the vegetable curry take?")
    result = run_turn_sync(conversation, "How many people does the lentil soup serve?")
    assert "Vegetable Curry" not in result.trace["queries"]["final"]
    assert "to serve" not in result.answer and "Red Lentil Soup" in result.answer, result.answer


def test_what_goes_into_a_recipe_and_how_many_it_serves_are_answered(ragchat_settings_override, user):
    """The same trial: "What goes into the vegetable curry?" was declined ("goes" was asked as a
    word no sentence states; "go" and "going" ask nothing, "goes" now neither) and "How many
    people does the lentil soup serve?" was declined with "Serves 4." in the method (a line under
    twelve characters was dropped as a fragment; one stating a value is a sentence)."""
    ragchat_settings_override(PLUGINS=["tests.bookings_plugin"], PROFILES={"default": {}})
    for title, ingredients, method in (
            ("Red Lentil Soup", "200 g red lentils\n1 onion\n1 litre vegetable stock",
             "Simmer the lentils in the stock for 25 minutes, then blend until smooth. Serves 4."),
            ("Vegetable Curry", "1 onion\n2 tablespoons curry paste\n400 ml coconut milk\n200 g spinach",
             "Fry the onion, stir in the paste and the coconut milk and simmer for 20 minutes. Serves 2.")):
        Article.objects.create(title=title, body=f"## Ingredients\n\n{ingredients}\n\n## Method\n\n{method}")
    assert "coconut milk" in ask(user, "What goes into the vegetable curry?").answer
    answer = ask(user, "How many people does the lentil soup serve?").answer
    assert "Serves 4" in answer and "Serves 2" not in answer, answer


def test_a_cookbooks_recipes_are_named_by_their_ends_and_their_lists_quoted_whole(ragchat_settings_override, user):
    """A cookbook site's trial: "How many people does the chickpea curry serve?" was declined,
    and in a conversation about the cake answered with the cake's "Serves 10" ("chickpea curry",
    the first and last words of "Chickpea and Spinach Curry", named no recipe; the answerer read
    the title as a "Spinach Curry"); "How much feta goes in the Greek salad?" was declined as about
    a "green salad" ("Greek", a word of the title alone, was read as a slip for "green"); "What
    ingredients do I need...?" quoted 2 of the 6 ingredients. The curry's own lines use
    "chickpeas" and "curry" ("curry paste"): its name's first and last words side by side name
    it, where no single word of them does."""
    ragchat_settings_override(PLUGINS=["tests.bookings_plugin"], PROFILES={"default": {}})
    for title, ingredients, serves in (
            ("Chickpea and Spinach Curry", "2 tins chickpeas, drained\n- 200 g fresh spinach\n- 1 onion, diced\n"
                                           "- 2 tbsp curry paste", 4),
            ("Lemon Drizzle Cake", "225 g butter, softened\n- 225 g caster sugar\n- 4 eggs\n- 275 g self-raising "
                                   "flour\n- 2 lemons, zested\n- 85 g granulated sugar for the drizzle", 10),
            ("Greek Salad", "4 ripe tomatoes, cut into wedges\n- 1 green pepper, sliced\n- 200 g block of feta "
                            "cheese\n- 16 black olives", 4)):
        Article.objects.create(title=title, body=f"A favourite of ours.\n\n## Ingredients\n\n- {ingredients}\n\n"
                                                 f"## Method\n\nMix everything, cook it with care and serve. Serves {serves}.")
    assert "Serves 4" in ask(user, "How many people does the chickpea curry serve?").answer
    conversation = Conversation.objects.create(owner=user)
    run_turn_sync(conversation, "What goes into the lemon drizzle cake?")
    answer = run_turn_sync(conversation, "How many people does the chickpea curry serve?").answer
    assert "Serves 4" in answer and "Serves 10" not in answer, answer
    answer = ask(user, "How much feta goes in the Greek salad?").answer
    assert "feta cheese" in answer and "green pepper" not in answer, answer
    answer = ask(user, "What ingredients do I need for the lemon drizzle cake?").answer
    lines = answer.splitlines()
    assert len(lines) == 6 and all(line.startswith("- ") for line in lines), answer
    assert "4 eggs" in answer and "225 g caster sugar" in answer and "chickpeas" not in answer, answer


def test_the_other_case_of_a_situation_continues_the_answer(ragchat_settings_override, user):
    """A helpdesk site's trial: "What should I do if I lose my phone with two-factor login?" was
    answered with the section's first case alone; its second ("If you have no backup codes
    left, ...") states no asked word but is the same situation's other case."""
    ragchat_settings_override(PLUGINS=["tests.bookings_plugin"], PROFILES={"default": {}})
    Article.objects.create(title="Two-factor login", body=(
        "## Backup codes\n\nWhen you turn on 2FA, you get ten backup codes. Each code works once.\n\n"
        "## Lost phone\n\nIf you lose your phone, sign in with one of your backup codes and set up 2FA "
        "again on your new phone. If you have no backup codes left, contact support: identity "
        "verification takes up to 2 business days. Support is open on weekdays."))
    answer = ask(user, "What should I do if I lose my phone with two-factor login?").answer
    assert "sign in with one of your backup codes" in answer and "contact support" in answer, answer
    assert "weekdays" not in answer, answer


VET_PAGES = [
    ("Booking an appointment", "Book an appointment online or call 0161 555 0100. Appointments last 15 minutes."),
    ("Vaccinations", "Puppies need two vaccination appointments, two to four weeks apart."),
    ("Cancelling appointments", "Cancel an appointment at least 24 hours ahead, or a fee of £20 applies."),
    ("Neutering", "Neutering appointments are on weekday mornings. Drop your pet off at 8am."),
    ("Dental care", "Dental appointments include a scale and polish under anaesthetic."),
]


def test_a_question_about_my_things_searches_my_rows_too(ragchat_settings_override, user, other_user):
    """A vet practice's trial: "Which pets do I have appointments for?" retrieved neither of the
    asker's appointments: five public pages say "appointments" and took the top ``k``. A question
    about the asker's own things is searched a second time among the rows shared with them by
    name (``asker_rows``), and their row's title ("Your appointment: Biscuit") says what each of
    its sentences is about."""
    ragchat_settings_override(PLUGINS=["tests.bookings_plugin"], PROFILES={"default": {}})
    for title, body in VET_PAGES:
        Article.objects.create(title=title, body=body)
    group = Group.objects.create(name="Vets")
    user.groups.add(group)
    Article.objects.create(title="Rota", group=group, body="The rota lists every vet's appointments this week.")
    mine = [Article.objects.create(title=f"Your appointment: {pet}", owner=user, body=body) for pet, body in (
        ("Biscuit", "Biscuit, your cat, is booked in for a vaccination booster on Tuesday 8 December at 10:15."),
        ("Mittens", "Mittens, your kitten, is booked in for neutering on Thursday 10 December at 8am."))]
    Article.objects.create(title="Your appointment: Rex", owner=other_user,
                           body="Rex, your labrador, is booked in for a dental check on Friday 11 December at 9am.")

    result = ask(user, "What appointments do I have?")

    assert "8 December" in result.answer and "10 December" in result.answer, result.answer
    assert "11 December" not in result.answer, result.answer
    assert result.trace["queries"]["expanded"] == [
        "What appointments do I have?", "What appointments do I have? (only the asker's own rows)"]
    own_search = [r for r in result.trace["retrieval"] if r["query"].endswith("(only the asker's own rows)")]
    found_ids = {h["chunk_id"] for r in own_search for h in r["hits"]}
    assert {c.document.object_pk for c in Chunk.objects.filter(pk__in=found_ids)} == {str(a.pk) for a in mine}
    # Nobody else's rows, not even the group's: only what is shared with the asker by name.
    assert found(result, mine[0], "theatre") and found(result, mine[1], "theatre")
    # The trace says among whose rows the second search looked, not as if it were searched text.
    trace = admin_page_of_trace(result)
    assert "searched “What appointments do I have?” among only the rows shared with the asker by name" in trace
    assert "(only the asker" not in trace
    # An anonymous visitor has no rows of their own: no second search.
    assert ask(None, "What appointments do I have?").trace["queries"]["expanded"] == ["What appointments do I have?"]
    assert "Cancel an appointment" in ask(user, "How do I cancel my appointment?").answer


def test_my_next_session_is_my_booking(ragchat_settings_override, user):
    """A climbing gym's trial: "When is my next bouldering session?" was declined "about next for
    Bouldering" with the asker's booking the first passage: "next" says which of them, as
    "exactly" says how (words.toml ``qualifying``)."""
    ragchat_settings_override(PLUGINS=["tests.bookings_plugin"], PROFILES={"default": {}})
    Article.objects.create(title="Beginner courses", body=(
        "The Intro to Bouldering course runs over three weekly sessions of 90 minutes each and costs £65."))
    Article.objects.create(title="Your booking: Intro to Bouldering course", owner=user, body=(
        "You booked the Intro to Bouldering course (session 2 of 3) with instructor Maya Lindqvist on Saturday "
        "12 December 2026 at 10:00. Your booking reference is CRX-4821."))
    answer = ask(user, "When is my next bouldering session?").answer
    assert "Saturday 12 December 2026 at 10:00" in answer, answer


def admin_page_of_trace(result) -> str:
    """The admin's page of ``result``'s trace, as a superuser reads it."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    from django_ragchat.models import TurnTrace

    client = Client()
    client.force_login(get_user_model().objects.create_superuser("trace-reader", "t@example.com", "pw"))
    trace = TurnTrace.objects.get(message_id=result.message["id"])
    return client.get(f"/admin/django_ragchat/turntrace/{trace.pk}/change/").content.decode()


def test_users_only_narrows_principals_to_the_user():
    from django_ragchat.access import UNRESTRICTED, users_only

    reader = Principals(frozenset({"public", "authenticated", "user:7", "group:2", "perm:shop.view_order"}))
    assert users_only(reader).tokens == frozenset({"user:7"})
    assert reader.covers(users_only(reader))
    assert users_only(PUBLIC_ONLY).tokens == frozenset() and users_only(UNRESTRICTED).tokens == frozenset()


def test_the_same_booking_written_as_a_record_answers_none_of_them(theatre, user):
    booking = Article.objects.create(title=WRITTEN_AS_A_RECORD[0], body=WRITTEN_AS_A_RECORD[1], owner=user)
    answered = [questions for questions in MY_QUESTIONS if answered_from(booking, user, questions)[0]]
    assert answered == []


def test_with_the_hashing_embedder_my_questions_are_answered_from_my_rows_too(theatre, user,
                                                                              ragchat_settings_override):
    """The public page's "cancel a booking" answered "When is my booking?" (4 of 10) until a
    question about the asker's own things went to their rows first, which needs no meaning."""
    ragchat_settings_override(PROFILES={"default": {"embedder": "hashing"}})
    call_command("ragchat_sync", "--no-progress", stdout=io.StringIO())  # the pages in the hashing space
    booking = Article.objects.create(title=WRITTEN_AS_ASKED[0], body=WRITTEN_AS_ASKED[1], owner=user)
    answered = {questions: answered_from(booking, user, questions)[0] for questions in MY_QUESTIONS}
    assert sum(answered.values()) >= 9, answered  # docs/sources.md: 9 of 10
    assert answered[("When is my booking?",)] and answered[("What did I book?",)]
    assert answered[("What's on at the Rex in June?", "When is my booking?")]  # searched with "Rex June"


# --- With a worker: the request pays one enqueue -------------------------------------------------


def run_worker() -> None:
    call_command("db_worker", "--batch", "--backend", "database", "--no-startup-delay", verbosity=0)


def test_with_a_worker_a_save_pays_one_enqueue_and_the_worker_indexes(sources_on, ragchat_settings_override, user):
    ragchat_settings_override(TASK_BACKEND="database")
    with CaptureQueriesContext(connection) as queries:
        article = Article.objects.create(title="Cobalt kettle", body="The Cobalt kettle boils in ninety seconds.")
    inserts = [q["sql"] for q in queries.captured_queries if q["sql"].lstrip().upper().startswith("INSERT")]
    assert len(inserts) == 2 and "dbtaskresult" in inserts[1].lower(), inserts
    assert len(queries.captured_queries) <= 3, [q["sql"] for q in queries.captured_queries]
    assert CountingEmbedder.embedded == [] and indexed(article) is None
    from django_ragchat import tasks
    assert tasks.pending(tasks.sync_source_objects, "articles") == 1
    run_worker()
    assert tasks.pending(tasks.sync_source_objects, "articles") == 0
    assert found(ask(user, "How fast does the Cobalt kettle boil?"), article)
    pk = article.pk
    article.delete()
    assert Document.objects.filter(origin="articles", object_pk=str(pk)).exists()  # until the worker runs
    run_worker()
    assert not Document.objects.filter(origin="articles", object_pk=str(pk)).exists()


# --- Who may read what ---------------------------------------------------------------------------


def test_group_and_permission_changes_apply_to_the_next_turn(sources_on, user):
    group = Group.objects.create(name="Gardeners")
    mulch = Article.objects.create(title="Mulch", body="Mulch recipe: three parts bark.", group=group)
    permission = Permission.objects.get(codename="view_tag")
    compost = Article.objects.create(title="Compost", body="Compost secret: add coffee grounds.",
                                     permission="sources_app.view_tag")
    conversation = Conversation.objects.create(owner=user)

    def sees(article) -> bool:
        return found(run_turn_sync(conversation, f"Tell me about {article.title}."), article)

    assert not sees(mulch)
    user.groups.add(group)
    assert sees(mulch)
    assert not sees(compost)
    user.user_permissions.add(permission)
    assert sees(compost)
    user.groups.remove(group)
    assert not sees(mulch)


def test_principals_of_a_user(user, staff_user, django_user_model):
    group = Group.objects.create(name="Readers")
    group.permissions.add(Permission.objects.get(codename="change_tag"))  # granted through the group
    user.groups.add(group, Group.objects.create(name="Writers"))
    user.user_permissions.add(Permission.objects.get(codename="view_tag"))
    with CaptureQueriesContext(connection) as queries:
        principals = principals_of_user_id(user.pk)
    assert len(queries) == 1  # the flags, the groups and the permissions: one statement (a turn reads it)
    writers = Group.objects.get(name="Writers").pk
    assert principals.tokens == {"public", "authenticated", f"user:{user.pk}", f"group:{group.pk}",
                                 f"group:{writers}", "perm:sources_app.view_tag", "perm:sources_app.change_tag"}
    assert principals == principals_for(user)  # the fast path agrees with Django's backends
    assert "staff" in principals_of_user_id(staff_user.pk).tokens
    superuser = django_user_model.objects.create_superuser("root", password="pw")
    assert principals_of_user_id(superuser.pk) == principals_for(superuser)
    assert len(principals_of_user_id(superuser.pk).tokens) > Permission.objects.count()
    user.is_active = False
    user.save()
    assert principals_of_user_id(user.pk) == PUBLIC_ONLY == principals_of_user_id(None)
    assert principals_of_user_id(10**9) == PUBLIC_ONLY
    assert access_tokens([user, group, "sources_app.view_tag", "staff"]) == (
        f"group:{group.pk}", "perm:sources_app.view_tag", "staff", f"user:{user.pk}")
    with pytest.raises(ValueError, match="not an access token"):
        access_tokens("everyone!")
    assert Principals(frozenset({"public", "user:1"})).covers(PUBLIC_ONLY)


def test_the_documents_api_lists_what_the_caller_may_read(sources_on, client, user, other_user, staff_user):
    public = Article.objects.create(title="Open letter", body="Everyone reads this.")
    mine = Article.objects.create(title="Diary", body="Only Alice reads this.", owner=user)
    staff = Article.objects.create(title="Staff memo", body="Staff only.", staff_only=True)
    listed = {}
    for who in (user, other_user, staff_user):
        client.force_login(who)
        response = client.get("/api/ragchat/documents/?limit=100")
        assert response.status_code == 200
        listed[who.username] = {d["source"] for d in response.json()["results"]}
        detail = client.get(f"/api/ragchat/documents/{indexed(mine).pk}/")
        assert detail.status_code == (200 if who == user else 404)
    assert listed["alice"] == {f"articles:{public.pk}", f"articles:{mine.pk}"}
    assert listed["bob"] == {f"articles:{public.pk}"}
    assert listed["staff"] == {f"articles:{public.pk}", f"articles:{staff.pk}"}


def test_a_source_whose_chunk_became_unreadable_shows_no_passage(sources_on, client, user):
    article = Article.objects.create(title="Menu", body="The soup of the day is tomato.")
    conversation = Conversation.objects.create(owner=user)
    run_turn_sync(conversation, "What is the soup of the day?")
    client.force_login(user)
    sources = client.get(f"/api/ragchat/conversations/{conversation.pk}/messages/").json()["results"][1]["sources"]
    assert any("tomato" in s["snippet"] for s in sources)
    article.staff_only = True
    article.save()
    sources = client.get(f"/api/ragchat/conversations/{conversation.pk}/messages/").json()["results"][1]["sources"]
    menu = [s for s in sources if s["source"] == f"articles:{article.pk}"]
    assert menu and all(s["snippet"] == "" and s["heading"] == "" for s in menu)


def test_ingest_access_keeps_files_from_those_who_may_not_read_them(sources_on, tmp_path, user, staff_user):
    path = tmp_path / "handbook.md"
    path.write_text("# Staff handbook\n\n## Discounts\n\nStaff get 30% off every product.\n")
    out = io.StringIO()
    call_command("ragchat_ingest", str(path), "--access", "staff", "--no-progress", stdout=out)
    document = Document.objects.get(source__endswith="/handbook.md")
    assert document.access == ["staff"] and "1 created" in out.getvalue()
    assert "30% off" not in ask(user, "What discount do staff get?").answer
    assert "30% off" in ask(staff_user, "What discount do staff get?").answer
    CountingEmbedder.embedded.clear()
    call_command("ragchat_ingest", str(path), "--no-progress", stdout=out)  # back to everyone
    assert CountingEmbedder.embedded == [] and Document.objects.get(pk=document.pk).access == ["public"]
    assert "30% off" in ask(user, "What discount do staff get?").answer
    with pytest.raises(CommandError, match="--access"):
        call_command("ragchat_ingest", str(path), "--access", "the cleaners")


def test_the_in_process_index_sees_an_access_change_at_once(sources_on, user, other_user):
    article = Article.objects.create(title="Saffron", body="Saffron comes from crocus flowers.", owner=user)
    assert not found(ask(other_user, "Where does saffron come from?"), article)  # loads the index
    article.owner = None
    article.save()  # access only: no chunk id changes
    assert found(ask(other_user, "Where does saffron come from?"), article)
    article.owner = user
    article.save()
    assert not found(ask(other_user, "Where does saffron come from?"), article)


# --- Checks, listing, admin ----------------------------------------------------------------------


def test_broken_sources_are_reported_with_stable_ids(ragchat_settings_override):
    from django_ragchat.checks import check_sources

    ragchat_settings_override(PLUGINS=["tests.sources_plugin", "tests.broken_sources_plugin"])
    found = {e.id: e.msg for e in check_sources()}
    assert set(found) == {f"ragchat.E05{n}" for n in range(8)}, found
    assert "not a ModelSource subclass" in found["ragchat.E050"]
    assert "articles" in found["ragchat.E051"]
    assert "no relation 'nowhere'" in found["ragchat.E055"]
    assert "does not exist" in found["ragchat.E054"]
    # The valid ones still sync.
    assert set(sources()) == {"articles", "pages"}


def test_a_source_never_synced_is_a_warning_until_synced(sources_on):
    from django_ragchat.checks import check_sources

    with paused():
        Article.objects.create(title="Unsynced", body="Not yet indexed.")
    assert [e.id for e in check_sources()] == ["ragchat.W050"]
    call_command("ragchat_sync", "articles", "--no-progress", stdout=io.StringIO())
    assert check_sources() == []


def test_ragchat_plugins_lists_the_sources(sources_on):
    out = io.StringIO()
    call_command("ragchat_plugins", stdout=out)
    assert "articles: sources_app.Article (live; follows sources_app.Note, sources_app.Tag) from " \
           "tests.sources_plugin" in out.getvalue()
    assert "pages: sources_app.Page (live)" in out.getvalue()


def test_the_admin_shows_each_sources_state_and_resyncs(sources_on, client, django_user_model, user):
    admin = django_user_model.objects.create_superuser("root", password="pw")
    Article.objects.create(title="Atlas", body="The Atlas is a map.")
    Article.objects.create(title="Private atlas", body="Alice's map.", owner=user)
    client.force_login(admin)
    page = client.get("/admin/django_ragchat/sourcestate/").content.decode()
    assert "articles" in page and "sources_app.Article" in page and "pages" in page
    state = SourceState.objects.get(name="articles")
    response = client.post("/admin/django_ragchat/sourcestate/", {"action": "resync", "_selected_action": [state.pk]},
                           follow=True)
    assert "Resynced articles" in response.content.decode()
    assert SourceState.objects.get(name="articles").last_sync["counts"]["unchanged"] == 2
    # The list says what the last sync did, not its stored JSON.
    row = client.get("/admin/django_ragchat/sourcestate/").content.decode().split('class="field-last_sync_summary">')[1]
    assert "2 unchanged" in row.split("</td>")[0] and "&quot;counts&quot;" not in row.split("</td>")[0]
    # Its time is written as the row's other times are (a trial saw ISO beside Django's format).
    finished = SourceState.objects.get(name="articles").last_sync_finished_at
    assert date_format(localtime(finished), "DATETIME_FORMAT") in row.split("</td>")[0]
    # No "Delete selected": a registered source's row would come back on the next visit.
    assert "delete_selected" not in client.get("/admin/django_ragchat/sourcestate/").content.decode()
    # Documents and chunks: who may read each is shown; what the superuser may not read is not listed.
    documents = client.get("/admin/django_ragchat/document/").content.decode()
    assert "Atlas" in documents and "Private atlas" not in documents and "everyone" in documents
    chunk = Chunk.objects.filter(document__title="Atlas").first()
    assert "everyone" in client.get(f"/admin/django_ragchat/chunk/{chunk.pk}/change/").content.decode()
    # "Re-ingest" of a model source's document syncs it from its object.
    response = client.post("/admin/django_ragchat/document/", {
        "action": "reingest", "_selected_action": [chunk.document_id]}, follow=True)
    assert "Synced from their objects: articles (objects): 1 object(s)" in response.content.decode()


def test_the_source_list_says_how_to_register_a_source_when_there_is_none(admin_client):
    # A new bike shop's staff saw "0 model sources" and nothing on what a source is.
    page = admin_client.get("/admin/django_ragchat/sourcestate/").content.decode()
    assert "No model source is registered." in page and "docs/sources.md" in page


def test_the_source_list_counts_only_what_the_member_of_staff_may_see(sources_on, client, user, staff_user):
    Article.objects.create(title="Atlas", body="The Atlas is a map.")
    Article.objects.create(title="Private atlas", body="Alice's map.", owner=user)
    Article.objects.create(title="Second private atlas", body="Alice's other map.", owner=user)
    staff_user.user_permissions.add(Permission.objects.get(codename="view_sourcestate"))
    client.force_login(staff_user)

    def row() -> dict[str, str]:
        page = client.get("/admin/django_ragchat/sourcestate/").content.decode()
        cells = page.split("articles</a>")[1].split("</tr>")[0]
        return {name: cells.split(f'class="field-{name}">')[1].split("</td>")[0]
                for name in ("objects", "indexed", "chunks")}

    # Alice's two articles are neither counted among the documents nor among the objects.
    seen = row()
    assert ">1</a>" in seen["indexed"] and seen["chunks"] == "1"
    assert seen["objects"] == "(you may not view these objects)"
    state = SourceState.objects.get(name="articles")
    assert "(you may not view these objects)" in client.get(
        f"/admin/django_ragchat/sourcestate/{state.pk}/change/").content.decode()
    # A source whose every object is indexed and readable by them tells nothing more by its count.
    Article.objects.filter(owner=user).delete()
    assert row()["objects"] == "1"
    Article.objects.create(title="Private atlas", body="Alice's map.", owner=user)
    Article.objects.create(title="Second private atlas", body="Alice's other map.", owner=user)
    # With the model's view permission the objects are counted (the model's own admin lists them).
    staff_user.user_permissions.add(Permission.objects.get(codename="view_article"))
    assert row()["objects"] == "3"
    # ... and so are the documents they may not read: "1" alone read as nothing indexed (a trial).
    assert ">1</a> (and 2 you may not read)" in row()["indexed"]


def _on(days: int) -> str:
    """A date ``days`` from today as a site's row writes it ("Tuesday 8 December 2026")."""
    return date_format(timezone.localdate() + timedelta(days=days), "l j F Y")


def test_my_rows_are_read_by_their_dates(ragchat_settings_override, user, other_user):
    """A climbing gym's and a library's trials: "When is my next loan due?" listed both loans, the
    later first; "What do I have booked this week?" quoted the kids' parties page ("book a party
    one week ahead"); "What time is my session?" got "Every coached session lasts 90 minutes".
    The asker's rows are read by the dates they write: the soonest still to come answers "next",
    a window of time keeps the rows dated in it (or says none is), the rest come in date order,
    and a time of day states "what time"."""
    ragchat_settings_override(PLUGINS=["tests.bookings_plugin"], PROFILES={"default": {}})
    Article.objects.create(title="Sessions", body=(
        "Every coached session lasts 90 minutes. Kids' parties run at weekends; book a party at least "
        "one week ahead."))
    for days, what, ref in ((16, "Lead climbing workshop", "CRX-5110"), (2, "Intro to Bouldering session", "CRX-4821"),
                            (-3, "Rope skills session", "CRX-4102")):
        Article.objects.create(title=f"Your booking: {what}", owner=user, body=(
            f"You booked the {what} on {_on(days)} at 10:00. Your booking reference is {ref}."))
    Article.objects.create(title="Your booking: Yoga session", owner=other_user, body=(
        f"You booked the Yoga session on {_on(1)} at 10:00. Your booking reference is CRX-9999."))

    answer = ask(user, "When is my next session?").answer
    assert _on(2) in answer and _on(16) not in answer and _on(-3) not in answer, answer
    answer = ask(user, "What have I booked?").answer
    assert answer.index(_on(-3)) < answer.index(_on(2)) < answer.index(_on(16)), answer
    answer = ask(user, "What do I have booked this week?").answer  # today + 2 is always in it
    assert _on(2) in answer and _on(16) not in answer and "party" not in answer, answer
    assert ask(user, "What do I have booked today?").answer == "I can't see anything of yours dated today."
    answer = ask(user, "What time is my bouldering session?").answer
    assert f"{_on(2)} at 10:00" in answer and "90 minutes" not in answer, answer
    assert "CRX-9999" not in ask(user, "What have I booked tomorrow?").answer
    assert "90 minutes" in ask(user, "How long is a session?").answer


def test_the_trace_says_why_none_of_my_rows_answers_a_window(ragchat_settings_override, user):
    """Staff read why "What do I have booked this week?" was answered that none is, though the
    kids' parties page states "book" and "week": the asker's only booking is in 16 days."""
    ragchat_settings_override(PLUGINS=["tests.bookings_plugin"], PROFILES={"default": {}})
    Article.objects.create(title="Sessions", body="Kids' parties run at weekends; book a party one week ahead.")
    Article.objects.create(title="Your booking: Rope skills session", owner=user,
                           body=f"You booked the Rope skills session on {_on(16)} at 10:00.")
    result = ask(user, "What do I have booked this week?")
    assert result.answer == "I can't see anything of yours dated this week."
    trace = admin_page_of_trace(result)
    assert "The asker&#x27;s own rows found are all dated outside the time asked; the closest other sentence" in trace


def test_my_next_loan_is_read_by_its_due_date(ragchat_settings_override, user):
    """A library's trial: "When is my next loan due?" listed both loans, the later first. Each
    loan writes two dates; the one after the asked word ("due") orders them, not the first."""
    ragchat_settings_override(PLUGINS=["tests.bookings_plugin"], PROFILES={"default": {}})
    Article.objects.create(title="Borrowing", body="You can borrow up to 12 books for three weeks at a time.")
    for book, borrowed, due in (("Middlemarch", -5, 16), ("Persuasion", -19, 3)):
        Article.objects.create(title=f"Your loan: {book}", owner=user, body=(
            f"You borrowed {book} on {_on(borrowed)}; it is due back on {_on(due)}."))
    answer = ask(user, "When is my next loan due?").answer
    assert _on(3) in answer and "Middlemarch" not in answer, answer
    answer = ask(user, "When did I borrow Persuasion?").answer
    assert _on(-19) in answer, answer


DENTAL_PAGES = [
    ("Opening hours", "Smile Street Dental is open Monday to Friday from 8:00 to 18:00, and on Saturday from 9:00 to "
                      "13:00. We are closed on Sundays and bank holidays."),
    ("Late evenings", "On Thursdays we stay open until 20:00 for check-ups and hygiene appointments."),
    ("Prices", "A check-up with one of our dentists costs £55 for adults and is free for children under 18."),
    ("Emergency appointments", "If you are in pain or have broken a tooth, call us on 020 7946 0123 as soon as we "
                               "open and we will see you the same day. An emergency appointment costs £80, plus the "
                               "cost of any treatment."),
    ("Our team", "Dr Sarah Okafor is our principal dentist and leads our hygiene team. Dr James Patel does "
                 "check-ups, fillings and root canal treatment."),
]


def _dental_practice(ragchat_settings_override, user) -> None:
    ragchat_settings_override(PLUGINS=["tests.bookings_plugin"], PROFILES={"default": {}})
    for title, body in DENTAL_PAGES:
        Article.objects.create(title=title, body=body)
    for days, what, who in ((-22, "hygiene visit", "Dr Sarah Okafor"), (2, "check-up", "Dr James Patel"),
                            (12, "teeth whitening session", "Dr Emma Reid")):
        Article.objects.create(title=f"Your appointment: {what}", owner=user,
                               body=f"You booked a {what} with {who} on {_on(days)} at 14:15.")


def test_a_dental_practices_patient_asks_about_their_appointments(ragchat_settings_override, user):
    """A dental practice's trial (PostgreSQL, Django 6.1): "Do I have anything booked this week?"
    was declined as another topic's (the opening hours page's heading), though the asker's
    check-up in two days was found; "Which dentist am I seeing next?" was no question about the
    asker's own things ("am I seeing") and got the emergency page's phone number."""
    _dental_practice(ragchat_settings_override, user)
    answer = ask(user, "Do I have anything booked this week?").answer
    assert _on(2) in answer and _on(12) not in answer, answer
    answer = ask(user, "Which dentist am I seeing next?").answer
    assert "Dr James Patel" in answer and _on(2) in answer and "020 7946" not in answer, answer


def test_a_window_asked_without_my_is_answered_by_my_rows_in_it(ragchat_settings_override, user):
    """A bike shop's trial: "What is ready this week?" was declined, for dates were read only in a
    question saying "my". The asker's rows found answer a window of time asked without it; a
    question about the site's hours in that window is still the hours page's."""
    _dental_practice(ragchat_settings_override, user)
    answer = ask(user, "What is booked this week?").answer
    assert _on(2) in answer and _on(12) not in answer and "check-up" in answer, answer
    # Not the asker's rows. It was the opening hours page's "8:00 to 18:00" while the rows held
    # three of the four passages; beside the late evenings page it is now declined as another
    # topic's (a known limit: docs/sources.md).
    answer = ask(user, "Are you open late this week?").answer
    assert "You booked" not in answer, answer


def test_a_follow_up_pointing_at_my_row_asks_of_what_the_row_said(ragchat_settings_override, user):
    """A dental practice's trial: after "When is my next appointment?" (a check-up, from the
    asker's row), "And how much does that cost?" priced an emergency appointment: the follow-up
    carried the question's words ("appointment"), not what the answer quoted. It now carries the
    answer's topic words (not its names and dates, which no price page writes)."""
    _dental_practice(ragchat_settings_override, user)
    conversation = Conversation.objects.create(owner=user)
    assert "check-up with Dr James Patel" in run_turn_sync(conversation, "When is my next appointment?").answer
    result = run_turn_sync(conversation, "And how much does that cost?")
    assert "£55" in result.answer and "£80" not in result.answer, result.answer
    assert "check-up" in result.trace["queries"]["final"] and "Patel" not in result.trace["queries"]["final"]
    answer = run_turn_sync(conversation, "Who is it with?").answer
    assert "Dr James Patel" in answer and _on(2) in answer, answer


def test_a_follow_up_after_a_public_page_answered_my_question_is_not_about_my_rows(ragchat_settings_override, user):
    """A yoga studio's trial: the asker's row does not write "class", so "When is my next class?"
    was answered by the public timetable; "And how much does that cost?" then carried that
    answer's words as if it were about the asker's own things and was declined ("The documents
    don't say anything about price beginners yoga"). An answer carries its words only when it
    cited the asker's own rows; otherwise the question that opened the topic is carried."""
    ragchat_settings_override(PLUGINS=["tests.bookings_plugin"], PROFILES={"default": {}})
    Article.objects.create(title="Timetable", body="Our beginners' yoga class runs every Tuesday at 18:30 in the "
                                                   "studio. The vinyasa flow class runs every Thursday at 7:00.")
    Article.objects.create(title="Prices", body="A drop-in class costs £12. A pass for ten classes costs £100.")
    Article.objects.create(title="Your booking: vinyasa flow", owner=user, body=f"You booked vinyasa flow on {_on(3)}.")
    conversation = Conversation.objects.create(owner=user)
    assert "every Tuesday at 18:30" in run_turn_sync(conversation, "When is my next class?").answer
    result = run_turn_sync(conversation, "And how much does that cost?")
    assert "£12" in result.answer, result.answer
    assert "asker's own things" not in result.trace["queries"]["transformed"][0]["note"]


def _bed_and_breakfast(ragchat_settings_override, user) -> None:
    """A bed and breakfast's trial: each reservation row writes its dates, price, breakfast and
    reference in three sentences, as sources.md's booking example does."""
    ragchat_settings_override(PLUGINS=["tests.bookings_plugin"], PROFILES={"default": {}})
    Article.objects.create(title="Rooms and prices", body=(
        "The Heron Suite has a king-size bed and a roll-top bath. The Heron Suite costs £140 per night for two "
        "people, breakfast included. The Willow Room is a twin room on the ground floor. The Willow Room costs £85 "
        "per night for two people."))
    Article.objects.create(title="Breakfast", body="Breakfast is served in the dining room from 7:30am to 9:30am.")
    for days, room, nights, reference, breakfast in ((3, "Heron Suite", 2, "HH-2041", True),
                                                     (40, "Willow Room", 3, "HH-2107", False),
                                                     (-50, "Kingfisher Room", 1, "HH-1893", True)):
        Article.objects.create(title=f"Your reservation: {room}", owner=user, body=(
            f"You booked the {room} for {nights} nights, arriving on {_on(days)} and leaving on "
            f"{_on(days + nights)}. Breakfast is {'' if breakfast else 'not '}included in your stay. "
            f"Your booking reference is {reference}."))


def test_my_rows_take_no_place_of_the_pages_a_question_saying_my_needs(ragchat_settings_override, user):
    """A bed and breakfast's trial: "When do I have to leave the room on my last day?" listed the
    asker's three stays ("leaving on ..."): the rows, found by both searches, held three of the
    four places. Their rows are kept beside the ``top_k`` best pages, not in their place."""
    _bed_and_breakfast(ragchat_settings_override, user)
    Article.objects.create(title="Check-out", body="Check-out is by 11am on the day you leave.")
    Article.objects.create(title="Parking", body="Guests can park for free in our courtyard behind the house.")
    result = ask(user, "When do I have to leave the room on my last day?")
    titles = [source["title"] for source in result.message["sources"]]
    # The top_k (4) pages and the 3 rows. Which sentence answers depends on the rows' weekdays
    # ("arriving on Saturday ... leaving on Tuesday" may state "day" as well as the page does).
    assert "Check-out" in titles and len(titles) == 4 + 3, titles
    answer = ask(user, "What have I booked?").answer
    assert all(room in answer for room in ("Kingfisher", "Heron", "Willow")), answer


def test_a_garages_customer_asking_with_my_still_gets_the_page_that_answers(ragchat_settings_override, user):
    """The garage's trial: "Can I leave my keys if I arrive before you open?" was declined ("The
    documents don't say anything about leave keys arrive"): the customer's two bookings and two
    invoices took all four places, and the drop-off page, the public searches' best, was left out."""
    ragchat_settings_override(PLUGINS=["tests.bookings_plugin"], PROFILES={"default": {}})
    for title, body in GARAGE_PAGES:
        Article.objects.create(title=title, body=body)
    for title, body in (("Your booking: MOT test for AL19 CEX", f"You booked an MOT test on {_on(3)} at 09:30."),
                        ("Your booking: brake check for AL19 CEX", f"You booked a brake check on {_on(29)} at 14:00."),
                        ("Your invoice INV-1041", f"Invoice INV-1041 for £189 was issued on {_on(-60)}. It is paid."),
                        ("Your invoice INV-1102", f"Invoice INV-1102 for £62.50 was issued on {_on(-5)}. It is not paid yet.")):
        Article.objects.create(title=title, body=body, owner=user)
    answer = ask(user, "Can I leave my keys if I arrive before you open?").answer
    assert "letterbox in the blue door" in answer, answer


GARAGE_PAGES = [
    ("Opening hours", "We are open Monday to Friday from 8:00 to 17:30 and on Saturday from 8:30 to 12:30."),
    ("Parking and drop-off", "You can park in the yard behind the workshop. If you arrive before we open, post your "
                             "keys through the letterbox in the blue door, in an envelope with your registration."),
    ("Courtesy car", "A courtesy car is free for customers who book a full service or a repair over £300."),
    ("Payment", "We take cash, debit and credit cards, Apple Pay and Google Pay. We do not take cheques."),
]


def test_a_question_whose_verb_is_a_names_word_asks_its_own_thing(ragchat_settings_override, user):
    """The garage's trial: "Can I pay with Apple Pay?" after "What does the MOT actually check?"
    was declined ("The documents don't say anything about mot actually check"): every word it
    asks with is the name's, so the earlier question's words were taken as what it asked."""
    ragchat_settings_override(PLUGINS=["tests.bookings_plugin"], PROFILES={"default": {}})
    for title, body in GARAGE_PAGES + [("MOT tests", "An MOT test checks lights, brakes, tyres, seatbelts, steering "
                                                     "and emissions. It takes about an hour.")]:
        Article.objects.create(title=title, body=body)
    conversation = Conversation.objects.create(owner=user)
    assert "seatbelts" in run_turn_sync(conversation, "What does the MOT actually check?").answer
    answer = run_turn_sync(conversation, "Can I pay with Apple Pay?").answer
    assert "Apple Pay and Google Pay" in answer, answer


def test_my_rows_are_quoted_by_their_dated_sentence_and_named_when_it_does_not(ragchat_settings_override, user):
    """A bed and breakfast's trial: "When is my next booking?" and "What have I booked?" quoted
    "Your booking reference is HH-2041" (it states "booking" as well as the dated sentence does);
    three references in a row did not say which stay each was."""
    _bed_and_breakfast(ragchat_settings_override, user)
    result = ask(user, "When is my next booking?")
    answer = result.answer
    assert answer.startswith("You booked the Heron Suite") and _on(3) in answer and "Willow" not in answer, answer
    # Staff read why this row and not a later one (the trial's admin showed no reason).
    assert "it quotes the soonest of the asker&#x27;s own rows still to come" in admin_page_of_trace(result)
    assert ask(user, "When is my next stay?").answer.startswith("You booked the Heron Suite")  # asks no word
    answer = ask(user, "What have I booked?").answer
    assert answer.index("Kingfisher") < answer.index("Heron") < answer.index("Willow"), answer
    assert "reference" not in answer, answer
    answer = ask(user, "What is my booking reference?").answer
    assert "Heron Suite \N{EM DASH} Your booking reference is HH-2041" in answer, answer
    assert ask(user, "What is my booking reference for the Willow Room?").answer.startswith(
        "Your booking reference is HH-2107")


def test_a_follow_up_pointing_at_my_row_carries_the_subject_it_names(ragchat_settings_override, user):
    """A bed and breakfast's trial: "And is breakfast included in that?" after "When is my next
    stay?" quoted every stay's breakfast sentence, the Willow Room's "not included" first."""
    _bed_and_breakfast(ragchat_settings_override, user)
    conversation = Conversation.objects.create(owner=user)
    assert "Heron Suite" in run_turn_sync(conversation, "When is my next stay?").answer
    answer = run_turn_sync(conversation, "And is breakfast included in that?").answer
    assert "Breakfast is included" in answer and "not included" not in answer, answer
