"""Ingestion into the database: formats, idempotency, atomic replacement, failures, batching,
embedding spaces and re-embedding.

This module is also a plugin (listed in ``RAGCHAT["PLUGINS"]`` by the tests that need it): it
registers embedders that record their batches and fail on demand, through the public hook.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest
from django.db import connection

from django_ragchat import hookimpl
from django_ragchat.ingestion.loaders import DocumentLoadError
from django_ragchat.ingestion.pipeline import IngestReport, ingest_paths, ingest_text, reembed
from django_ragchat.models import Chunk, Document
from django_ragchat.profiles import get_profile
from django_ragchat.stages.embedders import HashingEmbedder
from django_ragchat.turn.context import components_for

pytestmark = pytest.mark.django_db

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parent.parent


class RecordingEmbedder(HashingEmbedder):
    """The hashing embedder in its own space, recording the size of every batch it embeds and
    failing on any batch that contains a text with the word EXPLODE."""

    name = "recording"
    batches: list[int] = []

    @property
    def space(self) -> str:
        return f"recording-{self.dimension}"

    def embed(self, texts):
        type(self).batches.append(len(texts))
        if any("EXPLODE" in t for t in texts):
            raise ConnectionError("the embedding server is down")
        return super().embed(texts)


@hookimpl
def register_embedders(register):
    register(RecordingEmbedder)


@pytest.fixture
def recording(ragchat_settings_override):
    """Profiles ``recording`` (64 dimensions) and ``recording32`` (another space)."""
    RecordingEmbedder.batches = []
    ragchat_settings_override(
        PLUGINS=["tests.test_ingestion"],
        PROFILES={"default": {}, "recording": {"embedder": "recording", "options": {"recording": {"dimension": 64}}},
                  "recording32": {"embedder": "recording", "options": {"recording": {"dimension": 32}}}},
    )
    return RecordingEmbedder


@pytest.fixture
def corpus(tmp_path):
    """A folder with one document of each format."""
    folder = tmp_path / "corpus"
    shutil.copytree(FIXTURES / "formats", folder)
    return folder


def chunk_ids(source: str, space: str | None = None) -> list[int]:
    chunks = Chunk.objects.filter(document__source=source)
    if space:
        chunks = chunks.filter(space=space)
    return list(chunks.order_by("ordinal").values_list("id", flat=True))


def default_space() -> str:
    return components_for(get_profile()).embedder.space


# --- Formats and what is stored -----------------------------------------------------------------


def test_every_format_is_ingested_with_headings_metadata_and_embeddings(corpus):
    report = ingest_paths([corpus], root=corpus, metadata={"site": "harbour"})

    assert report.counts == {"created": 4, "updated": 0, "unchanged": 0, "failed": 0}
    by_source = {r.source: r for r in report.results}
    assert sorted(by_source) == ["guide.md", "manual.rst", "notes.txt", "page.html"]
    documents = {d.source: d for d in Document.objects.all()}
    assert {s: d.content_type for s, d in documents.items()} == {
        "guide.md": "markdown", "manual.rst": "rst", "notes.txt": "text", "page.html": "html",
    }
    assert {s: d.title for s, d in documents.items()} == {
        "guide.md": "Lighthouse guide", "manual.rst": "Harbour crane manual",
        "notes.txt": "Ferry notes", "page.html": "Tide tables",
    }
    assert documents["guide.md"].checksum == hashlib.sha256((corpus / "guide.md").read_bytes()).hexdigest()
    assert all(d.metadata == {"site": "harbour"} for d in documents.values())

    lamps = Chunk.objects.get(document__source="guide.md", heading="Lighthouse guide > Lamps")
    assert "40 W halogen bulb" in lamps.text
    assert lamps.space == default_space()
    assert lamps.embedding.dtype == np.float32 and lamps.embedding.shape == (256,)  # the default embedder: wordllama
    assert lamps.token_count > 0
    assert lamps.metadata == {"site": "harbour", "heading_path": ["Lighthouse guide", "Lamps"]}
    assert Chunk.objects.filter(document__source="manual.rst", heading="Harbour crane manual > Lifting").exists()
    html = " ".join(Chunk.objects.filter(document__source="page.html").values_list("text", flat=True))
    assert "Neap tides fall between spring tides" in html and "script text" not in html and "Home | About" not in html
    # The per-file results agree with the rows.
    for source, result in by_source.items():
        assert result.document_id == documents[source].pk
        assert result.chunks == Chunk.objects.filter(document__source=source).count() > 0
    assert report.chunks_written == Chunk.objects.count()


def test_sources_are_relative_to_the_working_folder_without_root(corpus, monkeypatch):
    monkeypatch.chdir(corpus.parent)
    report = ingest_paths(["corpus/guide.md", "./corpus/notes.txt", corpus / "page.html"])
    assert [r.source for r in report.results] == ["corpus/guide.md", "corpus/notes.txt", "corpus/page.html"]


def test_one_file_by_another_spelling_is_the_same_document(corpus, monkeypatch, tmp_path):
    monkeypatch.chdir(corpus.parent)
    first = ingest_paths(["corpus/guide.md"])
    again = ingest_paths([corpus / "guide.md", "./corpus/../corpus/guide.md"])
    assert [r.status for r in again.results] == ["unchanged"]
    assert again.results[0].document_id == first.results[0].document_id
    assert list(Document.objects.values_list("source", flat=True)) == ["corpus/guide.md"]


def test_a_file_stored_by_its_absolute_path_keeps_its_document(corpus, monkeypatch, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # outside the corpus: the absolute path is stored
    first = ingest_paths([corpus / "notes.txt"])
    assert first.results[0].source == (corpus / "notes.txt").as_posix()
    monkeypatch.chdir(corpus.parent)
    (corpus / "notes.txt").write_text("Changed notes.\n")
    again = ingest_paths(["corpus/notes.txt"])
    assert [(r.status, r.source) for r in again.results] == [("updated", first.results[0].source)]
    assert Document.objects.count() == 1


def test_a_file_outside_the_root_fails_and_a_bad_root_is_refused(corpus, tmp_path):
    outside = tmp_path / "outside.md"
    outside.write_text("# Outside\n\ntext")
    report = ingest_paths([corpus / "guide.md", outside], root=corpus)
    assert [(r.source, r.status) for r in report.results] == [("guide.md", "created"), (outside.as_posix(), "failed")]
    assert "not inside the root folder" in report.results[1].reason
    with pytest.raises(ValueError, match="not a folder"):
        ingest_paths([corpus], root=corpus / "guide.md")


# --- Idempotency and atomic replacement -----------------------------------------------------


def test_a_second_run_changes_nothing_and_a_changed_file_alone_is_replaced(corpus):
    first = ingest_paths([corpus], root=corpus)
    assert first.count("created") == 4
    ids_before = {s: chunk_ids(s) for s in ("guide.md", "manual.rst", "notes.txt", "page.html")}
    documents_before = list(Document.objects.order_by("pk").values_list("pk", "checksum", "updated_at"))

    second = ingest_paths([corpus], root=corpus)
    assert second.counts == {"created": 0, "updated": 0, "unchanged": 4, "failed": 0}
    assert second.embed_calls == 0 and second.chunks_written == 0
    assert {r.source: r.chunks for r in second.results} == {s: len(ids) for s, ids in ids_before.items()}
    assert {s: chunk_ids(s) for s in ids_before} == ids_before
    assert list(Document.objects.order_by("pk").values_list("pk", "checksum", "updated_at")) == documents_before

    (corpus / "guide.md").write_text("# Lighthouse guide\n\n## Lamps\n\nThe lamp now uses a 12 W LED.\n")
    third = ingest_paths([corpus], root=corpus)
    assert {r.source: r.status for r in third.results} == {
        "guide.md": "updated", "manual.rst": "unchanged", "notes.txt": "unchanged", "page.html": "unchanged",
    }
    new_ids = chunk_ids("guide.md")
    assert new_ids and not set(new_ids) & set(ids_before["guide.md"])
    assert not Chunk.objects.filter(pk__in=ids_before["guide.md"]).exists()
    assert Chunk.objects.get(document__source="guide.md").text == "Lighthouse guide > Lamps\nThe lamp now uses a 12 W LED."
    for source in ("manual.rst", "notes.txt", "page.html"):
        assert chunk_ids(source) == ids_before[source]
    guide = Document.objects.get(source="guide.md")
    assert guide.pk == documents_before[0][0]  # the same document, updated in place
    assert guide.checksum != documents_before[0][1]


def test_a_changed_file_that_no_longer_loads_keeps_its_old_chunks(corpus):
    ingest_paths([corpus], root=corpus)
    old_ids = chunk_ids("guide.md")
    old_checksum = Document.objects.get(source="guide.md").checksum

    (corpus / "guide.md").write_bytes(b"# Lighthouse guide\n\nbroken \xff\xfe bytes\n")
    report = ingest_paths([corpus], root=corpus)

    failed = report.failed
    assert [(r.source, r.status) for r in failed] == [("guide.md", "failed")]
    assert failed[0].reason.startswith("not valid UTF-8 text")
    assert report.count("unchanged") == 3
    assert chunk_ids("guide.md") == old_ids
    assert Document.objects.get(source="guide.md").checksum == old_checksum


def test_metadata_changes_replace_the_chunks(corpus):
    ingest_paths([corpus / "notes.txt"], root=corpus, metadata={"v": 1})
    old_ids = chunk_ids("notes.txt")
    assert ingest_paths([corpus / "notes.txt"], root=corpus, metadata={"v": 1}).count("unchanged") == 1
    report = ingest_paths([corpus / "notes.txt"], root=corpus, metadata={"v": 2})
    assert report.results[0].status == "updated"
    assert not set(chunk_ids("notes.txt")) & set(old_ids)
    assert set(Chunk.objects.values_list("metadata__v", flat=True)) == {2}
    with pytest.raises(TypeError, match="metadata must be a dict"):
        ingest_paths([corpus], metadata=["not", "a", "dict"])


# --- Unreadable input -----------------------------------------------------------------------


def test_unreadable_files_are_reported_and_skipped_while_the_others_ingest(corpus, tmp_path):
    (corpus / "latin1.md").write_bytes("# Caf\xe9\n".encode("latin-1"))
    (corpus / "image.txt").write_bytes(b"GIF89a\x00\x01\x00\x00binary")
    (corpus / "folder.md").mkdir()  # a folder with a document suffix is walked, not read
    (corpus / "folder.md" / "inside.md").write_text("# Inside\n\nA document inside a folder named folder.md.")
    (corpus / "empty.md").write_text("")
    missing = tmp_path / "missing.md"
    unsupported = tmp_path / "data.csv"
    unsupported.write_text("a,b\n1,2\n")

    report = ingest_paths([corpus, missing, unsupported], root=tmp_path)

    reasons = {r.source: r.reason for r in report.failed}
    assert reasons.pop("corpus/latin1.md").startswith("not valid UTF-8 text (byte 0xe9")
    assert reasons == {
        "corpus/image.txt": "binary file",
        "missing.md": "not found (no such file or folder)",
        "data.csv": "unsupported file type .csv",
    }
    assert report.count("created") == 6  # the four formats, the folder's document, the empty file
    assert Document.objects.filter(source="corpus/folder.md/inside.md").exists()
    empty = next(r for r in report.results if r.source == "corpus/empty.md")
    assert empty.status == "created" and empty.chunks == 0
    assert not Document.objects.filter(source__in=["corpus/latin1.md", "corpus/image.txt", "missing.md"]).exists()
    # An empty document is complete as it is: the next run leaves it alone.
    again = ingest_paths([corpus], root=tmp_path)
    assert next(r for r in again.results if r.source == "corpus/empty.md").status == "unchanged"


def test_ingest_text_stores_updates_and_refuses_bad_text():
    first = ingest_text("faq/returns.md", "# Returns\n\nReturns are free within 30 days.", metadata={"lang": "en"})
    assert (first.status, first.chunks) == ("created", 1)
    document = Document.objects.get(source="faq/returns.md")
    assert document.title == "Returns" and document.metadata == {"lang": "en"}
    assert ingest_text("faq/returns.md", "# Returns\n\nReturns are free within 30 days.",
                       metadata={"lang": "en"}).status == "unchanged"
    retitled = ingest_text("faq/returns.md", "# Returns\n\nReturns are free within 30 days.",
                           metadata={"lang": "en"}, title="Return policy")
    assert retitled.status == "updated"
    assert Document.objects.get(source="faq/returns.md").title == "Return policy"
    ids = chunk_ids("faq/returns.md")

    with pytest.raises(DocumentLoadError, match="NUL"):
        ingest_text("faq/returns.md", "Returns\x00 are free")
    with pytest.raises(DocumentLoadError, match="unsupported content type 'pdf'"):
        ingest_text("faq/returns.md", "text", content_type="pdf")
    with pytest.raises(DocumentLoadError, match="source"):
        ingest_text("", "text")
    assert chunk_ids("faq/returns.md") == ids  # nothing lost

    html = ingest_text("faq/page.html", "<h1>Page</h1><p>Hello <b>there</b>.</p>", content_type="html")
    assert html.status == "created"
    assert Chunk.objects.get(document__source="faq/page.html").text == "Page\nHello there."


# --- Batching and failures of the embedder --------------------------------------------------


def test_texts_are_embedded_in_batches_across_documents(recording, tmp_path):
    for n in range(6):  # six documents of two chunks each
        (tmp_path / f"doc{n}.md").write_text(f"# Doc {n}\n\n## A\n\nFirst part {n}.\n\n## B\n\nSecond part {n}.\n")

    report = ingest_paths([tmp_path], profile="recording", batch_size=5)

    assert report.count("created") == 6 and report.chunks_written == 12
    assert recording.batches == [5, 5, 2]
    assert (report.embed_calls, report.embedded_texts) == (3, 12)
    assert set(Chunk.objects.values_list("space", flat=True)) == {"recording-64"}
    assert report.space == "recording-64"
    assert report.embed_seconds >= 0 and report.store_seconds > 0 and report.elapsed >= report.store_seconds
    # The vectors landed on the right chunks: each equals its own text's embedding.
    embedder = components_for(get_profile("recording")).embedder
    for chunk in Chunk.objects.all():
        np.testing.assert_array_equal(chunk.embedding, embedder.embed([chunk.text])[0])


def test_an_embedding_failure_fails_only_its_documents_and_keeps_their_old_chunks(recording, tmp_path):
    for name in ("a", "b", "c"):
        (tmp_path / f"{name}.md").write_text(f"# {name}\n\nThe first version of {name}.\n")
    first = ingest_paths([tmp_path], profile="recording", batch_size=1)
    source = {Path(r.path).name: r.source for r in first.results}
    old_b = chunk_ids(source["b.md"])

    (tmp_path / "a.md").write_text("# a\n\nThe second version of a.\n")
    (tmp_path / "b.md").write_text("# b\n\nThe second version of b. EXPLODE\n")
    recording.batches = []
    report = ingest_paths([tmp_path], profile="recording", batch_size=1)

    statuses = {Path(r.source).name: (r.status, r.reason) for r in report.results}
    assert statuses == {
        "a.md": ("updated", ""),
        "b.md": ("failed", "embedding failed: the embedding server is down"),
        "c.md": ("unchanged", ""),
    }
    assert chunk_ids(source["b.md"]) == old_b
    assert Chunk.objects.get(document__source=source["b.md"]).text.endswith("first version of b.")
    assert Chunk.objects.get(document__source=source["a.md"]).text.endswith("second version of a.")


@pytest.fixture
def refuse_chunks_saying_refuse():
    """A real database trigger that refuses to insert a chunk whose text contains REFUSE."""
    table = Chunk._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("CREATE FUNCTION ragchat_test_refuse() RETURNS trigger AS $$ BEGIN "
                           "IF NEW.text LIKE '%REFUSE%' THEN RAISE EXCEPTION 'refused by trigger'; END IF; "
                           "RETURN NEW; END $$ LANGUAGE plpgsql")
            cursor.execute(f"CREATE TRIGGER ragchat_test_refuse BEFORE INSERT ON {table} "
                           "FOR EACH ROW EXECUTE FUNCTION ragchat_test_refuse()")
        else:
            cursor.execute(f"CREATE TRIGGER ragchat_test_refuse BEFORE INSERT ON {table} "
                           "WHEN NEW.text LIKE '%REFUSE%' BEGIN SELECT RAISE(ABORT, 'refused by trigger'); END")
    yield  # the test's transaction is rolled back afterwards, trigger and all


def test_a_database_error_fails_only_its_document_and_keeps_its_old_chunks(corpus, refuse_chunks_saying_refuse):
    ingest_paths([corpus], root=corpus)
    old_guide = chunk_ids("guide.md")
    (corpus / "guide.md").write_text("# Lighthouse guide\n\nREFUSE this version.\n")
    (corpus / "notes.txt").write_text("Ferry notes\n\nThe ferry now leaves at 07:30.\n")

    report = ingest_paths([corpus], root=corpus)  # both changed files are stored in one transaction

    results = {r.source: r for r in report.results}
    assert results["guide.md"].status == "failed"
    assert results["guide.md"].reason.startswith("database error:") and "refused by trigger" in results["guide.md"].reason
    assert results["notes.txt"].status == "updated"
    assert chunk_ids("guide.md") == old_guide
    assert Document.objects.get(source="guide.md").checksum == hashlib.sha256(
        (FIXTURES / "formats" / "guide.md").read_bytes()).hexdigest()
    assert "07:30" in Chunk.objects.get(document__source="notes.txt").text


def test_progress_is_reported_once_per_document_up_to_the_total(corpus, tmp_path):
    (corpus / "bad.md").write_bytes(b"\x00")
    calls = []
    ingest_paths([corpus], progress=lambda done, total, source: calls.append((done, total, Path(source).name)))
    assert [c[:2] for c in calls] == [(n, 5) for n in range(1, 6)]
    assert sorted(c[2] for c in calls) == ["bad.md", "guide.md", "manual.rst", "notes.txt", "page.html"]


# --- Embedding spaces and re-embedding ------------------------------------------------------


def test_each_space_is_filled_separately_and_a_content_change_clears_stale_spaces(recording, corpus):
    ingest_paths([corpus], root=corpus, profile="recording")
    in_64 = chunk_ids("guide.md", "recording-64")

    other = ingest_paths([corpus], root=corpus, profile="recording32")
    assert other.counts["updated"] == 4  # same text, newly embedded in this space
    assert chunk_ids("guide.md", "recording-64") == in_64  # the first space is untouched
    assert len(chunk_ids("guide.md", "recording-32")) == len(in_64)
    assert ingest_paths([corpus], root=corpus, profile="recording32").counts["unchanged"] == 4

    # New text: its chunks in every other space describe the old text and go.
    (corpus / "guide.md").write_text("# Lighthouse guide\n\nAll new.\n")
    ingest_paths([corpus], root=corpus, profile="recording")
    assert chunk_ids("guide.md", "recording-32") == []
    assert len(chunk_ids("manual.rst", "recording-32")) > 0


def test_reembed_copies_chunks_into_a_new_space_in_batches(recording, corpus):
    ingest_paths([corpus], root=corpus)
    old = list(Chunk.objects.order_by("document_id", "ordinal").values_list("document_id", "ordinal", "text", "heading"))
    embedder = components_for(get_profile("recording")).embedder
    progress = []

    report = reembed(embedder, batch_size=4, progress=lambda done, total, source: progress.append((done, total)))

    assert isinstance(report, IngestReport) and report.space == "recording-64"
    assert report.counts == {"created": 4, "updated": 0, "unchanged": 0, "failed": 0}
    assert recording.batches and max(recording.batches) == 4 and sum(recording.batches) == len(old)
    assert progress == [(n, 4) for n in range(1, 5)]
    new = list(Chunk.objects.filter(space="recording-64").order_by("document_id", "ordinal")
               .values_list("document_id", "ordinal", "text", "heading"))
    assert new == old
    assert Chunk.objects.filter(space=default_space()).count() == len(old)  # the old space stays
    for chunk in Chunk.objects.filter(space="recording-64"):
        np.testing.assert_array_equal(chunk.embedding, embedder.embed([chunk.text])[0])

    again = reembed(embedder)
    assert again.counts["unchanged"] == 4 and again.embed_calls == 0


def test_reembed_limited_to_some_documents_and_a_failure_stores_nothing(recording, corpus):
    ingest_paths([corpus], root=corpus)
    embedder = components_for(get_profile("recording")).embedder
    report = reembed(embedder, documents=Document.objects.filter(source__in=["guide.md", "notes.txt"]))
    assert sorted(r.source for r in report.results) == ["guide.md", "notes.txt"]
    assert set(Chunk.objects.filter(space="recording-64").values_list("document__source", flat=True)) == {
        "guide.md", "notes.txt"}

    ingest_text("boom.md", "# Boom\n\nEXPLODE here.")
    failed = reembed(embedder, documents=[Document.objects.get(source="boom.md")])
    assert failed.results[0].status == "failed" and "embedding server is down" in failed.results[0].reason
    assert not Chunk.objects.filter(document__source="boom.md", space="recording-64").exists()


# --- The demo corpus ------------------------------------------------------------------------


def test_the_demo_corpus_ingests_offline_without_failures(monkeypatch):
    monkeypatch.chdir(REPO)
    report = ingest_paths(["docs", "example_project/sample_docs"])
    assert report.failed == []
    assert report.count("created") >= 4
    assert Document.objects.filter(source="example_project/sample_docs/aurora-x2.md").exists()
    pricing = Chunk.objects.get(document__source="example_project/sample_docs/aurora-x2.md", heading="Aurora X2 > Pricing")
    assert "The Aurora X2 costs $699" in pricing.text
