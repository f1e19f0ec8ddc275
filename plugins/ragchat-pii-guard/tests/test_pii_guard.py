"""ragchat-pii-guard: detection, the streaming redactor, both components, their registration,
and full turns (streamed and whole) with the plugin enabled."""

from __future__ import annotations

import random
from importlib.metadata import entry_points

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_ragchat import checks, plugins
from django_ragchat.events import Completed, Delta
from django_ragchat.models import Conversation, Message
from django_ragchat.profiles import get_profile
from django_ragchat.turn.context import TurnContext, components_for
from django_ragchat.turn.pipeline import run_turn_sync, stream_turn
from django_ragchat.types import Answer, Citation, Redaction, Refusal

import ragchat_pii_guard
from ragchat_pii_guard import PIIGuard, PIIRedactStream, StreamRedactor, find_pii, luhn_valid, redact
from ragchat_pii_guard.detect import MAX_HOLD


def ragchat(**values):
    """``override_settings`` for the RAGCHAT dict, on top of the test settings'."""
    return override_settings(RAGCHAT={**settings.RAGCHAT, **values})


WITH_PLUGIN = {"PLUGINS": ["ragchat_pii_guard"]}


def make_turn(question: str = "") -> TurnContext:
    profile = get_profile()
    return TurnContext(conversation=Conversation(profile=profile.name), profile=profile,
                       components=components_for(profile), question=question)


# --- Detection ---------------------------------------------------------------------------------


def test_luhn():
    assert luhn_valid("4111 1111 1111 1111")
    assert luhn_valid("5555-5555-5555-4444")
    assert luhn_valid("378282246310005")  # 15 digits (American Express test number)
    assert not luhn_valid("4111 1111 1111 1112")
    assert not luhn_valid("4242")  # too short to be a card


@pytest.mark.parametrize("text, kind, found", [
    ("Pay with 4111 1111 1111 1111 today", "card", "4111 1111 1111 1111"),
    ("card 5555-5555-5555-4444.", "card", "5555-5555-5555-4444"),
    ("Amex 378282246310005", "card", "378282246310005"),
    ("Mail jane.doe+chat@mail.example.co.uk, thanks", "email", "jane.doe+chat@mail.example.co.uk"),
    ("call +1 (555) 123-4567.", "phone", "+1 (555) 123-4567"),
    ("or +44 20 7946 0958", "phone", "+44 20 7946 0958"),
    ("dial (555) 123-4567 now", "phone", "(555) 123-4567"),
    ("ring 020 7946 0958", "phone", "020 7946 0958"),
    ("text 5551234567", "phone", "5551234567"),
])
def test_finds_each_kind(text, kind, found):
    (finding,) = find_pii(text)
    assert finding.kind == kind
    assert text[finding.start:finding.end] == found


@pytest.mark.parametrize("text", [
    "The Aurora X2 costs $699 with 128 GB; the 256 GB model costs $799.",
    "Released on 2024-05-01 at 10:30, version 1.2.3, model X2-4000.",
    "We sold 100 000 000 units (1.250.000 in May, 1,250,000 in June).",
    "Not a card: 4111 1111 1111 1112. Not a phone: 555-1234 or order 12345678.",
    "An @ sign alone, user@localhost, and jane@example are not addresses.",
])
def test_leaves_ordinary_numbers_and_words_alone(text):
    assert find_pii(text) == []


def test_redact_replaces_counts_and_respects_kinds_and_allow():
    text = "Write to help@acme.example or jane@example.com, call +1 555 123 4567, card 4111111111111111."
    redacted, counts = redact(text)
    assert redacted == ("Write to [redacted email] or [redacted email], call [redacted phone], "
                        "card [redacted card].")
    assert counts == {"email": 2, "phone": 1, "card": 1}
    only_cards, counts = redact(text, ["card"], placeholder="<{kind}>", allow=["HELP@acme.example"])
    assert only_cards == text.replace("4111111111111111", "<card>")
    assert redact(text, allow=["help@acme.example"])[0].startswith("Write to help@acme.example or [redacted email]")


# --- Streaming without leaks --------------------------------------------------------------------

STREAM_TEXTS = [
    "Contact Jane at jane.doe@example.com or call +1 (555) 123-4567. Card: 4111 1111 1111 1111!",
    "Pay with 4242-4242-4242-4242 or 5555555555554444, not 4111 1111 1111 1112.",
    "On 2024-05-01 we sold 100 000 000 units at $699; call 020 7946 0958 or 5551234567.",
    "A+1 555 123 4567 and x@y.co and me@ex.abc5 55 and +44 20 7946 0958.",
    "Mail support@acme.example.org (or (555) 123-4567)\nthen 378282246310005",
]


def splits(text: str, rng: random.Random):
    """Every two-piece split, character by character, and random splits into up to 12 pieces."""
    yield from ([text[:i], text[i:]] for i in range(len(text) + 1))
    yield list(text)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, 12)))
        yield [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


@pytest.mark.parametrize("text", STREAM_TEXTS)
def test_streamed_pieces_join_to_the_whole_redaction_however_the_text_is_split(text):
    expected, counts = redact(text)
    secrets = [text[f.start:f.end] for f in find_pii(text)]
    assert secrets
    rng = random.Random(text)
    for pieces in splits(text, rng):
        redactor = StreamRedactor()
        sent = [redactor.feed(piece) for piece in pieces] + [redactor.flush()]
        assert "".join(sent) == expected, pieces
        assert redactor.counts == counts
        # Nothing sent gives away a digit group or the local part of an address.
        for secret in secrets:
            for fragment in secret.replace("(", " ").replace(")", " ").replace("-", " ").split():
                if len(fragment) >= 3 and fragment not in expected:
                    assert all(fragment not in s for s in sent), (fragment, pieces)


def test_prose_passes_at_once_and_only_what_could_start_a_match_is_held():
    redactor = StreamRedactor()
    assert redactor.feed("The Aurora X2 costs ") == "The Aurora X2 costs "
    assert redactor.held == ""
    # A word still being written could be the start of an address; a number, of a phone number.
    assert redactor.feed("$699 with 128 GB") == "$699 with 128 "
    assert redactor.held == "GB"
    assert redactor.feed(" and call +1 555") == "GB and call "
    assert redactor.held == "+1 555"
    assert redactor.feed(" 123 4567 today.") == "[redacted phone] "
    assert redactor.flush() == "today."
    assert redactor.counts == {"phone": 1}


@pytest.mark.parametrize("run", ["a" * 2000, "1" * 2000, "x." * 1000])
def test_the_held_tail_is_bounded(run):
    redactor = StreamRedactor()
    sent = redactor.feed(run)
    assert len(redactor.held) == MAX_HOLD
    assert sent + redactor.flush() == run


# --- The components ----------------------------------------------------------------------------

CARD_MESSAGE = "My card 4111 1111 1111 1111 was charged twice, can you refund it?"


def test_guard_refuses_a_luhn_valid_card_in_the_input_and_says_why():
    guard = PIIGuard(get_profile())
    turn = make_turn()
    refusal = guard.check_input(CARD_MESSAGE, turn)
    assert isinstance(refusal, Refusal)
    assert "payment card number" in refusal.answer and refusal.reason == "input contains card"
    assert refusal.redacted == "My card [redacted card] was charged twice, can you refund it?"  # what is kept
    assert turn.trace["pii_guard"] == {"input_refused": {"card": 1}}
    assert "4111" not in str(turn.trace)  # the trace is stored: counts only, never the data
    assert guard.check_input("My order 4111 1111 1111 1112 was charged twice", make_turn()) is None
    assert guard.check_input("Mail me at jane@example.com", make_turn()) is None  # not refused by default


def test_guard_options_choose_what_is_refused_and_redacted():
    guard = PIIGuard(get_profile(), refuse_input=["email", "phone"], redact_output=["email"],
                     placeholder="***", refusal="No personal data, please.")
    refusal = guard.check_input("Mail me at jane@example.com or +1 555 123 4567", make_turn())
    assert refusal.answer == "No personal data, please." and refusal.reason == "input contains email, phone"
    assert guard.check_input(CARD_MESSAGE, make_turn()) is None
    turn = make_turn()
    answer = Answer(text="Mail jane@example.com or call +1 555 123 4567 [1].", citations=(Citation(1, 7),))
    redacted = guard.check_output(answer, turn)
    assert redacted.text == "Mail *** or call +1 555 123 4567 [1]."
    assert redacted.citations == answer.citations
    assert turn.trace["pii_guard"] == {"output_redacted": {"email": 1}}
    assert guard.check_output(Answer(text="Nothing personal here."), make_turn()) is None


def test_guard_redacts_the_kinds_it_is_asked_to_and_lets_the_message_go_on():
    guard = PIIGuard(get_profile(), redact_input=["email", "phone"])
    turn = make_turn()
    redaction = guard.check_input("Mail me at jane@example.com or +1 555 123 4567 about my order", turn)
    assert isinstance(redaction, Redaction)
    assert redaction.text == "Mail me at [redacted email] or [redacted phone] about my order"
    assert redaction.reason == "input contained email, phone"
    assert turn.trace["pii_guard"] == {"input_redacted": {"email": 1, "phone": 1}}
    refusal = guard.check_input(f"{CARD_MESSAGE} Mail jane@example.com", make_turn())  # refused: nothing kept
    assert refusal.redacted == "My card [redacted card] was charged twice, can you refund it? Mail [redacted email]"
    assert guard.check_input("Nothing personal here.", make_turn()) is None


@pytest.mark.parametrize("component, options, message", [
    ("pii_guard", {"refuse_input": ["cards"]}, "refuse_input has unknown kind(s) ['cards']"),
    ("pii_guard", {"redact_input": ["ssn"]}, "redact_input has unknown kind(s) ['ssn']"),
    ("pii_guard", {"redact_output": "email"}, "redact_output must be a list of kinds"),
    ("pii_guard", {"placeholder": "[{type}]"}, "'type'"),
    ("pii_redact_stream", {"kinds": ["ssn"]}, "kinds has unknown kind(s) ['ssn']"),
    ("pii_redact_stream", {"allow": "me@example.com"}, "allow must be a list of strings"),
])
def test_bad_options_are_reported_by_the_system_check(component, options, message):
    with ragchat(**WITH_PLUGIN, PROFILES={"default": {"options": {component: options}}}):
        errors = checks.check_profiles()
    assert [e.id for e in errors] == ["ragchat.E002"]
    assert component in errors[0].msg and message in errors[0].msg
    cls = PIIGuard if component == "pii_guard" else PIIRedactStream
    with pytest.raises(ImproperlyConfigured):
        cls(get_profile(), **options)


def test_stream_augmenter_keeps_each_turns_buffer_in_the_turn():
    augmenter = PIIRedactStream(get_profile())
    first, second = make_turn(), make_turn()
    assert augmenter.on_delta("Call +1 555", first) == "Call "
    assert augmenter.on_delta("Mail jane@exa", second) == "Mail "
    assert augmenter.on_delta(" 123 4567 now", first) == "[redacted phone] "
    assert augmenter.on_delta("mple.com now", second) == "[redacted email] "
    done = augmenter.on_complete(Answer(text="Call [redacted phone] "), first)
    assert done.text == "Call [redacted phone] now"
    assert first.trace["pii_redact_stream"] == {"redacted": {"phone": 1}}
    assert "pii_redact_stream" not in first.state and "pii_redact_stream" in second.state
    whole = augmenter.augment(Answer(text="Mail jane@example.com"), make_turn())
    assert whole.text == "Mail [redacted email]"


def test_both_components_are_registered_in_the_right_order():
    with ragchat(**WITH_PLUGIN):
        components = components_for(get_profile())
        assert [g.name for g in components.guardrails] == ["blocked_phrases", "pii_guard"]
        # Before citations, which must see the tail pii_redact_stream flushes at the end.
        assert [a.name for a in components.response_augmenters] == ["pii_redact_stream", "citations"]
        assert checks.check_plugins() == []


# --- Installation ------------------------------------------------------------------------------


def test_the_distribution_declares_its_entry_point():
    (entry_point,) = [ep for ep in entry_points(group="django_ragchat") if ep.name == "pii_guard"]
    assert entry_point.value == "ragchat_pii_guard"
    assert entry_point.dist.name == "ragchat-pii-guard"
    assert entry_point.load() is ragchat_pii_guard


def test_installing_is_enough_with_entry_points_on():
    with ragchat(LOAD_ENTRY_POINTS=True):
        registry = plugins.get_registry()
        assert registry.get("guardrail", "pii_guard").plugin == "pii_guard"
        assert registry.get("response_augmenter", "pii_redact_stream").plugin == "pii_guard"
        components = components_for(get_profile())
        assert "pii_guard" in [g.name for g in components.guardrails]
        assert "pii_redact_stream" in [a.name for a in components.response_augmenters]


# --- Full turns --------------------------------------------------------------------------------

SUPPORT_DOC = """# Support

## Warranty claims
For warranty claims, contact Jane Doe at jane.doe@example.com or +1 (555) 123-4567, and pay the fee with the card 4242 4242 4242 4242.

## Opening hours
The support desk is open on weekdays from nine to five.
"""
QUESTION = "How do I make warranty claims?"
SECRETS = ["jane.doe", "@example.com", "555", "123-4567", "4242"]


@pytest.fixture
def support_corpus(db):
    from django_ragchat.ingestion.pipeline import ingest_text

    return ingest_text("support.md", SUPPORT_DOC)


def streamed_turn(text: str) -> tuple[list[str], dict]:
    """The delta texts and the final message of one streamed turn in a new conversation."""
    conversation = Conversation.objects.create()

    async def run():
        return [event async for event in stream_turn(conversation, text, stream=True)]

    events = async_to_sync(run)()
    (done,) = [e for e in events if isinstance(e, Completed)]
    return [e.text for e in events if isinstance(e, Delta)], done.message


def test_without_the_plugin_the_answer_streams_the_personal_data(support_corpus):
    deltas, message = streamed_turn(QUESTION)
    # The extractive answerer streams word by word: the phone and card numbers arrive split.
    assert "+1 " in deltas and "(555) " in deltas and "4242 " in deltas
    assert all(secret in message["content"] for secret in SECRETS)


def test_streamed_turn_never_sends_or_saves_personal_data(support_corpus):
    with ragchat(**WITH_PLUGIN):
        deltas, message = streamed_turn(QUESTION)
    streamed = "".join(deltas)
    assert not any(secret in delta for delta in deltas for secret in SECRETS)
    assert not any(secret in streamed for secret in SECRETS)
    content = message["content"]
    assert content.startswith("For warranty claims, contact Jane Doe at [redacted email] or [redacted phone], "
                              "and pay the fee with the card [redacted card]")
    assert content.startswith(streamed) and len(content) - len(streamed) < 10  # only the held tail came at the end
    assert [c["index"] for c in message["citations"]] == [1]  # citations resolve in the redacted text
    saved = Message.objects.get(pk=message["id"])
    assert saved.content == content and saved.status == "complete"
    trace = saved.trace.data
    assert trace["pii_redact_stream"] == {"redacted": {"card": 1, "email": 1, "phone": 1}}
    assert "pii_guard" not in trace  # the output guardrail found nothing left to redact
    assert not any(secret in str(trace) for secret in ["jane.doe", "4242"])


def test_whole_turn_is_redacted_and_a_card_in_the_question_is_refused(support_corpus):
    with ragchat(**WITH_PLUGIN):
        result = run_turn_sync(Conversation.objects.create(), QUESTION)
        assert result.status == "complete"
        assert "[redacted email]" in result.answer and not any(s in result.answer for s in SECRETS)

        refused = run_turn_sync(Conversation.objects.create(), CARD_MESSAGE)
    assert "payment card number" in refused.answer
    assert refused.trace["ended_by"] == {"stage": "input_guardrails", "component": "pii_guard",
                                         "kind": "refusal", "reason": "input contains card"}
    assert refused.trace["retrieval"] == []  # refused before the search
    # The refused message is kept without the number: its row and the trace.
    asked = Message.objects.get(pk=refused.user_message_id)
    assert asked.content == "My card [redacted card] was charged twice, can you refund it?"
    assert refused.trace["question"] == asked.content and "4111" not in str(refused.trace)


def test_a_message_redacted_on_input_is_searched_answered_and_kept_redacted(support_corpus):
    profile = {"options": {"pii_guard": {"redact_input": ["email"]}}}
    with ragchat(**WITH_PLUGIN, PROFILES={"default": profile}):
        result = run_turn_sync(Conversation.objects.create(), f"I am jane.doe@example.com. {QUESTION}")
    assert result.status == "complete" and result.trace["ended_by"] is None
    asked = Message.objects.get(pk=result.user_message_id)
    assert asked.content == f"I am [redacted email]. {QUESTION}"
    assert result.trace["question"] == asked.content and result.trace["queries"]["original"] == asked.content
    assert result.trace["redactions"] == [{"by": "pii_guard", "reason": "input contained email"}]
    assert "jane.doe" not in str(result.trace["queries"]) and "jane.doe" not in str(result.trace["retrieval"])


def test_output_guard_alone_redacts_the_saved_answer(support_corpus):
    profile = {"response_augmenters": ["citations"], "options": {"pii_guard": {"redact_output": ["email", "card"]}}}
    with ragchat(**WITH_PLUGIN, PROFILES={"default": profile}):
        result = run_turn_sync(Conversation.objects.create(), QUESTION)
    assert "[redacted email]" in result.answer and "[redacted card]" in result.answer
    assert "+1 (555) 123-4567" in result.answer  # phones were not asked for
    assert result.trace["pii_guard"] == {"output_redacted": {"email": 1, "card": 1}}


def test_model_output_streamed_over_http_is_redacted(support_corpus, openai_server):
    """The ``openai`` backend against the loopback server, which streams one chunk per word."""
    openai_server.script("Write to jane.doe@example.com or call +44 20 7946 0958 [1].")
    profile = {"llm": "openai", "options": {"openai": {"base_url": openai_server.base_url, "model": "test-model",
                                                        "max_retries": 0}}}
    with ragchat(**WITH_PLUGIN, PROFILES={"default": profile}):
        deltas, message = streamed_turn(QUESTION)
    assert openai_server.count("chat/completions") == 1
    assert not any(part in "".join(deltas) for part in ["jane.doe", "7946", "0958"])
    assert message["content"] == "Write to [redacted email] or call [redacted phone] [1]."
    assert [c["index"] for c in message["citations"]] == [1]
