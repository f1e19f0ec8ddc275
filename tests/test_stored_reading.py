"""The answerer's reading of a chunk made at ingestion and stored with it (``Chunk.analysis``,
django_ragchat/answerer/stored.py): the same passages and answers as reading the text in the
turn, the search fetching it in its own query, stale readings not used, ingestion and
``ragchat_reembed`` storing it."""

from __future__ import annotations

import dataclasses
import io

import numpy as np
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from bench.bench_extractive import BASELINE_LANG
from django_ragchat import search
from django_ragchat.answerer.passages import analyse_text, build_passages, candidate_words
from django_ragchat.answerer.selector import AnswerSelector
from django_ragchat.answerer.semantic import SentenceSimilarity, clear_caches
from django_ragchat.answerer.stored import (
    analyse_chunks,
    analysis_key,
    decode,
    read_stored,
    reading_key,
    stored_key,
)
from django_ragchat.answerer.vocabulary import Vocabulary, default_vocabulary
from django_ragchat.ingestion.pipeline import ingest_text, reembed, refresh_analyses
from django_ragchat.language import load_language
from django_ragchat.models import Chunk
from django_ragchat.plugins import embedder_for
from django_ragchat.profiles import get_profile
from django_ragchat.types import Prompt
from tests.conftest import PRODUCT_DOCS

CHUNKS = [
    ("Nimbus Tab > Overview\nThe Nimbus Tab is an 11-inch tablet for drawing. It weighs 480 grams, and the "
     "Nimbus Pen attaches to its side.", "Nimbus Tab > Overview", "Nimbus Tab"),
    ("Plans\n\nCard | Price | Loans\nAdult Card | £12 a year | 20 books\nVisitor Card | free | 5 books\n\n"
     "Cards are renewed every year at the front desk.", "Plans", "Millbrook Library"),
    ("", "", ""),
]
QUESTIONS = ["How much does the Aurora X2 cost?", "How heavy is the Nimbus Tab?", "Is the Aurora X2 waterproof?",
             "Tell me about the Zephyr Buds", "How long does the Zephyr Buds battery last?",
             "What screen does the Nimbus Tab have?"]


def _semantic():
    profile = get_profile()
    return default_vocabulary(), embedder_for(profile)


def test_a_stored_reading_is_the_reading_of_the_text_with_the_vectors_of_each_text_alone():
    vocabulary, embedder = _semantic()
    key = reading_key(vocabulary)
    for (text, heading, title), blob in zip(CHUNKS, analyse_chunks(CHUNKS, vocabulary, embedder), strict=True):
        reading = decode(blob, key, embedder.space)
        assert reading.analysis == analyse_text(text, heading, title, vocabulary)
        assert set(reading.vectors) == {s.text for s in reading.analysis[1]}
        for piece, vector in reading.vectors.items():  # the same bits as the model gives the text alone
            assert np.array_equal(vector.view(np.uint32), embedder.embed([piece])[0].view(np.uint32)), piece
        words = [w for _, w in reading.words + reading.leaf_words]
        assert set(reading.tokens) == set(words) and (words or not text)
        from_ids = embedder.embed_ids([reading.tokens[w] for w in words])
        assert np.array_equal(from_ids.view(np.uint32), embedder.embed(words).view(np.uint32))
    other = decode(analyse_chunks(CHUNKS[:1], vocabulary, embedder)[0], key, "another-space")
    assert other.vectors == {} and other.tokens == {} and other.words


def test_a_reading_made_with_other_language_data_or_none_is_not_used():
    vocabulary, embedder = _semantic()
    baseline = Vocabulary(load_language("en", BASELINE_LANG))  # the same language code, other tables
    assert reading_key(baseline) != reading_key(vocabulary)
    blob = analyse_chunks(CHUNKS[:1], vocabulary, embedder)[0]
    assert decode(blob, reading_key(baseline), embedder.space) is None
    assert stored_key(blob) == analysis_key(vocabulary, embedder) and stored_key(None) == ""
    for not_one in (None, b"", b"{}", b"RCA0" + blob[4:], blob[:len(blob) // 2], blob[:-3]):  # none, or damaged
        assert decode(not_one, reading_key(vocabulary), embedder.space) is None


def _hits(question: str, embedder, k: int = 4):
    return search.hybrid_search(embedder.space, embedder.embed([question])[0], question, k)


def test_a_turn_over_stored_readings_answers_the_same_and_tokenizes_nothing_of_its_passages(product_corpus):
    vocabulary, embedder = _semantic()
    embedded: list[str] = []

    def encode(texts):  # the model itself, noting what it is asked to embed
        embedded.extend(texts)
        return embedder.embed(texts)

    selector = AnswerSelector(vocabulary=vocabulary, space=embedder.space,
                              similarity=SentenceSimilarity(encode, encode_ids=embedder.embed_ids))
    passages_embedded_from_text = 0
    for question in QUESTIONS:
        hits = _hits(question, embedder)
        assert hits and all(hit.analysis for hit in hits)
        read = build_passages(hits, vocabulary)
        sentences = {s.text for p in read for s in p.sentences}
        passage_words = {w for text in [*sentences, *(p.heading_leaf for p in read)]
                         for _, w in candidate_words(text, vocabulary.stopwords | vocabulary.generic)}
        answers = []
        for documents in (hits, [dataclasses.replace(hit, analysis=None) for hit in hits]):
            clear_caches()
            embedded.clear()
            answers.append(selector.answer(Prompt(messages=(), question=question, search_query=question,
                                                  documents=tuple(documents))))
            if documents is hits:  # every passage text came from the rows, as vectors or token ids
                assert not (sentences | passage_words) & set(embedded), question
            else:
                passages_embedded_from_text += bool(sentences & set(embedded))
        assert answers[0] == answers[1], question
    assert passages_embedded_from_text  # without the rows, the turn embeds the passages' sentences


def test_a_stale_reading_is_read_from_the_text_until_ragchat_reembed_analysis(product_corpus):
    vocabulary, embedder = _semantic()
    question = "How much does the Aurora X2 cost?"
    expected = AnswerSelector(vocabulary=vocabulary).answer(
        Prompt(messages=(), question=question, search_query=question, documents=tuple(_hits(question, embedder))))
    stale = analyse_chunks(CHUNKS[:1], Vocabulary(load_language("en", BASELINE_LANG)))[0]
    Chunk.objects.filter(space=embedder.space).update(analysis=stale)
    hits = _hits(question, embedder)
    assert all(hit.analysis == stale for hit in hits)  # another language's reading: the turn reads the text
    assert AnswerSelector(vocabulary=vocabulary).answer(
        Prompt(messages=(), question=question, search_query=question, documents=tuple(hits))) == expected
    total = Chunk.objects.filter(space=embedder.space).count()
    Chunk.objects.filter(pk=Chunk.objects.filter(space=embedder.space).order_by("pk")[0].pk).update(analysis=None)
    assert refresh_analyses(batch_size=2) == (total, total)
    assert refresh_analyses() == (0, total)
    key = analysis_key(vocabulary, embedder)
    assert all(stored_key(blob) == key for blob in Chunk.objects.filter(space=embedder.space)
               .values_list("analysis", flat=True))
    call_command("ragchat_reembed", "--analysis", stdout=(out := io.StringIO()))
    assert f"0 of {total:,} chunk{'s' if total != 1 else ''} again; the others were current." in out.getvalue()
    Chunk.objects.filter(space=embedder.space).update(analysis=None)
    call_command("ragchat_reembed", "--analysis", stdout=(out := io.StringIO()))
    # Every one stored again: no "others" (a trial read "32 of 32 ...; the others were current").
    assert out.getvalue().strip().endswith(f"{total:,} of {total:,} chunk{'s' if total != 1 else ''} again."), out


def test_a_reading_of_another_text_is_not_used(product_corpus):
    vocabulary, embedder = _semantic()
    question = "How much does the Aurora X2 cost?"
    hits = _hits(question, embedder)
    priced = next(i for i, hit in enumerate(hits) if "$699" in hit.text)
    other = next(i for i in range(len(hits)) if i != priced)
    # A document postprocessor rewrote a passage, or the document's title was edited: the
    # reading stored describes the old one, so the turn reads the new text.
    changed = list(hits)
    changed[priced] = dataclasses.replace(hits[priced], text=hits[priced].text.replace("$699", "$649"))
    changed[other] = dataclasses.replace(hits[other], title="Renamed")
    readings = read_stored(changed, vocabulary, embedder.space)
    assert [r is None for r in readings] == [i in (priced, other) for i in range(len(hits))]
    selector = AnswerSelector(vocabulary=vocabulary)
    answers = [selector.answer(Prompt(messages=(), question=question, search_query=question, documents=tuple(docs)))
               for docs in (changed, [dataclasses.replace(hit, analysis=None) for hit in changed])]
    assert answers[0] == answers[1] and "$649" in answers[0], answers


def test_ingestion_stores_a_reading_for_an_answerer_that_reads_chunks_only(db, ragchat_settings_override):
    ragchat_settings_override(PROFILES={"default": {}, "words": {"embedder": "hashing"},
                                        "remote": {"embedder": "hashing", "llm": "openai"}})
    source, text = next(iter(PRODUCT_DOCS.items()))
    ingest_text(source, text)
    default = embedder_for(get_profile()).space
    stored = list(Chunk.objects.filter(space=default).values_list("analysis", "text", "heading"))
    assert stored and all(decode(blob, reading_key(default_vocabulary()), default).vectors for blob, *_ in stored)
    # Re-embedded into the hashing space: read by "words" (the first profile of that space whose
    # answerer reads chunks; "remote" answers with a model server), with no vectors (no model).
    reembed(embedder_for(get_profile("words")))
    hashing = Chunk.objects.exclude(space=default).values_list("analysis", flat=True)
    assert hashing and all(stored_key(blob) == analysis_key(default_vocabulary()) for blob in hashing)
    assert all(decode(blob, reading_key(default_vocabulary()), default).vectors == {} for blob in hashing)
    ragchat_settings_override(PROFILES={"default": {"embedder": "hashing", "llm": "openai"}})
    ingest_text("other.md", "# Other\n\nA text only a model server reads.", profile="default")
    assert Chunk.objects.filter(document__source="other.md").values_list("analysis", flat=True).get() is None


def test_the_search_fetches_the_reading_in_its_own_query(product_corpus):
    _, embedder = _semantic()
    question = "How much does the Aurora X2 cost?"
    counts = {}
    _hits(question, embedder)  # SQLite: the in-process vector index is loaded by the first search
    for k in (1, 4):
        with CaptureQueriesContext(connection) as queries:
            hits = _hits(question, embedder, k)
        assert len(hits) == k and all(hit.analysis for hit in hits)
        counts[k] = len(queries)
        stored = dict(Chunk.objects.filter(pk__in=[h.chunk_id for h in hits]).values_list("pk", "analysis"))
        assert all(bytes(hit.analysis) == bytes(stored[hit.chunk_id]) for hit in hits)
    assert counts[1] == counts[4], counts  # no query per passage
    for hits in (search.vector_search(embedder.space, embedder.embed([question])[0], 3),
                 search.fulltext_search(embedder.space, question, 3)):
        assert hits and all(hit.analysis for hit in hits)


def test_searches_leave_the_reading_in_the_database_when_the_answerer_does_not_read_it(product_corpus,
                                                                                     ragchat_settings_override):
    """A turn answered by a model server does not carry the stored readings (4-8 KB a chunk) out
    of the database: its stages search inside ``fetching_readings(False)``."""
    from django_ragchat.search.readings import fetching_readings
    from django_ragchat.turn.context import components_for

    ragchat_settings_override(PROFILES={"default": {}, "remote": {"llm": "openai"}})
    assert components_for(get_profile()).reads_stored_readings
    assert not components_for(get_profile("remote")).reads_stored_readings
    _, embedder = _semantic()
    question = "How much does the Aurora X2 cost?"
    vector = embedder.embed([question])[0]
    searches = (lambda: search.vector_search(embedder.space, vector, 3),
                lambda: search.fulltext_search(embedder.space, question, 3),
                lambda: search.hybrid_search(embedder.space, vector, question, 3))
    for run in searches:
        with fetching_readings(False), CaptureQueriesContext(connection) as queries:
            hits = run()
        assert hits and all(hit.analysis is None for hit in hits)
        assert not any("analysis" in q["sql"] for q in queries.captured_queries)
        assert all(hit.analysis for hit in run())  # outside the block: fetched


# --- The reading's version: stored readings stay usable across edits that do not change them ----

#: Markdown read into (text, heading, title) triples by the test itself, so a change to the
#: chunker does not count as a change to the reading.
GOLDEN_CORPORA = ("example_project/sample_docs", "bench/data/library/docs", "bench/data/followup_catalogue",
                  "tests/fixtures/outdoor_shop", "tests/fixtures/reading_golden")
#: READING_VERSION -> the digest of the golden corpus's readings made by that version's code
#: (version 3 added tests/fixtures/reading_golden, whose titles version 2 read differently;
#: version 4 reads a one-section topic page's title as its leaf, and added contact-and-support.md;
#: version 5 reads a sentence of words with a little code or quotes as prose, and added
#: site-settings.md, which version 4's code reads as dad5402ae4a97e24; version 6 reads a
#: hyphenated word's joined spelling too: "Wi-Fi" states "wifi"; version 7 takes no date for a
#: title's name, by the language's calendar words, which the fixed language data here lacks, so
#: its digest is version 6's; tests/test_sources.py's date-in-a-title test covers it; version 8
#: reads a short line stating a value as a sentence, "Serves 4.", and added red-lentil-soup.md,
#: which version 7's code reads as 80d33428897f3425; version 9 marks a bulleted list's lines,
#: keeps its short ones ("- 4 eggs") and reads a title written as a name with its small words as
#: one name, "Chickpea and Spinach Curry", and added chickpea-and-spinach-curry.md, which version
#: 8's code reads as ac3799b5e039ded9).
KNOWN_READINGS = {3: "492de19ebf27982c", 4: "bd01bc77074f1327", 5: "69000030aa109880", 6: "562d66b51a4914aa",
                  7: "562d66b51a4914aa", 8: "966078b8a4a3da33", 9: "44a0c9d11d568a65", 10: "edfe8351be793990",
                  11: "2ebf22899cb274f4"}


def golden_chunks() -> list[tuple[str, str, str]]:
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    chunks = []
    for folder in GOLDEN_CORPORA:
        for path in sorted((root / folder).rglob("*.md")):
            title, sections = path.stem, [["", []]]
            for line in path.read_text(encoding="utf-8").splitlines():
                if line.startswith("# "):
                    title = line[2:].strip()
                elif line.startswith("## "):
                    sections.append([line[3:].strip(), []])
                else:
                    sections[-1][1].append(line)
            for section, lines in sections:
                heading = f"{title} > {section}" if section else title
                chunks.append((f"{heading}\n" + "\n".join(lines).strip(), heading, title))
    return chunks


def golden_digest() -> str:
    import hashlib
    import json

    from django_ragchat.answerer.stored import _header

    vocabulary = Vocabulary(load_language("en", BASELINE_LANG))  # language data that never changes
    light = vocabulary.stopwords | vocabulary.generic
    digest = hashlib.sha256()
    for text, heading, title in golden_chunks():
        digest.update(json.dumps(_header(text, heading, title, vocabulary, light), sort_keys=True,
                                 ensure_ascii=False).encode())
    return digest.hexdigest()[:16]


def test_the_readings_change_only_with_the_reading_version():
    """Stored readings are keyed by ``READING_VERSION``, not by the code's files: an edit that does
    not change what a reading holds keeps every site's readings. One that does must raise it."""
    from django_ragchat.answerer.stored import READING_VERSION

    assert len(golden_chunks()) > 60
    found = golden_digest()
    assert KNOWN_READINGS.get(READING_VERSION) == found, (
        f"The answerer's readings of the golden corpus changed (digest {found}) while READING_VERSION "
        f"is {READING_VERSION}, which made {KNOWN_READINGS.get(READING_VERSION)}. Raise READING_VERSION "
        f"in django_ragchat/answerer/stored.py and record the new digest in KNOWN_READINGS here, so "
        f"sites re-read their chunks (ragchat_reembed --analysis) instead of using stale readings.")
