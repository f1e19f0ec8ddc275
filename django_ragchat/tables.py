"""Tables in a chunk's text, as the markdown loader stores them (``a | b`` per line) or as
markdown writes them (``| a | b |`` under a ``| --- |`` rule): their cells, and the words a
static embedding model should read of them.

The answerer writes a table's rows out as sentences (``answerer.passages.table_rows``); the
static embedder reads a table as its column names and its rows' words (``table_words``)."""

from __future__ import annotations

import re

from django_ragchat.text import STOPWORDS

#: A markdown table's rule line (``| --- | :---: |``): no cells, only the table's shape.
TABLE_RULE_RE = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")
# A token that says which row, not what the table is about: a number, a price, a code ("D", "A1").
_ROW_KEY_RE = re.compile(r"\S*\d\S*|\S")


def table_cells(line: str) -> list[str]:
    """The cells of a table row: "| a | b |" as written, or "a | b" as the markdown loader
    stores a row; [] for a line that is no row."""
    line = line.strip()
    if line.startswith("|") and line.endswith("|") and len(line) > 1:
        line = line[1:-1]
    elif " | " not in line:
        return []
    return [" ".join(c.split()) for c in line.split("|")]


def table_words(text: str) -> str:
    """``text`` with each table read as its column names and its rows' words, without the
    numbers, prices and one-letter codes that tell its rows apart.

    A static model averages every token's vector: a table of prices ("D | £68,001 to £88,000 |
    £2,103") would read as numbers and lose its heading's and columns' meaning to every prose
    section beside it ("How much is band D?" found the page's other sections first). The
    numbers stay in the stored text, for the answerer to quote. Text without a table is
    returned as is."""
    if "|" not in text:
        return text
    lines = [line for line in text.split("\n") if not TABLE_RULE_RE.match(line)]
    rows = [table_cells(line) for line in lines]
    out: list[str] = []
    for at, (line, cells) in enumerate(zip(lines, rows, strict=True)):
        width = len(cells)
        above = len(rows[at - 1]) if at else 0
        below = len(rows[at + 1]) if at + 1 < len(rows) else 0
        if width < 2 or width not in (above, below):  # a table is two rows or more of one width
            out.append(line)
        elif above != width:  # the first row of a table (or of a piece a chunk boundary cut) names its columns
            out.append(", ".join(cells) + ".")
        else:
            kept = [w for w in " ".join(cells).split() if not _ROW_KEY_RE.fullmatch(w)]
            if any(w.lower() not in STOPWORDS for w in kept):  # "up to", "over" say nothing alone
                out.append(" ".join(kept) + ".")
    return "\n".join(out)
