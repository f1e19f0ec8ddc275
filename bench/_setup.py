"""Django for the benchmarks: settings, a throw-away database, and small timing helpers.

Each benchmark script calls ``bench_database()`` in its ``main()``::

    with bench_database() as description:
        results = run(...)

It configures Django with ``settings.configure`` (only the apps django-ragchat needs, no entry
point plugins, so the numbers are those of the embedded defaults), then creates a fresh
database with Django's own test-database machinery and destroys it afterwards:

* by default a SQLite *file* in a temporary directory (a file, not ``:memory:``, because that is
  what a site runs on);
* with ``DATABASE_URL`` set (e.g. ``postgres://postgres@127.0.0.1:5432/ragchat``), a
  ``test_<name>`` database on that server, so the benchmark never touches the named database.

When Django is already configured (the smoke test under pytest-django), the scripts' ``run``
functions are called directly and this module's ``bench_database`` is not used.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

# The repository root, so ``import django_ragchat`` works from a checkout without installing.
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _database_settings(tmpdir: str) -> dict:
    import dj_database_url

    url = os.environ.get("DATABASE_URL")
    if url:
        config = dj_database_url.parse(url, conn_max_age=0)
        config["TEST"] = {"NAME": f"test_{config['NAME']}_bench"}
        return config
    path = os.path.join(tmpdir, "bench.sqlite3")
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": path,
        # create_test_db uses TEST.NAME: a file, so the benchmark measures a real SQLite file.
        "TEST": {"NAME": path},
        "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE"},
    }


def configure(tmpdir: str) -> None:
    """``settings.configure`` for the benchmarks (does nothing if Django is configured)."""
    import django
    from django.conf import settings

    if settings.configured:
        return
    settings.configure(
        SECRET_KEY="bench",
        DEBUG=False,
        INSTALLED_APPS=[
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "django_ragchat",
        ],
        DATABASES={"default": _database_settings(tmpdir)},
        USE_TZ=True,
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        # The embedded defaults only: installed third-party plugins must not change the numbers.
        RAGCHAT={"LOAD_ENTRY_POINTS": False},
        LOGGING_CONFIG=None,
    )
    django.setup()


@contextlib.contextmanager
def bench_database() -> Iterator[str]:
    """Configure Django, create an empty migrated database, yield a one-line description of
    it, and destroy it on the way out."""
    with tempfile.TemporaryDirectory(prefix="ragchat-bench-") as tmpdir:
        configure(tmpdir)
        from django.db import connection

        connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
        try:
            yield describe_database()
        finally:
            connection.creation.destroy_test_db(connection.settings_dict["NAME"], verbosity=0)


def describe_database() -> str:
    """E.g. "sqlite 3.40.1 (file)" or "postgresql 15.6"."""
    from django.db import connection

    if connection.vendor == "sqlite":
        import sqlite3

        return f"sqlite {sqlite3.sqlite_version} (file)"
    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        return f"{connection.vendor} {cursor.fetchone()[0]}"


def machine() -> str:
    """CPU count and Python version, for the header of every table."""
    import platform

    return f"{os.cpu_count()} cores, Python {platform.python_version()}, {platform.machine()}"


# --- Statistics and tables --------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation; ``nan`` for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def table(headers: list[str], rows: list[list]) -> str:
    """A plain-text table; floats to 2 decimals."""

    def cell(value) -> str:
        if isinstance(value, float):
            return f"{value:.2f}"
        return str(value)

    cells = [[cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    # Text columns (judged by the first row) are left-aligned, numbers right-aligned.
    left = [i == 0 or (bool(rows) and isinstance(rows[0][i], str) and not rows[0][i][:1].isdigit())
            for i in range(len(headers))]

    def line(values):
        return "  ".join(v.ljust(w) if is_left else v.rjust(w) for v, w, is_left in zip(values, widths, left)).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in cells)])


# --- A synthetic corpus -----------------------------------------------------------------------

_PRODUCT_WORDS = (
    "Aurora Borealis Cobalt Delta Ember Falcon Glacier Harbor Indigo Juniper Kestrel Lumen "
    "Meridian Nimbus Orion Pioneer Quasar Raven Sierra Tundra Umbra Vertex Willow Zephyr"
).split()
_TOPICS = {
    "Pricing": "price cost plan subscription discount invoice monthly annual refund tier billing",
    "Battery": "battery charge hours charger capacity power drain standby fast wireless cycle",
    "Display": "display screen brightness resolution panel refresh colour contrast pixel glass",
    "Camera": "camera lens sensor photo video zoom aperture night portrait stabilisation",
    "Warranty": "warranty repair replacement defect claim coverage period service centre return",
    "Setup": "setup install account pairing configure wizard network update firmware reset",
    "Storage": "storage memory gigabyte card capacity backup cloud sync files expandable",
    "Connectivity": "bluetooth wifi cellular antenna signal roaming hotspot band network modem",
    "Security": "security password fingerprint encryption lock unlock biometric privacy patch",
    "Accessories": "case strap cable adapter dock stand headphones stylus keyboard mount",
}
_FILLER = (
    "the device supports each model includes users can expect our team recommends when you "
    "after the first with a standard in most regions for business customers every unit "
    "according to the manual during normal use by default as described below"
).split()


def product_names(count: int) -> list[str]:
    """Deterministic product names like "Aurora X2" (word + letter + digit)."""
    names = []
    for i in range(count):
        word = _PRODUCT_WORDS[i % len(_PRODUCT_WORDS)]
        code = f"{chr(ord('A') + (i // len(_PRODUCT_WORDS)) % 26)}{i % 9 + 1}"
        names.append(f"{word} {code}")
    return names


def _sentence(rng, product: str, topic_words: list[str]) -> str:
    parts = []
    for _ in range(rng.randint(9, 18)):
        roll = rng.random()
        if roll < 0.45:
            parts.append(rng.choice(topic_words))
        elif roll < 0.55:
            parts.append(product)
        else:
            parts.append(rng.choice(_FILLER))
    if rng.random() < 0.3:
        parts.append(f"{rng.randint(2, 999)} {rng.choice(['EUR', 'hours', 'GB', 'mAh', 'days'])}")
    text = " ".join(parts)
    return text[0].upper() + text[1:] + "."


def synthetic_chunks(count: int, *, seed: int = 7, per_document: int = 10):
    """``count`` Markdown-like chunks, deterministic for a seed.

    Yields (document index, product name, heading, text): one document per product, one
    section per topic ("## Aurora X2 — Pricing" followed by sentences and sometimes a list),
    ``per_document`` chunks a document, about 60-120 words a chunk.
    """
    import random

    rng = random.Random(seed)
    topics = list(_TOPICS)
    products = product_names(max(1, -(-count // per_document)))
    for n in range(count):
        doc, ordinal = divmod(n, per_document)
        product = products[doc]
        topic = topics[(ordinal + doc) % len(topics)]
        words_ = _TOPICS[topic].split()
        heading = f"{product} — {topic}"
        body = [f"## {heading}", "", " ".join(_sentence(rng, product, words_) for _ in range(rng.randint(3, 5)))]
        if rng.random() < 0.4:
            body += [""] + [f"- {_sentence(rng, product, words_)}" for _ in range(rng.randint(2, 3))]
        yield doc, product, heading, "\n".join(body)


def store_chunks(count: int, *, seed: int = 7, per_document: int = 10, batch: int = 2000) -> int:
    """Store ``synthetic_chunks(count)`` as ``Document``/``Chunk`` rows embedded by the default
    profile's embedder (``bulk_create``, embedded in batches). Returns the number stored."""
    from django_ragchat.models import Chunk, Document
    from django_ragchat.profiles import get_profile
    from django_ragchat.tokens import count_tokens
    from django_ragchat.turn.context import components_for

    embedder = components_for(get_profile()).embedder
    rows = list(synthetic_chunks(count, seed=seed, per_document=per_document))
    titles = {doc: f"{product} guide" for doc, product, _, _ in rows}
    documents = Document.objects.bulk_create([
        Document(source=f"bench/seed{seed}/product-{doc}.md", title=title, checksum=f"{seed}-{doc}",
                 content_type="text/markdown")
        for doc, title in titles.items()
    ])
    doc_ids = {doc: d.pk for doc, d in zip(titles, documents)}
    for start in range(0, len(rows), batch):
        part = rows[start:start + batch]
        vectors = embedder.embed([text for _, _, _, text in part])
        Chunk.objects.bulk_create([
            Chunk(document_id=doc_ids[doc], ordinal=(start + i) % per_document, text=text, heading=heading,
                  space=embedder.space, embedding=vector, token_count=count_tokens(text))
            for i, ((doc, _, heading, text), vector) in enumerate(zip(part, vectors))
        ])
    return len(rows)
