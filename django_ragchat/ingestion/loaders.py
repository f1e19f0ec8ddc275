"""Load documentation files into plain-text, heading-scoped sections.

Supported formats are Markdown, reStructuredText, HTML and plain text (see
:data:`SUPPORTED_SUFFIXES`). Every loader produces the same shape, a
:class:`LoadedDocument` whose :class:`Section` objects carry the path of
headings they sit under and their body as plain text, so the chunker and
the retrieval index never have to know about markup.

Heading paths include the document's top-level heading in every format
(for example ``("User guide", "Install", "On PostgreSQL")``). That keeps
the formats consistent; for reStructuredText it means docutils' "promote the
lone top section to document title" transform is switched off.

This module has no Django dependency. Each parser (markdown-it, BeautifulSoup, docutils: about
150 ms to import together) is imported when a file of its type is first read, so a process that
never ingests does not pay for it.
"""

from __future__ import annotations

import codecs
import hashlib
import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

__all__ = [
    "CONTENT_TYPES",
    "SUPPORTED_SUFFIXES",
    "DocumentLoadError",
    "LoadedDocument",
    "Section",
    "content_type_for",
    "iter_document_paths",
    "load_document",
    "load_text",
]

#: The ``content_type`` values, for callers that parse text without a file.
CONTENT_TYPES: tuple[str, ...] = ("markdown", "rst", "html", "text")

#: File suffixes (lower case) that :func:`load_document` understands, mapped
#: to the ``content_type`` recorded on the loaded document.
_SUFFIX_TYPES: dict[str, str] = {
    ".md": "markdown",
    ".markdown": "markdown",
    ".rst": "rst",
    ".txt": "text",
    ".html": "html",
    ".htm": "html",
}
SUPPORTED_SUFFIXES: frozenset[str] = frozenset(_SUFFIX_TYPES)

#: Fallback titles (first line of text) are cut to this many characters.
TITLE_MAX_CHARS = 120


@dataclass(frozen=True)
class Section:
    """A run of body text under one heading path.

    ``heading_path`` is empty for text that precedes the first heading (and
    for plain-text files, which have no headings).
    """

    heading_path: tuple[str, ...]
    text: str


@dataclass(frozen=True)
class LoadedDocument:
    """A file parsed into plain-text sections.

    ``source`` is ``str(path)`` exactly as passed to :func:`load_document`, so
    a caller that wants repository-relative sources passes relative paths.
    ``checksum`` is the SHA-256 hex digest of the raw file bytes, suitable for
    skipping re-ingestion of unchanged files. ``content_type`` is one of
    ``"markdown"``, ``"rst"``, ``"html"`` or ``"text"``.
    """

    source: str
    title: str
    sections: tuple[Section, ...]
    checksum: str
    content_type: str


class DocumentLoadError(Exception):
    """A file could not be read, decoded or parsed.

    ``path`` is the offending path and ``reason`` a short human-readable
    explanation such as ``"not valid UTF-8 text"`` or ``"binary file"``.
    """

    def __init__(self, path: Path | str, reason: str) -> None:
        # Passing both to Exception keeps the error picklable (it is rebuilt
        # as cls(*args)), which matters when ingestion runs in worker processes.
        super().__init__(path, reason)
        self.path = Path(path)
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


# --------------------------------------------------------------------------
# Public entry points
# --------------------------------------------------------------------------


def content_type_for(path: Path) -> str | None:
    """Return the ``content_type`` a path would load as, or ``None`` if its
    suffix is not supported. The suffix check is case-insensitive."""
    return _SUFFIX_TYPES.get(Path(path).suffix.lower())


def load_document(path: Path) -> LoadedDocument:
    """Read ``path`` and parse it into a :class:`LoadedDocument`.

    The format is chosen from the file suffix (:data:`SUPPORTED_SUFFIXES`).
    The file must be UTF-8 (a leading byte-order mark is allowed).

    Raises :class:`DocumentLoadError` when the suffix is unsupported, the
    path is missing, a directory or unreadable, the content contains NUL
    bytes (treated as binary), is not valid UTF-8, or cannot be parsed.
    """
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        # Before the type: a folder that is not there ("docs/") is not a file without an extension.
        raise DocumentLoadError(path, "not found (no such file or folder)")
    content_type = content_type_for(path)
    if content_type is None:
        suffix = path.suffix.lower()
        if suffix:
            raise DocumentLoadError(path, f"unsupported file type {suffix}")
        raise DocumentLoadError(path, "unsupported file type (no file extension)")

    raw = _read_bytes(path)
    text = _decode(path, raw)
    return _parse(path, str(path), text, content_type, hashlib.sha256(raw).hexdigest())


def load_text(text: str, content_type: str, source: str = "<text>") -> LoadedDocument:
    """Parse ``text`` that does not come from a file (an upload, a form field).

    ``content_type`` is one of :data:`CONTENT_TYPES`; ``source`` becomes the
    document's ``source`` (and names it in errors). ``checksum`` is the
    SHA-256 of the UTF-8 encoded text. Raises :class:`DocumentLoadError` for
    an unknown ``content_type``, text containing NUL characters (binary) or
    lone surrogates (not encodable as UTF-8), or unparsable text.
    """
    if content_type not in CONTENT_TYPES:
        raise DocumentLoadError(
            source, f"unsupported content type {content_type!r} (expected one of {', '.join(CONTENT_TYPES)})"
        )
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise DocumentLoadError(source, f"not valid Unicode text (lone surrogate at offset {exc.start})") from exc
    if "\x00" in text:
        raise DocumentLoadError(source, "binary content (contains NUL characters)")
    return _parse(Path(source), source, text.removeprefix("\ufeff"), content_type, hashlib.sha256(raw).hexdigest())


def _parse(path: Path, source: str, text: str, content_type: str, checksum: str) -> LoadedDocument:
    text = _normalize_newlines(text)
    if content_type == "markdown":
        title, sections = _parse_markdown(text)
    elif content_type == "rst":
        title, sections = _parse_rst(path, text)
    elif content_type == "html":
        try:
            title, sections = _parse_html(text)
        except RecursionError:  # the parser and the walker recurse per element: the document's fault
            raise DocumentLoadError(source, "could not parse HTML: elements nested too deeply") from None
    else:
        title, sections = _parse_text(text)

    return LoadedDocument(
        source=source,
        title=title or _first_line_title(text) or path.stem,
        sections=tuple(sections),
        checksum=checksum,
        content_type=content_type,
    )


def iter_document_paths(paths: Iterable[Path]) -> Iterator[Path]:
    """Expand files and folders into the document files to ingest.

    Folders are walked recursively in sorted (code point) order, so the
    result is deterministic. Inside folders, hidden entries (names starting
    with ``.``) are skipped together with everything below them, as are files
    whose suffix is not in :data:`SUPPORTED_SUFFIXES`; symlinked folders are
    not followed, which rules out cycles.

    Paths given explicitly that are not folders are yielded unchanged, even
    if hidden, missing or unsupported: the caller asked for them, so
    :func:`load_document` should report the problem rather than this
    function silently dropping them. Each file is yielded once, at its first
    occurrence. Yielded paths keep the form they were given in (relative
    inputs give relative outputs).

    Raises :class:`DocumentLoadError` if a folder cannot be listed.
    """
    seen: set[Path] = set()
    for given in paths:
        given = Path(given)
        if given.is_dir():
            candidates: Iterable[Path] = _walk_dir(given)
        else:
            candidates = (given,)
        for candidate in candidates:
            key = _dedupe_key(candidate)
            if key in seen:
                continue
            seen.add(key)
            yield candidate


def _walk_dir(directory: Path) -> Iterator[Path]:
    try:
        entries = sorted(directory.iterdir(), key=lambda p: p.name)
    except OSError as exc:
        raise DocumentLoadError(directory, f"cannot list folder: {_os_reason(exc)}") from exc
    for entry in entries:
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            if not entry.is_symlink():
                yield from _walk_dir(entry)
        elif entry.is_file() and entry.suffix.lower() in SUPPORTED_SUFFIXES:
            yield entry


def _dedupe_key(path: Path) -> Path:
    # resolve() so "docs/a.md" and "./docs/../docs/a.md" count as one file;
    # fall back to the absolute path if resolution fails (e.g. a symlink loop).
    try:
        return path.resolve()
    except (OSError, RuntimeError):
        return path.absolute()


# --------------------------------------------------------------------------
# Reading and decoding
# --------------------------------------------------------------------------


def _os_reason(exc: OSError) -> str:
    if isinstance(exc, FileNotFoundError):
        return "file not found"
    if isinstance(exc, IsADirectoryError):
        return "is a directory"
    if isinstance(exc, PermissionError):
        return "permission denied"
    return (exc.strerror or str(exc) or type(exc).__name__).lower()


def _read_bytes(path: Path) -> bytes:
    # Checked up front because on some platforms open() on a directory fails
    # with PermissionError, which would give a misleading reason.
    if path.is_dir():
        raise DocumentLoadError(path, "is a directory")
    try:
        return path.read_bytes()
    except OSError as exc:
        raise DocumentLoadError(path, _os_reason(exc)) from exc


# UTF-32 BOMs must be tested before UTF-16 ones: BOM_UTF32_LE starts with
# BOM_UTF16_LE.
_WIDE_BOMS = (
    (codecs.BOM_UTF32_LE, "UTF-32"),
    (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF16_LE, "UTF-16"),
    (codecs.BOM_UTF16_BE, "UTF-16"),
)


def _decode(path: Path, raw: bytes) -> str:
    for bom, name in _WIDE_BOMS:
        # Without this check a UTF-16 file would be reported as "binary file"
        # (it is full of NUL bytes), which would send the user looking for the
        # wrong problem.
        if raw.startswith(bom):
            raise DocumentLoadError(
                path, f"{name} encoded text is not supported; save the file as UTF-8"
            )
    if b"\x00" in raw:
        raise DocumentLoadError(path, "binary file")
    try:
        # utf-8-sig drops a leading BOM (common in files saved by Windows
        # editors). Strict errors: silently replacing bytes would index garbage.
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        bad = raw[exc.start : exc.start + 1]
        raise DocumentLoadError(
            path,
            f"not valid UTF-8 text (byte 0x{bad.hex()} at offset {exc.start})",
        ) from exc


# --------------------------------------------------------------------------
# Shared text helpers
# --------------------------------------------------------------------------

_BLANK_LINES_RE = re.compile(r"\n{3,}")
_SPACES_RE = re.compile(r"\s+")
# Stands in for an inline element that left no text ("<img ...>", "<input>"): the space the
# author put before it must not stay before the stop that follows ("£100 <img ...>." is "£100.").
_DROPPED = "\x01"
_DROPPED_BEFORE_STOP_RE = re.compile(r"\s*\x01+\s*(?=[.,;:!?)]|$)")
_DROPPED_AFTER_SPACE_RE = re.compile(r"(?<=\s)\x01+\s*")


def _without_dropped(text: str) -> str:
    """``text`` with the stand-ins for dropped elements taken out, and the spaces around them
    as the sentence reads without them."""
    if _DROPPED not in text:
        return text
    text = _DROPPED_AFTER_SPACE_RE.sub("", _DROPPED_BEFORE_STOP_RE.sub("", text))
    return text.replace(_DROPPED, "")


def _normalize_newlines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _clean_body(text: str) -> str:
    """Strip trailing spaces per line and squeeze runs of blank lines, so that
    a blank line reliably means "paragraph break" to the chunker."""
    text = text.replace("\f", "\n").replace("\v", "\n")
    lines = [line.rstrip() for line in text.split("\n")]
    return _BLANK_LINES_RE.sub("\n\n", "\n".join(lines)).strip("\n")


def _collapse(text: str) -> str:
    return _SPACES_RE.sub(" ", text).strip()


def _truncate_title(text: str) -> str:
    text = _collapse(text)
    if len(text) <= TITLE_MAX_CHARS:
        return text
    cut = text[:TITLE_MAX_CHARS]
    # Prefer ending on a word boundary unless that would lose most of it.
    space = cut.rfind(" ")
    if space >= TITLE_MAX_CHARS // 2:
        cut = cut[:space]
    return cut.rstrip()


def _first_line_title(text: str) -> str:
    for line in text.split("\n"):
        if line.strip():
            return _truncate_title(line)
    return ""


class _SectionBuilder:
    """Accumulates text blocks between headings into :class:`Section` objects.

    Used by the flat, token-stream style parsers (Markdown and HTML), where a
    heading of level N closes every open heading of level >= N.
    """

    def __init__(self) -> None:
        self.sections: list[Section] = []
        self.headings: list[tuple[int, str]] = []  # (level, text), all seen
        self._stack: list[tuple[int, str]] = []
        self._blocks: list[str] = []
        self._last_tight = False

    def heading(self, level: int, text: str) -> None:
        self._flush()
        text = _collapse(text)
        while self._stack and self._stack[-1][0] >= level:
            self._stack.pop()
        # An empty heading ("#" alone) still closes deeper sections, but is
        # not pushed: a blank path element would read as " >  > " later.
        if text:
            self._stack.append((level, text))
            self.headings.append((level, text))

    def add_block(self, text: str, *, tight: bool = False) -> None:
        """Add a block of body text. Consecutive ``tight`` blocks (list items,
        table rows) are joined by a newline instead of a blank line so a list
        stays one paragraph for the chunker."""
        text = text.strip("\n")
        if not text.strip():
            return
        if self._blocks and tight and self._last_tight:
            self._blocks[-1] += "\n" + text
        else:
            self._blocks.append(text)
        self._last_tight = tight

    def _flush(self) -> None:
        body = _clean_body("\n\n".join(self._blocks))
        if body:
            path = tuple(text for _, text in self._stack)
            self.sections.append(Section(heading_path=path, text=body))
        self._blocks = []
        self._last_tight = False

    def finish(self) -> list[Section]:
        self._flush()
        return self.sections

    def title(self) -> str:
        """First level-1 heading, else the first heading of any level."""
        for level, text in self.headings:
            if level == 1:
                return text
        return self.headings[0][1] if self.headings else ""


# --------------------------------------------------------------------------
# Markdown
# --------------------------------------------------------------------------

# YAML front matter: a "---" first line, then anything up to a closing
# "---" or "..." line. Only recognised at the very start of the file.
_FRONT_MATTER_RE = re.compile(r"\A---[ \t]*\n.*?\n(?:---|\.\.\.)[ \t]*(?:\n|\Z)", re.DOTALL)


def _markdown_parser():
    from markdown_it import MarkdownIt  # noqa: PLC0415 - a parser is imported when a file of its type is first read

    # CommonMark plus GFM tables/strikethrough, which are common in docs.
    # "gfm-like" is avoided because it needs the optional linkify-it-py.
    return MarkdownIt("commonmark").enable(["table", "strikethrough"])


def _md_inline_text(token) -> str:
    """Plain text of an ``inline`` token: markup dropped, link and image-alt
    text kept, soft line breaks joined with a space."""
    parts: list[str] = []
    dropped = None  # "<script>alert(1)</script>" inline: the element whose text is left out
    for child in token.children or ():
        kind = child.type
        if dropped is not None:
            if kind == "html_inline" and _closes(child.content, dropped):
                dropped = None
            continue
        if kind == "html_inline" and (opened := _dropped_opening(child.content)):
            dropped = opened
            parts.append(_DROPPED)
        elif kind in ("text", "code_inline", "text_special"):
            parts.append(child.content)
        elif kind == "softbreak":
            parts.append(" ")
        elif kind == "hardbreak":
            parts.append("\n")
        elif kind == "image":
            # The alt text is parsed inline markup of its own; an image without one leaves no text.
            parts.append((_md_inline_text(child) if child.children else child.content) or _DROPPED)
        elif kind == "html_inline":
            is_break = re.match(r"<br\s*/?>", child.content, re.IGNORECASE)
            parts.append("\n" if is_break else _DROPPED)
        # Everything else (em/strong/link/s open/close) is pure markup.
    return _without_dropped("".join(parts))


class _MarkdownWalker:
    """Turns markdown-it's token stream into sections: headings, list items (with their
    markers), tables (one row per line), code and HTML blocks."""

    def __init__(self) -> None:
        self.builder = _SectionBuilder()
        self.lists: list[str] = []  # open lists: "ul" or "ol"
        self.item_prefix: str | None = None  # marker for the next block in a list item
        self.table_rows: list[str] | None = None
        self.row_cells: list[str] | None = None

    def walk(self, tokens) -> None:
        i = 0
        while i < len(tokens):
            tok = tokens[i]
            if tok.type == "heading_open":
                self.builder.heading(int(tok.tag[1]), _md_inline_text(tokens[i + 1]))
                i += 3  # heading_open, inline, heading_close
                continue
            handler = getattr(self, "on_" + tok.type, None)
            if handler is not None:
                handler(tok)
            i += 1

    def add(self, text: str) -> None:
        _md_add(self.builder, text, self.lists, self.item_prefix)
        self.item_prefix = None

    def on_bullet_list_open(self, tok) -> None:
        self.lists.append(tok.tag)

    on_ordered_list_open = on_bullet_list_open

    def on_bullet_list_close(self, tok) -> None:
        self.lists.pop()

    on_ordered_list_close = on_bullet_list_close

    def on_list_item_open(self, tok) -> None:
        indent = "  " * (len(self.lists) - 1)
        marker = f"{tok.info}{tok.markup}" if self.lists and self.lists[-1] == "ol" else "-"
        self.item_prefix = f"{indent}{marker} "

    def on_table_open(self, tok) -> None:
        self.table_rows = []

    def on_tr_open(self, tok) -> None:
        self.row_cells = []

    def on_tr_close(self, tok) -> None:
        if self.table_rows is not None and self.row_cells is not None:
            self.table_rows.append(" | ".join(self.row_cells))
            self.row_cells = None

    def on_table_close(self, tok) -> None:
        if self.table_rows is not None:
            self.builder.add_block("\n".join(self.table_rows))
            self.table_rows = None

    def on_inline(self, tok) -> None:
        content = _md_inline_text(tok)
        if self.row_cells is not None:
            self.row_cells.append(_collapse(content))
        else:
            self.add(content)

    def on_fence(self, tok) -> None:
        self.add(tok.content.rstrip("\n"))  # code is kept verbatim: identifiers in it are worth retrieving

    on_code_block = on_fence

    def on_html_block(self, tok) -> None:
        self.add(_html_fragment_text(tok.content))


def _parse_markdown(text: str) -> tuple[str, list[Section]]:
    text = _FRONT_MATTER_RE.sub("", text, count=1)
    walker = _MarkdownWalker()
    walker.walk(_markdown_parser().parse(text))
    return walker.builder.title(), walker.builder.finish()


def _md_add(builder: _SectionBuilder, text: str, lists: list[str], prefix: str | None) -> None:
    if not text.strip():
        return
    if lists:
        # Continuation paragraphs of an item are indented under its marker.
        indent = prefix if prefix is not None else "  " * len(lists)
        builder.add_block(indent + text, tight=True)
    else:
        builder.add_block(text)


def _html_fragment_text(fragment: str) -> str:
    from bs4 import BeautifulSoup  # noqa: PLC0415 - a parser is imported when a file of its type is first read

    soup = BeautifulSoup(fragment, "html.parser")
    for element in soup.find_all(_HTML_DROP):  # a script's code is not the page's text
        element.replace_with(_DROPPED)
    # get_text() leaves out comments, so "<!-- toc -->" markers vanish. Its pieces are joined
    # by a stand-in, not a space: "<p>It costs <b>£400</b>.</p>" is "It costs £400." (a space
    # there was quoted as "£400  [1]."); the stand-ins left between words are spaces.
    text = _DROPPED_AFTER_SPACE_RE.sub("", _DROPPED_BEFORE_STOP_RE.sub("", soup.get_text(_DROPPED)))
    return _collapse(text.replace(_DROPPED, " "))


_OPENING_TAG_RE = re.compile(r"<([a-z]+)\b[^>]*(?<!/)>\Z", re.IGNORECASE)


def _dropped_opening(tag: str) -> str | None:
    """The name of an element whose text is left out (``_HTML_DROP``) that ``tag`` opens."""
    match = _OPENING_TAG_RE.match(tag.strip())
    name = match.group(1).lower() if match else None
    return name if name in _HTML_DROP else None


def _closes(tag: str, name: str) -> bool:
    return re.fullmatch(rf"</{name}\s*>", tag.strip(), re.IGNORECASE) is not None


# --------------------------------------------------------------------------
# reStructuredText
# --------------------------------------------------------------------------

_RST_SETTINGS = {
    # Never print or stop on markup problems: a sloppy file should still be
    # indexed, and warnings on stderr would clutter management commands.
    "report_level": 5,
    "halt_level": 5,
    # Documents are untrusted input: no reading other files, no raw HTML.
    "file_insertion_enabled": False,
    "raw_enabled": False,
    # Keep the top heading as a section so heading paths include it, as they
    # do for Markdown and HTML.
    "doctitle_xform": False,
    "sectsubtitle_xform": False,
    "syntax_highlight": "none",
    # Ignore docutils.conf files on the machine: output must not depend on
    # where ingestion runs.
    "_disable_config": True,
}

# Node classes whose text is not document content. Filled lazily so that
# importing this module does not import docutils.
_RST_SKIP: tuple[type, ...] = ()


def _parse_rst(path: Path, text: str) -> tuple[str, list[Section]]:
    global _RST_SKIP
    from docutils import nodes  # noqa: PLC0415 - a parser is imported when a file of its type is first read
    from docutils.core import publish_doctree  # noqa: PLC0415 - a parser is imported when a file of its type is first read

    if not _RST_SKIP:
        _RST_SKIP = (
            nodes.system_message,
            nodes.comment,
            nodes.substitution_definition,
            nodes.target,
            nodes.raw,
        )
    # A fresh sink per call: messages are discarded, never printed.
    settings = dict(_RST_SETTINGS, warning_stream=io.StringIO())
    try:
        doctree = publish_doctree(text, source_path=str(path), settings_overrides=settings)
    except Exception as exc:  # docutils raises assorted errors on odd input
        raise DocumentLoadError(path, f"could not parse reStructuredText: {exc}") from exc

    # Error messages end up nested anywhere (e.g. inside list items); remove
    # them so node.astext() below returns only document text.
    for node in list(doctree.findall(nodes.system_message)):
        node.parent.remove(node)

    sections: list[Section] = []
    titles: list[str] = []

    def walk(node, path: tuple[str, ...]) -> None:
        blocks: list[str] = []
        subsections = []
        for child in node.children:
            if isinstance(child, nodes.section):
                subsections.append(child)
            elif isinstance(child, nodes.title) or isinstance(child, _RST_SKIP):
                continue
            elif isinstance(child, nodes.topic) and "contents" in child["classes"]:
                # A generated table of contents only repeats the headings.
                continue
            else:
                blocks.append(child.astext())
        body = _clean_body("\n\n".join(b for b in blocks if b.strip()))
        if body:
            sections.append(Section(heading_path=path, text=body))
        for sub in subsections:
            title_node = sub.next_node(nodes.title)
            title = _collapse(title_node.astext()) if title_node is not None else ""
            if title:
                titles.append(title)
            walk(sub, path + (title,) if title else path)

    walk(doctree, ())
    return (titles[0] if titles else ""), sections


# --------------------------------------------------------------------------
# HTML
# --------------------------------------------------------------------------

_HTML_DROP = ("script", "style", "nav", "footer", "noscript", "template", "head")
_HTML_HEADINGS = {f"h{n}": n for n in range(1, 7)}
# Stands in for <br> in the inline text buffer. NUL cannot occur in the
# decoded text because files containing NUL bytes are rejected as binary.
_BR = "\x00"
_HTML_BLOCKS = frozenset(
    """address article aside blockquote body caption dd details dialog div dl dt
    fieldset figcaption figure form header hgroup hr html legend main p section
    summary table tbody tfoot thead""".split()
)


class _HtmlWalker:
    """Flattens an HTML tree into headings and text blocks in document order."""

    def __init__(self, builder: _SectionBuilder) -> None:
        self.builder = builder
        self.buffer: list[str] = []
        self.list_depth = 0
        self.item_prefix: str | None = None

    def walk(self, element) -> None:
        from bs4 import CData, NavigableString  # noqa: PLC0415 - a parser is imported when a file of its type is first read

        for child in element.children:
            if isinstance(child, NavigableString):
                # Comments, doctypes and processing instructions are
                # NavigableString subclasses too; only real text is kept.
                if type(child) in (NavigableString, CData):
                    self.buffer.append(str(child))
                continue
            name = child.name
            if child.has_attr("hidden"):
                continue
            if name in _HTML_HEADINGS:
                self.flush()
                self.builder.heading(_HTML_HEADINGS[name], child.get_text(" "))
            elif name == "br":
                self.buffer.append(_BR)
            elif name == "pre":
                self.flush()
                self._add(child.get_text().strip("\n"))
            elif name == "tr":
                self.flush()
                cells = [
                    _collapse(cell.get_text(" "))
                    for cell in child.find_all(["td", "th"], recursive=False)
                ]
                self.builder.add_block(" | ".join(cells), tight=True)
            elif name in ("ul", "ol"):
                self.flush()
                self.list_depth += 1
                self.walk(child)
                self.list_depth -= 1
                self.flush()
            elif name == "li":
                self.flush()
                self.item_prefix = "  " * max(self.list_depth - 1, 0) + "- "
                self.walk(child)
                self.flush()
                self.item_prefix = None
            elif name in _HTML_BLOCKS:
                self.flush()
                self.walk(child)
                self.flush()
            else:  # inline element: its text joins the current paragraph
                self.buffer.append(_DROPPED)
                self.walk(child)
                self.buffer.append(_DROPPED)

    def flush(self) -> None:
        raw = _without_dropped("".join(self.buffer))
        self.buffer = []
        # Newlines in the source are just whitespace; only <br> breaks lines.
        lines = [_collapse(line) for line in raw.split(_BR)]
        self._add("\n".join(line for line in lines if line))

    def _add(self, text: str) -> None:
        if not text.strip():
            return
        if self.list_depth:
            prefix = self.item_prefix
            if prefix is None:
                prefix = "  " * self.list_depth
            self.item_prefix = None  # only the item's first block gets the dash
            self.builder.add_block(prefix + text, tight=True)
        else:
            self.builder.add_block(text)


def _parse_html(text: str) -> tuple[str, list[Section]]:
    from bs4 import BeautifulSoup  # noqa: PLC0415 - a parser is imported when a file of its type is first read

    soup = BeautifulSoup(text, "html.parser")
    title = ""
    if soup.title is not None:
        title = _collapse(soup.title.get_text(" "))
    for tag in soup.find_all(_HTML_DROP):
        # An empty inline element in its place: a script between "£400 " and "." leaves no space
        # before the stop (_without_dropped), and no text in a heading's or a cell's get_text().
        tag.replace_with(soup.new_tag("span"))

    builder = _SectionBuilder()
    walker = _HtmlWalker(builder)
    walker.walk(soup.body if soup.body is not None else soup)
    walker.flush()
    sections = builder.finish()
    return title or builder.title(), sections


# --------------------------------------------------------------------------
# Plain text
# --------------------------------------------------------------------------


def _parse_text(text: str) -> tuple[str, list[Section]]:
    # One section; the chunker splits it at blank-line paragraph breaks.
    body = _clean_body(text)
    sections = [Section(heading_path=(), text=body)] if body else []
    return _first_line_title(body), sections
