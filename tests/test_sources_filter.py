"""The ``sources_filter`` response augmenter: sources kept by their similarity to the answer.

A tiny deterministic embedder makes the similarities exact: each text becomes counts of a few
concepts (which product, price, hardware), so "The Aurora X2 costs $699" is close to the Aurora
pricing passage and far from the Nimbus one.
"""

from __future__ import annotations

import numpy as np
import pytest
from asgiref.sync import async_to_sync

from django_ragchat import hookimpl
from django_ragchat.checks import check_component_warnings
from django_ragchat.models import MessageSource, TurnTrace
from django_ragchat.stages.embedders import Embedder
from django_ragchat.stages.llms import LLMBackend
from django_ragchat.turn.pipeline import run_turn_sync, stream_turn
from django_ragchat.types import LLMDelta

pytestmark = pytest.mark.django_db

CONCEPTS = {
    "aurora": 0, "nimbus": 1, "zephyr": 2,
    "cost": 3, "costs": 3, "price": 3, "pricing": 3, "$": 3,
    "phone": 4, "tablet": 4, "earbuds": 4, "camera": 4, "screen": 4, "battery": 4,
}


class ConceptEmbedder(Embedder):
    """Counts of a handful of concepts; deterministic and exact, for tests."""

    name = "concepts"
    dimension = 6

    @property
    def space(self):
        return "test-concepts-6"

    def embed(self, texts):
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in text.lower().replace("$", " $ ").replace(".", " ").replace(",", " ").split():
                out[row, CONCEPTS.get(word, 5)] += 1 if word in CONCEPTS else 0
            out[row, 5] = 0.01  # never the zero vector
        return out


class ScriptedBackend(LLMBackend):
    name = "scripted"
    model = "scripted"

    def __init__(self, profile, *, reply: str = "", **options):
        super().__init__(profile, **options)
        self.reply = reply

    async def stream(self, prompt, turn):
        for n, word in enumerate(self.reply.split(" ")):
            yield LLMDelta(text=(" " if n else "") + word)


class TestPlugin:
    @staticmethod
    @hookimpl
    def register_embedders(register):
        register(ConceptEmbedder)

    @staticmethod
    @hookimpl
    def register_llm_backends(register):
        register(ScriptedBackend)


ANSWER = "The Aurora X2 costs $699."


def profile(reply=ANSWER, **options):
    return {
        "embedder": "concepts", "llm": "scripted", "top_k": 4,
        "response_augmenters": ["citations", "sources_filter"],
        "options": {"scripted": {"reply": reply}, "sources_filter": options},
    }


@pytest.fixture
def configure(ragchat_settings_override, db):
    """Settings first, then the product documents, embedded in the concepts space."""
    def apply(**options):
        from django_ragchat.ingestion.pipeline import ingest_text
        from tests.conftest import PRODUCT_DOCS

        ragchat_settings_override(PLUGINS=["tests.test_sources_filter.TestPlugin"],
                                  PROFILES={"default": profile(**options)})
        for source, text in PRODUCT_DOCS.items():
            ingest_text(source, text, content_type="markdown")
    return apply


def collect(conversation, text, **kwargs):
    async def run():
        return [event async for event in stream_turn(conversation, text, **kwargs)]
    return async_to_sync(run)()


def test_an_answer_similar_to_one_source_keeps_only_that_one(configure, conversation):
    configure()
    result = run_turn_sync(conversation, "How much does the Aurora X2 cost?")
    trace = result.trace["sources_filter"]
    by_chunk = {d["chunk_id"]: d["source"] for d in result.trace["documents"]}
    similarity = {by_chunk[s["chunk_id"]]: s["similarity"] for s in trace["similarities"]}
    # The prompt had passages of other documents too; only the Aurora pricing one is close enough.
    assert len(set(by_chunk.values())) >= 2
    kept = [by_chunk[c] for c in trace["kept"]]
    assert kept == ["products/aurora-x2.md"]
    assert max(similarity.values()) >= 0.85
    assert [s["source"] for s in result.message["sources"]] == ["products/aurora-x2.md"]
    saved = MessageSource.objects.filter(message_id=result.message["id"])
    assert [s.source for s in saved] == ["products/aurora-x2.md"]
    # The kept source keeps the index the model saw it under.
    assert result.message["sources"][0]["index"] == saved[0].rank
    assert result.answer == ANSWER  # append is off by default


def test_a_lower_threshold_keeps_one_chunk_per_document_the_first_retrieved(configure, conversation):
    configure(threshold=0.05)
    result = run_turn_sync(conversation, "How much does the Aurora X2 cost?")
    trace = result.trace["sources_filter"]
    aurora = [d["chunk_id"] for d in result.trace["documents"] if d["source"] == "products/aurora-x2.md"]
    passing = [s["chunk_id"] for s in trace["similarities"] if s["similarity"] >= 0.05]
    assert len(aurora) == 2 and set(aurora) <= set(passing)  # both Aurora chunks are similar enough
    assert trace["kept"] == [aurora[0]]  # ... but one per document: the first in retrieval order
    assert [s["chunk_id"] for s in result.message["sources"]] == [aurora[0]]


def test_append_adds_the_sources_line_to_a_whole_answer(configure, conversation):
    configure(append=True)
    result = run_turn_sync(conversation, "How much does the Aurora X2 cost?")
    assert result.answer == ANSWER + " (Sources: products/aurora-x2.md)"


def test_append_streams_the_sources_line_as_the_last_piece(configure, conversation):
    configure(append=True)
    events = collect(conversation, "How much does the Aurora X2 cost?", stream=True)
    deltas = [e.text for e in events if e.type == "delta"]
    assert deltas[-1] == " (Sources: products/aurora-x2.md)"
    done = events[-1]
    assert done.type == "done" and done.message["content"].endswith("(Sources: products/aurora-x2.md)")
    assert done.message["content"] == "".join(deltas)
    assert [s["source"] for s in done.message["sources"]] == ["products/aurora-x2.md"]


def test_a_cited_source_is_kept_even_when_dissimilar(configure, conversation):
    configure(reply="The Aurora X2 costs $699 [1][2].", threshold=0.99)
    result = run_turn_sync(conversation, "How much does the Aurora X2 cost?")
    assert [s["index"] for s in result.message["sources"]] == [1, 2]
    assert [c["index"] for c in result.message["citations"]] == [1, 2]


def test_keep_cited_false_drops_citations_to_dropped_sources_everywhere(configure, conversation):
    configure(reply="Zephyr Buds [3].", threshold=0.99, keep_cited=False)
    result = run_turn_sync(conversation, "How much does the Aurora X2 cost?")
    assert result.message["sources"] == [] and result.message["citations"] == []
    assert not MessageSource.objects.filter(message_id=result.message["id"]).exists()


def test_off_unless_listed(ragchat_settings_override, product_corpus, conversation):
    result = run_turn_sync(conversation, "How much does the Aurora X2 cost?")
    assert "sources_filter" not in result.trace and len(result.message["sources"]) >= 2


def test_check_warns_with_the_hashing_embedder_and_not_with_a_semantic_one(ragchat_settings_override):
    ragchat_settings_override(PLUGINS=["tests.test_sources_filter.TestPlugin"], PROFILES={
        "default": {"embedder": "hashing", "response_augmenters": ["citations", "sources_filter"]},
        "semantic": profile(),
        "wordllama": {"response_augmenters": ["citations", "sources_filter"]},  # the default embedder
        "plain": {},
    })
    warnings = [w for w in check_component_warnings() if w.id == "ragchat.W040"]
    assert len(warnings) == 1
    assert "'default'" in warnings[0].msg and "hashing" in warnings[0].msg


@pytest.mark.parametrize("options", [{"threshold": 2}, {"threshold": "high"}, {"template": "no placeholder"}])
def test_bad_options_are_check_errors(ragchat_settings_override, options):
    from django_ragchat.checks import check_profiles

    ragchat_settings_override(PLUGINS=["tests.test_sources_filter.TestPlugin"],
                              PROFILES={"default": profile(**options)})
    assert [e.id for e in check_profiles()] == ["ragchat.E002"]


def test_trace_records_every_similarity(configure, conversation):
    configure()
    result = run_turn_sync(conversation, "How much does the Aurora X2 cost?")
    trace = TurnTrace.objects.get(message_id=result.message["id"]).data["sources_filter"]
    assert trace["threshold"] == 0.85
    assert len(trace["similarities"]) == len(result.trace["documents"])


def test_streamed_similarity_uses_the_extracted_answer_not_the_reasoning(ragchat_settings_override, configure, conversation):
    # The reasoning talks about the Nimbus Tab; the answer inside <answer> is about the Aurora.
    reply = "<thinking>Nimbus Nimbus Nimbus tablet tablet screen?</thinking><answer>The Aurora X2 costs $699.</answer>"
    configure(reply=reply, append=True)
    from django.conf import settings

    profiles = settings.RAGCHAT["PROFILES"]
    profiles["default"]["options"]["citations"] = {"extract_xml_tags": ["answer"]}
    ragchat_settings_override(PROFILES=profiles)
    events = collect(conversation, "How much does the Aurora X2 cost?", stream=True)
    done = events[-1]
    assert done.type == "done"
    assert [s["source"] for s in done.message["sources"]] == ["products/aurora-x2.md"]
    # The built answer, and the streamed sources line is kept after it.
    assert done.message["content"] == "The Aurora X2 costs $699. (Sources: products/aurora-x2.md)"
    assert [e.text for e in events if e.type == "delta"][-1] == " (Sources: products/aurora-x2.md)"


def test_with_a_holding_redactor_the_sources_line_still_comes_last(ragchat_settings_override, db, conversation):
    """pii_redact_stream (order 50) holds the end of a stream back and releases it in finish();
    the sources line (order 200) streams after it, and the saved answer ends with it."""
    from django_ragchat.ingestion.pipeline import ingest_text
    from tests.conftest import PRODUCT_DOCS

    reply = "The Aurora X2 costs $699, call 555 123 4567"
    config = profile(reply=reply, append=True)
    config["response_augmenters"] = ["pii_redact_stream", "citations", "sources_filter"]
    ragchat_settings_override(PLUGINS=["tests.test_sources_filter.TestPlugin", "ragchat_pii_guard"],
                              PROFILES={"default": config})
    for source, text in PRODUCT_DOCS.items():
        ingest_text(source, text, content_type="markdown")
    events = collect(conversation, "How much does the Aurora X2 cost?", stream=True)
    deltas = [e.text for e in events if e.type == "delta"]
    done = events[-1].message
    assert deltas[-1] == " (Sources: products/aurora-x2.md)"
    assert done["content"] == "".join(deltas)
    assert done["content"].endswith("[redacted phone] (Sources: products/aurora-x2.md)")
    assert "4567" not in done["content"]


def test_the_sources_line_keeps_document_names_on_one_line():
    from django_ragchat.profiles import Profile
    from django_ragchat.stages.responses import SourcesFilter
    from django_ragchat.types import RetrievedChunk

    component = SourcesFilter(Profile(), append=True)
    docs = [RetrievedChunk(chunk_id=1, text="t", score=1, document_id=1, source="evil.md\n\n# Heading\x00\u202e"),
            RetrievedChunk(chunk_id=2, text="t", score=1, document_id=2, source="x" * 500)]
    line = component.tail(docs)
    assert "\n" not in line and "\x00" not in line and "\u202e" not in line
    assert line.startswith(" (Sources: evil.md # Heading, xxx") and len(line) < 240
