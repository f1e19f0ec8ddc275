"""A plugin method that returns what its stage cannot use fails the turn at once, naming the
component (``django_ragchat.turn.results``); a guardrail's fails closed. A plugin author's
trial: a guardrail returning a string let the message through; a transformer's string, a
post-processor's ``None`` and a retriever's dicts failed with internals naming no component;
a retriever's in-memory hits were dropped under a warning naming no retriever."""

from __future__ import annotations

import pytest

from django_ragchat import hookimpl
from django_ragchat.models import Message
from django_ragchat.stages.guardrails import Guardrail
from django_ragchat.stages.postprocessors import DocumentPostProcessor
from django_ragchat.stages.responses import ResponseAugmenter
from django_ragchat.stages.retrievers import Retriever
from django_ragchat.stages.transformers import QueryTransformer
from django_ragchat.turn.pipeline import run_turn_sync
from django_ragchat.types import RetrievedChunk

pytestmark = pytest.mark.django_db

QUESTION = "How much does the Aurora X2 cost?"


class StringGuard(Guardrail):
    name = "string_guard"
    enabled_by_default = False

    def check_input(self, text, turn):
        return "Refused: no durian questions"  # a Refusal was meant


class StringTransformer(QueryTransformer):
    name = "string_transformer"
    enabled_by_default = False

    def transform(self, query, turn):
        return query.text + " vegetarian"


class NoneProcessor(DocumentPostProcessor):
    name = "none_processor"
    enabled_by_default = False

    def process(self, query, documents, turn):
        documents.sort(key=lambda d: d.score)  # sorted in place, nothing returned


class DictRetriever(Retriever):
    name = "dict_retriever"
    enabled_by_default = False

    def retrieve(self, query, turn, k):
        return [{"chunk_id": 1, "score": 1.0}]


class InMemoryRetriever(Retriever):
    name = "in_memory"
    enabled_by_default = False

    def retrieve(self, query, turn, k):
        return [RetrievedChunk(chunk_id=10_000_000, text="Soak the beans overnight.", score=1.0, document_id=1,
                               source="tips", retriever=self.name)]


class NumberDelta(ResponseAugmenter):
    name = "number_delta"
    enabled_by_default = False

    def on_delta(self, text, turn):
        return len(text)


class BrokenPlugin:
    @staticmethod
    @hookimpl
    def register_guardrails(register):
        register(StringGuard)

    @staticmethod
    @hookimpl
    def register_query_transformers(register):
        register(StringTransformer)

    @staticmethod
    @hookimpl
    def register_document_postprocessors(register):
        register(NoneProcessor)

    @staticmethod
    @hookimpl
    def register_retrievers(register):
        register(DictRetriever)
        register(InMemoryRetriever)

    @staticmethod
    @hookimpl
    def register_response_augmenters(register):
        register(NumberDelta)


@pytest.fixture
def profile_with(ragchat_settings_override):
    def configure(**profile):
        ragchat_settings_override(PLUGINS=["tests.test_wrong_results.BrokenPlugin"], PROFILES={"default": profile})
    return configure


@pytest.mark.parametrize(("profile", "said"), [
    ({"guardrails": ["string_guard"]},
     "guardrail 'string_guard': check_input() returned str, not None or a Refusal"),
    ({"query_transformers": ["string_transformer"]},
     "query_transformer 'string_transformer': transform() returned str, not a Query, SkipRetrieval or an EndTurn"),
    ({"document_postprocessors": ["none_processor"]},
     "document_postprocessor 'none_processor': process() returned NoneType, not a list of RetrievedChunk"),
    ({"retrievers": ["dict_retriever"]},
     "retriever 'dict_retriever': retrieve() returned a list holding dict, not a list of RetrievedChunk"),
])
def test_a_wrong_result_fails_the_turn_naming_the_component(profile_with, product_corpus, conversation, caplog,
                                                            profile, said):
    profile_with(**profile)
    result = run_turn_sync(conversation, QUESTION)
    assert result.status == "error" and result.error.code == "internal_error"
    assert "$699" not in result.answer  # a guardrail that says nothing usable fails closed
    name = said.split("'")[1]
    assert f"'{name}' of plugin 'tests.test_wrong_results.BrokenPlugin'" in result.trace["error"]["raised_by"]
    assert said in result.trace["error"]["detail"] and said in caplog.text


def test_a_streamed_augmenters_wrong_delta_names_it(profile_with, product_corpus, conversation):
    profile_with(response_augmenters=["citations", "number_delta"])
    result = run_turn_sync(conversation, QUESTION, stream=True)
    assert result.status == "error"
    assert "response_augmenter 'number_delta': on_delta() returned int, not a str" in result.trace["error"]["detail"]


def test_a_retrievers_hits_that_are_no_stored_chunks_are_dropped_with_a_warning_naming_it(profile_with,
                                                                                        product_corpus,
                                                                                        conversation):
    profile_with(retrievers=["vector", "in_memory"])
    result = run_turn_sync(conversation, QUESTION)
    assert "$699" in result.answer
    assert any(w.startswith("retriever 'in_memory': 1 chunk(s)") and "no stored chunk" in w
               for w in result.trace["warnings"]), result.trace.get("warnings")
    assert Message.objects.filter(role="assistant", status="complete").count() == 1
