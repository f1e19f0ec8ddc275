"""What each document post-processor and response augmenter changed, in the trace
(``django_ragchat.turn.changes``): a plugin author's trial found the trace said what retrievers,
the joiner, transformers and tools did, and nothing of the stages that drop, reorder or rewrite."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_ragchat import hookimpl
from django_ragchat.ingestion.pipeline import ingest_text
from django_ragchat.models import Chunk, Conversation, Message
from django_ragchat.stages.postprocessors import DocumentPostProcessor
from django_ragchat.stages.responses import ResponseAugmenter
from django_ragchat.turn import changes
from django_ragchat.turn.pipeline import run_turn_sync
from django_ragchat.types import Answer, RetrievedChunk

pytestmark = pytest.mark.django_db

QUESTION = "How much does the Aurora X2 cost?"
REFERENCES = "\n\nReferences: the <b>shop</b> pages."


class Reverse(DocumentPostProcessor):
    name = "reverse_docs"
    order = 60

    def process(self, query, documents, turn):
        return documents[::-1]


class DropFirst(DocumentPostProcessor):
    name = "drop_first"
    order = 70

    def process(self, query, documents, turn):
        return documents[1:]


class References(ResponseAugmenter):
    name = "references"
    order = 150

    def augment(self, answer, turn):
        return answer.replace(text=answer.text + REFERENCES,
                              metadata={**answer.metadata, "transform_note": "appended the <references>"})


class RedactDigits(ResponseAugmenter):
    """Every digit as "#", whole or streamed; streamed, a line after the answer."""

    name = "redact_digits"
    order = 160

    def augment(self, answer, turn):
        return answer.replace(text="".join("#" if c.isdigit() else c for c in answer.text))

    def on_delta(self, text, turn):
        return "".join("#" if c.isdigit() else c for c in text)

    def finish(self, turn):
        return "\n(checked)"


class PostProcessorsPlugin:
    @staticmethod
    @hookimpl
    def register_document_postprocessors(register):
        register(Reverse)
        register(DropFirst)


class AugmentersPlugin:
    @staticmethod
    @hookimpl
    def register_response_augmenters(register):
        register(References)
        register(RedactDigits)


BOTH = ["tests.test_stage_changes.PostProcessorsPlugin", "tests.test_stage_changes.AugmentersPlugin"]


@pytest.fixture
def post_processors(ragchat_settings_override):
    ragchat_settings_override(PLUGINS=BOTH[:1])


@pytest.fixture
def augmenters(ragchat_settings_override):
    ragchat_settings_override(PLUGINS=BOTH[1:])


def test_each_post_processor_is_traced_with_the_chunks_it_dropped_and_whether_it_reordered(
        product_corpus, conversation, post_processors):
    result = run_turn_sync(conversation, QUESTION)
    steps = {s["by"]: s for s in result.trace["postprocess"]}
    assert list(steps) == ["similarity_threshold", "reverse_docs", "drop_first", "top_k"]  # in pipeline order
    threshold, reverse, drop, top_k = steps.values()
    assert threshold["in"] == threshold["out"] and threshold["dropped"] == [] and not threshold["reordered"]
    assert reverse["reordered"] and reverse["dropped"] == [] and reverse["in"] == reverse["out"]
    assert reverse["order"] == reverse["order"][:changes.ORDER_SHOWN]
    assert drop["dropped"] == [reverse["order"][0]] and not drop["reordered"] and drop["out"] == drop["in"] - 1
    assert top_k["out"] == len(result.trace["documents"]) and len(top_k["dropped"]) == top_k["in"] - top_k["out"]
    assert all(s["added"] == [] for s in steps.values())
    given = [d["chunk_id"] for d in result.trace["documents"]]
    assert not set(given) & {i for s in steps.values() for i in s["dropped"]}


def test_each_response_augmenter_is_traced_with_what_it_changed_and_its_note_not_a_copy(
        product_corpus, conversation, augmenters):
    result = run_turn_sync(conversation, QUESTION)
    assert "$699" not in result.answer and result.answer.endswith(REFERENCES)
    citations, references, redact = result.trace["response_augmenters"]
    assert citations == {"by": "citations", "changed": ["citations"]}
    before = len(result.answer) - len(REFERENCES)
    assert references == {"by": "references", "changed": ["text"], "note": "appended the <references>",
                          "text": {"before": before, "after": before + len(REFERENCES), "at": before,
                                   "removed": 0, "inserted": len(REFERENCES)}}
    assert redact["by"] == "redact_digits" and redact["changed"] == ["text"]
    assert redact["text"]["removed"] == redact["text"]["inserted"] > 0  # digits replaced one for one
    # Counts, never the text: what a redactor took out must not be stored in the trace.
    assert "699" not in json.dumps(result.trace["response_augmenters"])
    # The note went to the trace, not to the saved message.
    assert "transform_note" not in Message.objects.get(pk=result.message["id"]).metadata


def test_a_streamed_answer_says_what_each_augmenter_changed_while_it_streamed(
        product_corpus, conversation, augmenters):
    result = run_turn_sync(conversation, QUESTION, stream=True)
    steps = {s["by"]: s for s in result.trace["response_augmenters"]}
    redact = steps["redact_digits"]
    assert redact["streamed"]["changed"] and redact["streamed"]["in"] == redact["streamed"]["out"] > 0
    assert redact["streamed"]["tail"] == len("\n(checked)") and "text" in redact["changed"]
    assert steps["citations"]["streamed"] == {"in": redact["streamed"]["in"], "out": redact["streamed"]["in"],
                                              "changed": False, "tail": 0}
    assert "\n(checked)" in result.answer and "699" not in json.dumps(result.trace["response_augmenters"])


class AddsAnOrder(DocumentPostProcessor):
    """Puts a chunk in front that it read itself: one the asker may not read."""

    name = "adds_an_order"
    chunk: RetrievedChunk | None = None  # the test's

    def process(self, query, documents, turn):
        return [self.chunk, *documents]


class AddsPlugin:
    @staticmethod
    @hookimpl
    def register_document_postprocessors(register):
        register(AddsAnOrder)


def test_a_chunk_the_asker_may_not_read_is_named_in_no_post_processors_step(
        product_corpus, conversation, other_user, ragchat_settings_override):
    ingest_text("orders/7", "# Order 7\n\nA blue teapot for Bob.", access=[f"user:{other_user.pk}"])
    ragchat_settings_override(PLUGINS=["tests.test_stage_changes.AddsPlugin"])
    chunk = Chunk.objects.get(document__source="orders/7")
    hidden = chunk.pk
    AddsAnOrder.chunk = RetrievedChunk(chunk_id=chunk.pk, text=chunk.text, score=1.0, document_id=chunk.document_id,
                                       source="orders/7")
    result = run_turn_sync(conversation, QUESTION)
    step = next(s for s in result.trace["postprocess"] if s["by"] == "adds_an_order")
    assert step["out"] == step["in"] + 1 and step["added"] == [] and not step["reordered"]
    assert all(hidden not in s.get(key, ()) for s in result.trace["postprocess"] for key in ("added", "dropped", "order"))
    assert hidden not in [d["chunk_id"] for d in result.trace["documents"]]
    assert any("may not read" in w for w in result.trace["warnings"])


def test_tracing_the_changes_costs_no_query(product_corpus, user, ragchat_settings_override):
    """Post-processors and augmenters that change everything cost no more SQL than the defaults."""
    counts = {}
    for plugins in ([], BOTH):
        ragchat_settings_override(PLUGINS=plugins)
        run_turn_sync(Conversation.objects.create(owner=user), "warm up the vector index")
        with CaptureQueriesContext(connection) as queries:
            result = run_turn_sync(Conversation.objects.create(owner=user), QUESTION)
        assert result.status == "complete" and len(result.trace["postprocess"]) == 2 + 2 * bool(plugins)
        counts[bool(plugins)] = len(queries)
    assert counts[True] == counts[False], counts


@pytest.mark.parametrize(("before", "after", "change"), [
    ("abc", "abc", None),
    ("abc", "abc!!", {"before": 3, "after": 5, "at": 3, "removed": 0, "inserted": 2}),
    ("abc", ">abc", {"before": 3, "after": 4, "at": 0, "removed": 0, "inserted": 1}),
    ("call 555 now", "call [phone] now", {"before": 12, "after": 16, "at": 5, "removed": 3, "inserted": 7}),
    ("aaaa", "aa", {"before": 4, "after": 2, "at": 2, "removed": 2, "inserted": 0}),
    ("", "x", {"before": 0, "after": 1, "at": 0, "removed": 0, "inserted": 1}),
])
def test_a_text_change_is_the_one_span_between_the_common_start_and_end(before, after, change):
    assert changes.text_change(before, after) == change


def test_a_long_note_is_cut_and_a_missing_one_leaves_the_answer_alone():
    answer = Answer(text="x", metadata={"kept": 1})
    assert changes.take_note(answer) == (answer, "")
    noted, note = changes.take_note(answer.replace(metadata={"kept": 1, "transform_note": "n" * 2000}))
    assert noted.metadata == {"kept": 1} and len(note) == changes.MAX_NOTE_CHARS and note.endswith("…")


def test_a_post_processor_that_only_rescores_is_said_to():
    chunks = [RetrievedChunk(chunk_id=i, text="t", score=1.0 / i, document_id=1, source="s") for i in (1, 2)]
    step = changes.documents_step("rescore", chunks, [chunks[0].with_score(0.9), chunks[1]])
    assert step == {"by": "rescore", "in": 2, "out": 2, "dropped": [], "added": [], "reordered": False,
                    "rescored": 1}
