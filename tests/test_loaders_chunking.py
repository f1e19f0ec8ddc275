"""Tests for the pure-Python document loaders and chunker (no Django needed).

Run with: python -m pytest -q tests/test_loaders_chunking.py -p no:django
"""

from __future__ import annotations

import hashlib
import random
import re
from pathlib import Path

import pytest

from django_ragchat.ingestion.chunking import TextChunk, chunk_document, split_text
from django_ragchat.ingestion.loaders import (
    SUPPORTED_SUFFIXES,
    DocumentLoadError,
    LoadedDocument,
    Section,
    iter_document_paths,
    load_document,
)

MARKDOWN = """\
---
title: Front matter title
tags: [a, b]
---
Intro before any heading.

# User Guide

Welcome to **ragchat**, see [the docs](https://example.com/docs) and `pip install`.

## Install

1. First step
2. Second step
   - nested item

```python
import ragchat  # code stays verbatim
```

| Option | Default |
|--------|---------|
| k      | 5       |

### On PostgreSQL

Enable the *pgvector* extension.

## Empty section

# Appendix

Last words.
"""

RST = """\
==========
User Guide
==========

Intro paragraph with *emphasis* and ``literal``.

.. contents::

.. include:: /etc/passwd

.. raw:: html

   <script>alert(1)</script>

Install
=======

- item one
- item two with :unknownrole:`text`

On PostgreSQL
-------------

Enable the pgvector extension. |name| rocks.

.. |name| replace:: ragchat

Usage
=====

::

   ragchat serve
"""

HTML = """\
<!doctype html>
<html>
<head><title>Page Title</title><style>body { color: red }</style></head>
<body>
<nav>Home | Docs | Blog</nav>
<script>var tracking = 1;</script>
<h1>User Guide</h1>
<p>Intro with a <a href="/x">link</a>
spanning source lines.</p>
<!-- a comment -->
<div>Line one<br>line two</div>
<h2>Install</h2>
<ul><li>one<ul><li>nested</li></ul></li><li>two</li></ul>
<pre>  indented
    code</pre>
<h3>On PostgreSQL</h3>
<p>Enable pgvector.</p>
<footer>Copyright footer</footer>
</body>
</html>
"""

TEXT = "Release notes for 1.0\n\nFirst paragraph.\nStill first.\n\n\n\nSecond paragraph.\n"


def write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def by_path(doc: LoadedDocument) -> dict[tuple[str, ...], str]:
    return {s.heading_path: s.text for s in doc.sections}


# ---------------------------------------------------------------- loaders


def test_supported_suffixes():
    assert SUPPORTED_SUFFIXES == {".md", ".markdown", ".rst", ".txt", ".html", ".htm"}


def test_markdown_sections_and_plain_text(tmp_path):
    path = write(tmp_path / "guide.md", MARKDOWN)
    doc = load_document(path)

    assert doc.content_type == "markdown"
    assert doc.title == "User Guide"
    assert doc.source == str(path)
    assert doc.checksum == hashlib.sha256(path.read_bytes()).hexdigest()

    sections = by_path(doc)
    assert list(sections) == [
        (),
        ("User Guide",),
        ("User Guide", "Install"),
        ("User Guide", "Install", "On PostgreSQL"),
        ("Appendix",),
    ]  # the empty "Empty section" is dropped; "# Appendix" resets the path
    assert sections[()] == "Intro before any heading."
    # Markup stripped, link text kept, front matter skipped.
    assert sections[("User Guide",)] == "Welcome to ragchat, see the docs and pip install."
    assert "Front matter" not in " ".join(sections.values())
    install = sections[("User Guide", "Install")]
    assert "1. First step\n2. Second step\n  - nested item" in install
    assert "import ragchat  # code stays verbatim" in install
    assert "Option | Default\nk | 5" in install
    assert sections[("User Guide", "Install", "On PostgreSQL")] == "Enable the pgvector extension."


def test_markdown_leaves_out_the_text_of_scripts_and_styles_in_raw_html(tmp_path):
    # Tags were stripped, but a script's code stayed in the text and reached answers.
    doc = load_document(write(tmp_path / "gifts.md", (
        "# Gift Cards <b>bold</b>\n\nGift cards never expire. <script>alert(1)</script> Sold in "
        "<b>three</b> amounts. <style>p { color: red }</style>\n\n<script>\nalert(2)\n</script>\n\n"
        "<div>A block <noscript>Enable scripts</noscript> kept.</div>\n")))
    text = " ".join(by_path(doc).values())
    assert doc.title == "Gift Cards bold"
    assert "alert" not in text and "color" not in text and "Enable scripts" not in text
    assert "Gift cards never expire." in text and "Sold in three amounts." in text and "A block kept." in text


@pytest.mark.parametrize("name, text", [
    ("fines.md", "# Fines\n\nDog fouling fines are £100 <img src=x onerror=alert(1)>. Report it <b>online</b>, "
                 "or <a href=\"/call\">call us</a>, please.\n"),
    ("fines.html", "<h1>Fines</h1><p>Dog fouling fines are £100\n <img src=x onerror=alert(1)>\n. Report it "
                   "<b>online</b>, or <a href=\"/call\">call us</a>, please.</p>"),
])
def test_an_element_with_no_text_leaves_no_space_before_the_stop(tmp_path, name, text):
    # A town council's trial: "£100 <img ...>." was read as "£100 ." and quoted as "£100  [1]."
    doc = load_document(write(tmp_path / name, text))
    assert by_path(doc)[("Fines",)] == "Dog fouling fines are £100. Report it online, or call us, please."


@pytest.mark.parametrize("name, text", [
    # An image without alt text, an inline script, a block of raw HTML with tags in it.
    ("fees.md", "# Fees\n\nA parking permit costs £400 ![](permit.png). Pay it <script>track()</script>.\n\n"
                "<p>Renew it by <b>1 March</b>, online.</p>\n"),
    # A script or style between the text and its stop.
    ("fees.html", "<h1>Fees</h1><p>A parking permit costs £400 <script>track()</script>. Pay it "
                  "<style>p {}</style>.</p><p>Renew it by <b>1 March</b>, online.</p>"),
])
def test_markup_that_leaves_no_text_leaves_no_space_before_the_stop(tmp_path, name, text):
    # A parish council's trial, after be1bc63: "£400 ![](permit.png)." and "<p>... <b>1 March</b>,"
    # in a Markdown file were read as "£400 ." and "1 March ,", and quoted as "£400  [1]."
    doc = load_document(write(tmp_path / name, text))
    assert " ." not in by_path(doc)[("Fees",)] and " ," not in by_path(doc)[("Fees",)]
    assert by_path(doc)[("Fees",)].split() == "A parking permit costs £400. Pay it. Renew it by 1 March, online.".split()


def test_markdown_title_falls_back_to_first_line_then_stem(tmp_path):
    assert load_document(write(tmp_path / "a.md", "Just a line\n\nmore")).title == "Just a line"
    assert load_document(write(tmp_path / "b.md", "## Only h2\n\ntext")).title == "Only h2"
    empty = load_document(write(tmp_path / "empty-doc.markdown", ""))
    assert empty.title == "empty-doc"
    assert empty.sections == ()


def test_rst_sections(tmp_path):
    doc = load_document(write(tmp_path / "guide.rst", RST))
    assert doc.content_type == "rst"
    assert doc.title == "User Guide"
    sections = by_path(doc)
    assert list(sections) == [
        ("User Guide",),
        ("User Guide", "Install"),
        ("User Guide", "Install", "On PostgreSQL"),
        ("User Guide", "Usage"),
    ]
    assert sections[("User Guide",)] == "Intro paragraph with emphasis and literal."
    assert sections[("User Guide", "Install")] == "item one\n\nitem two with :unknownrole:`text`"
    assert sections[("User Guide", "Install", "On PostgreSQL")] == (
        "Enable the pgvector extension. ragchat rocks."
    )
    assert sections[("User Guide", "Usage")] == "ragchat serve"
    everything = "\n".join(sections.values())
    # No file inclusion, no raw passthrough, no error messages in the text.
    assert "root:" not in everything
    assert "alert" not in everything
    assert "ERROR" not in everything and "Unknown" not in everything


def test_rst_is_silent_on_broken_markup(tmp_path, capsys):
    doc = load_document(write(tmp_path / "bad.rst", "Title\n===\n\n*unclosed emphasis\n\n.. nosuch::\n"))
    assert doc.title == "Title"
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


def test_html_sections(tmp_path):
    doc = load_document(write(tmp_path / "page.html", HTML))
    assert doc.content_type == "html"
    assert doc.title == "Page Title"
    sections = by_path(doc)
    assert list(sections) == [
        ("User Guide",),
        ("User Guide", "Install"),
        ("User Guide", "Install", "On PostgreSQL"),
    ]
    assert sections[("User Guide",)] == (
        "Intro with a link spanning source lines.\n\nLine one\nline two"
    )
    assert sections[("User Guide", "Install")] == "- one\n  - nested\n- two\n\n  indented\n    code"
    everything = "\n".join(sections.values())
    for dropped in ("Home | Docs", "tracking", "color: red", "Copyright", "a comment"):
        assert dropped not in everything


def test_html_title_falls_back_to_h1(tmp_path):
    doc = load_document(write(tmp_path / "x.htm", "<h1>Heading One</h1><p>Body</p>"))
    assert doc.title == "Heading One"
    assert doc.sections == (Section(("Heading One",), "Body"),)


def test_text_document(tmp_path):
    doc = load_document(write(tmp_path / "notes.txt", TEXT))
    assert doc.content_type == "text"
    assert doc.title == "Release notes for 1.0"
    assert doc.sections == (
        Section((), "Release notes for 1.0\n\nFirst paragraph.\nStill first.\n\nSecond paragraph."),
    )


def test_text_title_truncated(tmp_path):
    doc = load_document(write(tmp_path / "long.txt", "word " * 100))
    assert 0 < len(doc.title) <= 120
    assert doc.title.endswith("word")


def test_bom_and_crlf_handled(tmp_path):
    path = write(tmp_path / "bom.md", b"\xef\xbb\xbf# Title\r\n\r\nBody\r\nline\r\n")
    doc = load_document(path)
    assert doc.title == "Title"
    assert doc.sections == (Section(("Title",), "Body line"),)


def test_suffix_is_case_insensitive(tmp_path):
    assert load_document(write(tmp_path / "README.MD", "# Hi\n\nx")).content_type == "markdown"


@pytest.mark.parametrize(
    "name, content, reason",
    [
        ("latin1.txt", "caf\u00e9".encode("latin-1"), "not valid UTF-8 text"),
        ("blob.md", b"PK\x03\x04\x00\x00binary", "binary file"),
        ("wide.txt", "hello".encode("utf-16"), "UTF-16 encoded text is not supported"),
        ("doc.pdf", b"%PDF-1.4", "unsupported file type .pdf"),
        ("Makefile", b"all:", "unsupported file type (no file extension)"),
    ],
)
def test_load_errors(tmp_path, name, content, reason):
    path = write(tmp_path / name, content)
    with pytest.raises(DocumentLoadError) as info:
        load_document(path)
    assert reason in str(info.value)
    assert info.value.reason.startswith(reason)
    assert info.value.path == path
    assert str(path) in str(info.value)


def test_directory_and_missing_file_errors(tmp_path):
    folder = tmp_path / "folder.md"
    folder.mkdir()
    with pytest.raises(DocumentLoadError, match="is a directory"):
        load_document(folder)
    with pytest.raises(DocumentLoadError, match="not found"):
        load_document(tmp_path / "missing.md")


def test_document_load_error_pickles():
    import pickle

    err = pickle.loads(pickle.dumps(DocumentLoadError(Path("a.md"), "binary file")))
    assert (err.path, err.reason, str(err)) == (Path("a.md"), "binary file", "a.md: binary file")


def test_iter_document_paths(tmp_path):
    for rel in [
        "b.md",
        "a.txt",
        "notes.pdf",
        ".hidden.md",
        ".git/config.md",
        "sub/z.rst",
        "sub/deeper/page.HTML",
        "sub/.cache/x.md",
        "sub/image.png",
        "zz/index.htm",
    ]:
        write(tmp_path / "docs" / rel, "x")
    extra = write(tmp_path / "extra.markdown", "x")

    found = list(iter_document_paths([tmp_path / "docs", extra, tmp_path / "docs" / "b.md"]))
    rel = [p.relative_to(tmp_path).as_posix() for p in found]
    assert rel == [
        "docs/a.txt",
        "docs/b.md",
        "docs/sub/deeper/page.HTML",
        "docs/sub/z.rst",
        "docs/zz/index.htm",
        "extra.markdown",
    ]  # sorted, hidden and unsupported skipped, duplicate b.md yielded once


def test_iter_document_paths_keeps_explicit_files_and_relative_form(tmp_path, monkeypatch):
    write(tmp_path / "docs" / "a.md", "x")
    monkeypatch.chdir(tmp_path)
    found = list(iter_document_paths([Path("docs"), Path("report.pdf")]))
    # Explicit paths pass through so load_document can explain the problem.
    assert found == [Path("docs/a.md"), Path("report.pdf")]


# ---------------------------------------------------------------- chunking


def make_doc(*sections: Section) -> LoadedDocument:
    return LoadedDocument(
        source="mem.md", title="t", sections=tuple(sections), checksum="0", content_type="markdown"
    )


def prose(seed: int, paragraphs: int = 6) -> str:
    """Deterministic pseudo-prose with distinct enough words that chunk
    positions can be found in the original text."""
    rnd = random.Random(seed)
    paras = []
    for _ in range(paragraphs):
        sentences = []
        for _ in range(rnd.randint(1, 8)):
            n = rnd.randint(3, 30)
            words = [f"w{rnd.randint(0, 9999)}" for _ in range(n)]
            sentences.append(" ".join(words).capitalize() + rnd.choice(".!?"))
        paras.append(" ".join(sentences))
    return "\n\n".join(paras)


def assert_valid_split(text: str, pieces: list[str], max_chars: int, overlap_chars: int):
    """Pieces are non-empty slices of text, in order, covering all of it,
    each at most max_chars, each overlapping the previous by at most
    overlap_chars, and never starting or ending mid-word."""
    assert pieces
    pos = 0
    prev_end = 0
    for i, piece in enumerate(pieces):
        assert piece and piece == piece.strip()
        assert len(piece) <= max_chars
        start = text.find(piece, pos)
        assert start >= 0, f"piece {i} is not a slice of the text"
        end = start + len(piece)
        if i == 0:
            assert start == 0
        else:
            assert start <= prev_end or text[prev_end:start].isspace(), "text was dropped"
            assert prev_end - start <= overlap_chars
        assert start == 0 or text[start - 1].isspace()
        assert end == len(text) or text[end].isspace()
        pos, prev_end = start + 1, end
    assert prev_end == len(text)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("max_chars, overlap_chars", [(1200, 200), (300, 60), (120, 0), (80, 40)])
def test_split_text_invariants(seed, max_chars, overlap_chars):
    text = prose(seed)
    pieces = split_text(text, max_chars=max_chars, overlap_chars=overlap_chars)
    assert_valid_split(text, pieces, max_chars, overlap_chars)


def overlap_len(a: str, b: str) -> int:
    for n in range(min(len(a), len(b)), 0, -1):
        if a.endswith(b[:n]):
            return n
    return 0


def test_overlap_present_and_bounded():
    text = " ".join(f"Sentence number {i} is here." for i in range(200))
    pieces = split_text(text, max_chars=400, overlap_chars=100)
    assert len(pieces) > 3
    for prev, nxt in zip(pieces, pieces[1:]):
        n = overlap_len(prev, nxt)
        assert 50 <= n <= 100
        # Short sentences, so the overlap is made of whole sentences.
        assert nxt.startswith("Sentence number")


def test_no_overlap_when_disabled():
    text = " ".join(f"word{i}" for i in range(500))
    pieces = split_text(text, max_chars=100, overlap_chars=0)
    assert " ".join(pieces) == text


def test_prefers_paragraph_boundaries():
    para = "Alpha beta gamma delta. " * 10  # 240 chars
    text = "\n\n".join(para.strip() + f" P{i}." for i in range(4))
    pieces = split_text(text, max_chars=600, overlap_chars=0)
    for piece in pieces:
        assert piece.endswith(("P0.", "P1.", "P2.", "P3."))


def test_prefers_sentence_over_wrapped_line_boundaries():
    # Hard-wrapped text: line breaks fall mid-sentence and must lose to the
    # sentence ends.
    sentence = "This sentence is long enough to wrap around the line and keep going on."
    words = " ".join([sentence] * 12).split(" ")
    lines = [" ".join(words[i : i + 7]) for i in range(0, len(words), 7)]
    pieces = split_text("\n".join(lines), max_chars=300, overlap_chars=0)
    assert len(pieces) > 1
    assert all(p.endswith("going on.") for p in pieces)


def test_long_word_is_cut_only_when_needed():
    text = "short " + "x" * 250 + " tail"
    pieces = split_text(text, max_chars=100, overlap_chars=20)
    assert all(len(p) <= 100 for p in pieces)
    assert pieces[0] == "short"
    assert "".join(re.sub(r"[^x]", "", p) for p in pieces) == "x" * 250


def test_chunk_document_headings_and_ordinals():
    doc = make_doc(
        Section((), "Preamble text."),
        Section(("Guide", "Install"), prose(1, paragraphs=10)),
        Section(("Guide", "Empty"), "   \n\n  "),
        Section(("Guide", "Usage"), "Short usage."),
    )
    chunks = chunk_document(doc, max_chars=300, overlap_chars=50)
    assert [c.ordinal for c in chunks] == list(range(len(chunks)))
    assert all(isinstance(c, TextChunk) for c in chunks)

    assert chunks[0].text == "Preamble text."
    assert chunks[0].heading == "" and chunks[0].heading_path == ()
    install = [c for c in chunks if c.heading_path == ("Guide", "Install")]
    assert len(install) > 2
    for c in install:
        assert c.heading == "Guide > Install"
        assert c.text == "Guide > Install\n" + c.body
        assert len(c.body) <= 300
        assert c.char_count == len(c.text)
    assert chunks[-1].text == "Guide > Usage\nShort usage."
    assert not any(c.heading_path == ("Guide", "Empty") for c in chunks)
    assert all(c.body.strip() for c in chunks)


def test_chunks_never_span_sections():
    doc = make_doc(Section(("A",), "First section."), Section(("B",), "Second section."))
    chunks = chunk_document(doc, max_chars=1000, overlap_chars=100)
    assert [c.text for c in chunks] == ["A\nFirst section.", "B\nSecond section."]


def test_chunking_loaded_markdown_end_to_end(tmp_path):
    body = "\n\n".join(prose(i, paragraphs=2) for i in range(6))
    path = write(tmp_path / "big.md", f"# Big\n\n## Part\n\n{body}\n\n## Other\n\nTail.\n")
    chunks = chunk_document(load_document(path), max_chars=500, overlap_chars=100)
    assert chunks[0].text.startswith("Big > Part\n")
    assert chunks[-1].text == "Big > Other\nTail."
    assert all(0 < len(c.body) <= 500 for c in chunks)


def test_chunking_is_deterministic():
    doc = make_doc(Section(("H",), prose(3, paragraphs=12)), Section((), prose(4)))
    first = chunk_document(doc, max_chars=250, overlap_chars=80)
    second = chunk_document(doc, max_chars=250, overlap_chars=80)
    assert first == second


@pytest.mark.parametrize("max_chars, overlap_chars", [(100, 100), (100, 150), (0, 0), (100, -1)])
def test_invalid_sizes_rejected(max_chars, overlap_chars):
    with pytest.raises(ValueError):
        chunk_document(make_doc(), max_chars=max_chars, overlap_chars=overlap_chars)


@pytest.mark.parametrize("html", ["<div>" * 100_000, "<b>" * 100_000, "<ul><li>" * 5_000])
def test_html_nested_past_the_recursion_limit_is_a_load_error(html):
    # An upload of it answered 502 ingestion_failed ("the embedder or the database failed") with a
    # RecursionError's traceback in the log; too deep to parse is the document's fault, as for rst.
    from django_ragchat.ingestion.loaders import load_text

    with pytest.raises(DocumentLoadError, match="nested too deeply"):
        load_text(html, "html", "upload/deep.html")
