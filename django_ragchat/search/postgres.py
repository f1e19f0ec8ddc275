"""PostgreSQL with pgvector: HNSW indexes per embedding space, the vector, full-text and hybrid
queries, and COPY for bulk storage.

Indexes. ``Chunk.embedding`` is an untyped ``vector`` column, so one table holds every
embedding space (model + dimension). Each space gets its own partial expression index::

    CREATE INDEX ragchat_hnsw_<space>_<hash> ON django_ragchat_chunk
        USING hnsw ((embedding::vector(384)) vector_cosine_ops) WHERE space = '<space>'

Spaces of 2,001 to 4,000 dimensions are indexed as ``halfvec`` (pgvector's HNSW limit for
``vector`` is 2,000); larger ones cannot be indexed and are searched exactly. A load builds
the index of a space that has none once, at its end (``build_missing_hnsw_indexes``: the
commands, the admin's resync); a small write (live sync, an upload) after its commit while the
space is small (``index_when_committed``); ``ragchat_index`` whatever is left.

Queries. The planner uses a partial expression index only for a query that repeats its
expression and implies its predicate, so the vector query is written with the same cast and
``space = '<literal>'`` (a literal, not a parameter: a generic plan could not prove the
predicate). ``hnsw.ef_search`` is set with ``SET LOCAL`` for the query alone: with Django's
default client-side binding the SET and the SELECT go in one round trip, as one implicit
transaction; otherwise they run in a transaction of their own. Metadata filters and access make pgvector
0.8's iterative index scan continue until enough rows pass them.

Access. Every query keeps only the chunks whose ``access`` shares a token with the reader's
principals (``access ?| ARRAY[...]``, served by the GIN index of migration 0005 when the planner
finds few rows readable; bench/README.md measures recall and latency at 1 %, 10 % and 50 %).

Full text. Migration 0003 adds ``search_vector``, a stored generated ``tsvector`` of the chunk's
text in the ``english`` configuration (``COLUMN_CONFIG``), with a GIN index. A profile may name
another configuration: the query then uses ``to_tsvector('<config>', text)``, indexed by an
expression GIN index that ``ragchat_index`` creates for every configuration a profile uses.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass

from django.db import connections, router, transaction

from django_ragchat.access import UNRESTRICTED, Principals, access_sql, public_access
from django_ragchat.fields import vector_binary, vector_literal
from django_ragchat.models import Chunk, Document
from django_ragchat.search import readings
from django_ragchat.search.filters import SearchFilters

#: The text search configuration of the stored ``search_vector`` column.
COLUMN_CONFIG = "english"
#: pgvector's HNSW limits: ``vector`` up to 2,000 dimensions, ``halfvec`` up to 4,000.
VECTOR_HNSW_MAX_DIMENSIONS = 2000
HALFVEC_HNSW_MAX_DIMENSIONS = 4000
#: pgvector's own default for ``hnsw.ef_search``; the index returns at most this many rows.
DEFAULT_EF_SEARCH = 40
MAX_EF_SEARCH = 1000
#: The oldest pgvector this module works with (halfvec, iterative index scans).
MIN_PGVECTOR_VERSION = (0, 8, 0)

logger = logging.getLogger(__name__)

_CONFIG_NAME = re.compile(r"^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)?$")


def _tables(connection) -> tuple[str, str]:
    qn = connection.ops.quote_name
    return qn(Chunk._meta.db_table), qn(Document._meta.db_table)


def _literal(value: str) -> str:
    """``value`` as an SQL string literal (for DDL and index predicates, which take no parameters)."""
    if "\x00" in value:
        raise ValueError("NUL characters cannot be stored in PostgreSQL")
    return "'" + value.replace("'", "''") + "'"  # standard_conforming_strings is on since 9.1


def check_config(config: str) -> str:
    """Validate a text search configuration name (it is written into SQL as a literal)."""
    if not isinstance(config, str) or not _CONFIG_NAME.match(config):
        raise ValueError(f"{config!r} is not a text search configuration name (e.g. 'english', 'simple').")
    return config


def vector_type(dimensions: int) -> str | None:
    """The type a space of ``dimensions`` is indexed as: ``vector``, ``halfvec``, or ``None``
    when pgvector cannot index that many dimensions with HNSW."""
    if dimensions <= VECTOR_HNSW_MAX_DIMENSIONS:
        return "vector"
    if dimensions <= HALFVEC_HNSW_MAX_DIMENSIONS:
        return "halfvec"
    return None


def hnsw_index_name(space: str) -> str:
    """The HNSW index of ``space``: readable, unique (a hash of the space) and under 63 bytes."""
    slug = re.sub(r"[^a-z0-9]+", "_", space.lower()).strip("_")[:32]
    return f"ragchat_hnsw_{slug}_{hashlib.sha1(space.encode()).hexdigest()[:8]}"


def fulltext_index_name(config: str) -> str:
    return f"ragchat_fts_{check_config(config).replace('.', '_')}"


def tsvector_sql(config: str, alias: str = "c") -> str:
    """The chunk's ``tsvector`` in ``config``: the stored column, or the indexed expression."""
    if check_config(config) == COLUMN_CONFIG:
        return f"{alias}.search_vector"
    return f"to_tsvector('{config}'::regconfig, {alias}.text)"


# --- Introspection and index management -----------------------------------------------------


def pgvector_versions(using: str = "default") -> tuple[str | None, str | None]:
    """(version the server can install, version installed in this database); ``None`` when absent."""
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT default_version, installed_version FROM pg_available_extensions WHERE name = 'vector'")
        row = cursor.fetchone()
    return (row[0], row[1]) if row else (None, None)


def parse_version(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def spaces(using: str = "default") -> dict[str, int]:
    """Every embedding space that has chunks, with its number of chunks."""
    connection = connections[using]
    chunk, _ = _tables(connection)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT space, count(*) FROM {chunk} GROUP BY space ORDER BY space")
        return dict(cursor.fetchall())


def space_dimensions(space: str, using: str = "default") -> int | None:
    """The dimension of the vectors stored in ``space`` (``None`` when it has none)."""
    connection = connections[using]
    chunk, _ = _tables(connection)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT vector_dims(embedding) FROM {chunk} WHERE space = %s AND embedding IS NOT NULL "
                       f"LIMIT 1", [space])
        row = cursor.fetchone()
    return row[0] if row else None


@dataclass(frozen=True)
class IndexStatus:
    """The state of one index: ``ok``, ``missing``, ``invalid`` (a failed concurrent build),
    ``mismatch`` (built for another dimension) or ``unindexable`` (too many dimensions)."""

    name: str
    state: str
    definition: str = ""
    space: str = ""
    dimensions: int | None = None
    config: str = ""

    @property
    def ok(self) -> bool:
        return self.state == "ok"


def _index_row(connection, name: str) -> tuple[bool, str] | None:
    chunk, _ = _tables(connection)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT ix.indisvalid, pg_get_indexdef(ix.indexrelid) FROM pg_index ix "
            "JOIN pg_class i ON i.oid = ix.indexrelid WHERE ix.indrelid = %s::regclass AND i.relname = %s",
            [chunk, name],
        )
        return cursor.fetchone()


def hnsw_index_status(space: str, dimensions: int | None = None, using: str = "default") -> IndexStatus:
    """Whether ``space`` has a valid HNSW index for its dimension (read from the data when
    ``dimensions`` is not given)."""
    connection = connections[using]
    name = hnsw_index_name(space)
    if dimensions is None:
        dimensions = space_dimensions(space, using)
    kind = vector_type(dimensions) if dimensions else None
    if dimensions and kind is None:
        return IndexStatus(name, "unindexable", space=space, dimensions=dimensions)
    row = _index_row(connection, name)
    if row is None:
        return IndexStatus(name, "missing", space=space, dimensions=dimensions)
    valid, definition = row
    if not valid:
        state = "invalid"
    elif dimensions and f"::{kind}({dimensions})) {kind}_cosine_ops" not in definition:
        state = "mismatch"
    else:
        state = "ok"
    return IndexStatus(name, state, definition, space=space, dimensions=dimensions)


def hnsw_index_sql(space: str, dimensions: int, *, m: int = 16, ef_construction: int = 64,
                   concurrently: bool = False, using: str = "default") -> str:
    """The ``CREATE INDEX`` statement of ``space``'s HNSW index."""
    connection = connections[using]
    chunk, _ = _tables(connection)
    kind = vector_type(dimensions)
    if kind is None:
        raise ValueError(f"Space {space!r} has {dimensions} dimensions; pgvector's HNSW indexes at most "
                         f"{HALFVEC_HNSW_MAX_DIMENSIONS} (as halfvec). Its queries are exact scans.")
    if not (2 <= m <= 100 and 4 <= ef_construction <= 1000 and ef_construction >= 2 * m):
        raise ValueError("HNSW needs 2 <= m <= 100 and 2*m <= ef_construction <= 1000.")
    return (
        f"CREATE INDEX {'CONCURRENTLY ' if concurrently else ''}IF NOT EXISTS "
        f"{connection.ops.quote_name(hnsw_index_name(space))} "
        f"ON {chunk} USING hnsw ((embedding::{kind}({dimensions})) {kind}_cosine_ops) "
        f"WITH (m = {int(m)}, ef_construction = {int(ef_construction)}) "
        f"WHERE space = {_literal(space)}"
    )


def _build_memory(rows: int, dimensions: int) -> int:
    """Bytes of maintenance_work_mem an HNSW build of ``rows`` vectors needs to keep its graph
    in memory (pgvector slows down sharply, with a NOTICE, when it does not fit)."""
    return int(rows * (dimensions * 4 + 400) * 1.3) + (64 << 20)


def create_hnsw_index(space: str, *, m: int = 16, ef_construction: int = 64, concurrently: bool = False,
                      rebuild: bool = False, maintenance_work_mem: str | None = None,
                      using: str = "default") -> tuple[IndexStatus, bool]:
    """Create ``space``'s HNSW index unless a valid one exists; return (status, created).

    An invalid or mismatched index (or any, with ``rebuild``) is dropped and built again.
    ``maintenance_work_mem`` (e.g. ``"1GB"``) defaults to what the build needs for the space's
    size, up to 2 GB, and never less than the server's setting. ``concurrently`` builds
    without blocking writes (not inside a transaction).
    """
    connection = connections[using]
    dimensions = space_dimensions(space, using)
    if dimensions is None:
        raise ValueError(f"Space {space!r} has no embedded chunks; there is nothing to index.")
    status = hnsw_index_status(space, dimensions, using)
    if status.ok and not rebuild:
        return status, False
    sql = hnsw_index_sql(space, dimensions, m=m, ef_construction=ef_construction, concurrently=concurrently,
                         using=using)
    qn = connection.ops.quote_name
    with connection.cursor() as cursor:
        if status.state != "missing":
            cursor.execute(f"DROP INDEX {'CONCURRENTLY ' if concurrently else ''}IF EXISTS {qn(status.name)}")
        if maintenance_work_mem is None:
            chunk, _ = _tables(connection)
            cursor.execute(f"SELECT count(*) FROM {chunk} WHERE space = %s", [space])
            needed = min(_build_memory(cursor.fetchone()[0], dimensions), 2 << 30)
            cursor.execute("SELECT setting::bigint * 1024 FROM pg_settings WHERE name = 'maintenance_work_mem'")
            current = cursor.fetchone()[0]
            maintenance_work_mem = f"{max(needed, current) >> 20}MB"
        if not re.fullmatch(r"\d+\s*(kB|MB|GB)", maintenance_work_mem):
            raise ValueError(f"maintenance_work_mem must look like '512MB' or '2GB', not {maintenance_work_mem!r}")
        if connection.in_atomic_block:
            # Rows inserted earlier in this transaction have deferred foreign key checks
            # pending, which CREATE INDEX refuses to run with: run them now.
            connection.check_constraints()
            cursor.execute(f"SET LOCAL maintenance_work_mem = '{maintenance_work_mem}'")
            cursor.execute(sql)
        else:
            cursor.execute(f"SET maintenance_work_mem = '{maintenance_work_mem}'")
            try:
                cursor.execute(sql)
            finally:
                cursor.execute("RESET maintenance_work_mem")
    return hnsw_index_status(space, dimensions, using), True


def drop_hnsw_index(space: str, *, concurrently: bool = False, using: str = "default") -> None:
    connection = connections[using]
    with connection.cursor() as cursor:
        cursor.execute(f"DROP INDEX {'CONCURRENTLY ' if concurrently else ''}IF EXISTS "
                       f"{connection.ops.quote_name(hnsw_index_name(space))}")
    _looked_at.discard(_looked_at_key(space, using))


def build_missing_hnsw_indexes(names: Iterable[str] | None = None,
                               using: str = "default") -> list[tuple[str, float]]:
    """Build the HNSW index of each space of ``names`` (default: every space with chunks) that has
    none, or an invalid one; return (space, seconds) for each built. What ``ragchat_ingest``,
    ``ragchat_sync`` and the admin's resync do at the end of a load: building once is much
    faster than growing the index row by row."""
    built = []
    for space in names if names is not None else list(spaces(using)):
        status = hnsw_index_status(space, using=using)
        if status.state not in ("missing", "invalid", "mismatch"):
            continue  # ok, too many dimensions to index (exact scans), or no chunks
        if status.dimensions is None:
            continue
        started = time.monotonic()
        create_hnsw_index(space, using=using)
        built.append((space, time.monotonic() - started))
    return built


# --- Indexes of small writes ------------------------------------------------------------------
#
# Live sync (``sources.sync`` of given objects) and uploads write a few chunks at a time, often
# into a space nothing else has written yet: no command runs to build its index at the end. They
# ask for it here, and it is built after their transaction commits, outside any transaction of
# the site's, while the space is small enough for a build to be brief. Each process looks at a
# space once: later writes pay nothing.

#: A small write builds its space's missing HNSW index only while the space has at most this
#: many chunks: about 0.2 s at 384 dimensions on two cores, during which writes to the chunk
#: table wait. A larger space without one is left to ``ragchat_index`` (``ragchat.W011``).
AUTO_INDEX_MAX_CHUNKS = 1000
#: How long that build waits for the chunk table's lock before it gives up (W011 then says so).
AUTO_INDEX_LOCK_TIMEOUT = "2s"

# (alias, database name, space) this process has looked at. The name too: a test run's database
# is not the one the alias named at first.
_looked_at: set[tuple[str, str, str]] = set()


def _looked_at_key(space: str, using: str) -> tuple[str, str, str]:
    return using, str(connections[using].settings_dict.get("NAME")), space


def forget_indexes_looked_at() -> None:
    """Look at every space again at its next small write (a test's fresh database)."""
    _looked_at.clear()


def index_when_committed(spaces: Iterable[str], using: str | None = None) -> None:
    """After a small write to ``spaces`` (live sync, an upload): once the transaction on
    ``using`` commits (at once outside one), build the HNSW index of each space that has none
    and at most ``AUTO_INDEX_MAX_CHUNKS`` chunks. Nothing off PostgreSQL, and nothing for a
    space this process has looked at before: two queries for the first write of each space in a
    process (a build, about ten more, once), none after."""
    using = using or router.db_for_write(Chunk)
    if connections[using].vendor != "postgresql":
        return
    for space in spaces:
        if _looked_at_key(space, using) not in _looked_at:
            transaction.on_commit(lambda space=space: _index_small_space(space, using), using=using)


def _index_small_space(space: str, using: str) -> None:
    key = _looked_at_key(space, using)
    if key in _looked_at:
        return  # another write of the same transaction asked first
    try:
        status = hnsw_index_status(space, using=using)
        if status.dimensions is None:
            return  # nothing embedded in it (any more): look again at the next write
        _looked_at.add(key)
        if status.state not in ("missing", "invalid", "mismatch"):
            return
        connection = connections[using]
        chunk, _ = _tables(connection)
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT count(*) FROM (SELECT 1 FROM {chunk} WHERE space = %s LIMIT %s) c",
                           [space, AUTO_INDEX_MAX_CHUNKS + 1])
            if cursor.fetchone()[0] > AUTO_INDEX_MAX_CHUNKS:
                logger.warning("Embedding space %r has more than %d chunks and no valid HNSW index: its vector "
                               "searches scan every chunk. Run `python manage.py ragchat_index` once.", space,
                               AUTO_INDEX_MAX_CHUNKS)
                return
        started = time.monotonic()
        with transaction.atomic(using=using):
            with connection.cursor() as cursor:
                cursor.execute(f"SET LOCAL lock_timeout = '{AUTO_INDEX_LOCK_TIMEOUT}'")
            create_hnsw_index(space, using=using)
        logger.info("Built the HNSW index of space %r in %.2f s", space, time.monotonic() - started)
    except Exception:  # an index is an optimisation: never fail the write that asked for it
        if not _built_by_another(space, using):
            logger.warning("Could not build the HNSW index of space %r; run `python manage.py ragchat_index`",
                           space, exc_info=True)


def _built_by_another(space: str, using: str) -> bool:
    """Whether another process built the index meanwhile (two first writes at once: the second
    build fails on the index's name)."""
    try:
        return hnsw_index_status(space, using=using).ok
    except Exception:  # noqa: BLE001 - the database is gone too: the warning says what to run
        return False


def fulltext_index_status(config: str, using: str = "default") -> IndexStatus:
    """Whether full-text search in ``config`` is indexed (the column's GIN index for
    ``COLUMN_CONFIG``, an expression index for others)."""
    connection = connections[using]
    name = "ragchat_chunk_search_vector" if check_config(config) == COLUMN_CONFIG else fulltext_index_name(config)
    row = _index_row(connection, name)
    if row is None:
        return IndexStatus(name, "missing", config=config)
    return IndexStatus(name, "ok" if row[0] else "invalid", row[1], config=config)


def create_fulltext_index(config: str, *, concurrently: bool = False, using: str = "default") -> tuple[IndexStatus, bool]:
    """Create the expression GIN index for full-text search in ``config`` (not needed, and not
    created, for ``COLUMN_CONFIG``, whose column migration 0003 indexes)."""
    status = fulltext_index_status(config, using)
    if status.ok or config == COLUMN_CONFIG:
        return status, False
    connection = connections[using]
    chunk, _ = _tables(connection)
    qn = connection.ops.quote_name
    with connection.cursor() as cursor:
        if status.state == "invalid":
            cursor.execute(f"DROP INDEX {'CONCURRENTLY ' if concurrently else ''}IF EXISTS {qn(status.name)}")
        if connection.in_atomic_block:
            connection.check_constraints()  # see create_hnsw_index
        cursor.execute(f"CREATE INDEX {'CONCURRENTLY ' if concurrently else ''}{qn(status.name)} ON {chunk} "
                       f"USING gin ((to_tsvector('{config}'::regconfig, text)))")
    return fulltext_index_status(config, using), True


# --- Queries ---------------------------------------------------------------------------------

# The columns of a hit, after the search: chunk c joined with its document d (``search._hit``).
_HIT_COLUMNS = ("c.id, c.text, c.heading, c.ordinal, c.metadata, c.document_id, d.source, d.title, c.access, "
                "c.analysis")
# The same with no stored reading (NULL in its place: the rows keep their shape).
_HIT_COLUMNS_NO_READING = _HIT_COLUMNS.replace("c.analysis", "NULL")


def _hit_columns() -> str:
    return _HIT_COLUMNS if readings.wanted() else _HIT_COLUMNS_NO_READING


def _execute(using: str, settings: list[str], sql: str, params: list) -> list[tuple]:
    """Run ``sql`` with ``SET LOCAL`` ``settings`` in force for it alone."""
    connection = connections[using]
    with connection.cursor() as cursor:
        if not settings:
            cursor.execute(sql, params)
            return cursor.fetchall()
        try:
            from psycopg import ClientCursor  # noqa: PLC0415 - the driver in use, psycopg 3 or 2
        except ImportError:  # psycopg2
            ClientCursor = ()
        if isinstance(cursor.cursor, ClientCursor):
            # One simple-protocol string: PostgreSQL runs it as one implicit transaction, so the
            # SET LOCALs hold for the SELECT and end with it. One round trip instead of four.
            cursor.execute("; ".join([*settings, sql]), params)
            for _ in settings:
                cursor.nextset()
            return cursor.fetchall()
    with transaction.atomic(using=using, savepoint=False), connection.cursor() as cursor:
        for statement in settings:
            cursor.execute(statement)
        cursor.execute(sql, params)
        return cursor.fetchall()


def _ef(ef_search: int | None, k: int) -> int:
    # The index returns at most ef_search rows: never ask for fewer than k.
    return min(MAX_EF_SEARCH, max(ef_search or DEFAULT_EF_SEARCH, k))


def _where(filters: SearchFilters, principals: Principals, document: str) -> tuple[str, list]:
    """The filters' and the access's conditions on chunk ``c`` (``" AND ..."``) and parameters."""
    where, params = filters.sql("postgresql", document)
    readable, access_params = access_sql("postgresql", "c.access", principals)
    if readable:
        where, params = f"{where} AND {readable}", [*params, *access_params]
    return where, params


def _vector_inner(connection, space: str, vector, filters: SearchFilters, exact: bool,
                  principals: Principals) -> tuple[str, list]:
    """The nearest-neighbour subquery (id, distance) and its parameters, but for the limit."""
    chunk, document = _tables(connection)
    dimensions = len(vector)
    kind = None if exact else vector_type(dimensions)
    if kind is None:
        # No cast: this expression matches no index, so the scan is exact.
        distance = "c.embedding <=> %s::vector"
    else:
        # The index's expression, repeated exactly: the planner matches expressions structurally.
        distance = f"c.embedding::{kind}({dimensions}) <=> %s::{kind}({dimensions})"
    where, filter_params = _where(filters, principals, document)
    order = "distance, c.id" if kind is None else "distance"  # a second key would defeat the index
    sql = (f"SELECT c.id, {distance} AS distance FROM {chunk} c "
           f"WHERE c.space = {_literal(space)}{where} ORDER BY {order} LIMIT %s")
    return sql, [vector_literal(vector), *filter_params]


def _vector_settings(filters: SearchFilters, ef_search: int | None, k: int, exact: bool, dimensions: int,
                     principals: Principals = UNRESTRICTED) -> list[str]:
    if exact or vector_type(dimensions) is None:
        return []
    settings = [f"SET LOCAL hnsw.ef_search = {_ef(ef_search, k)}"]
    if filters or not principals.unrestricted:
        # Filtered and unreadable rows are dropped after the index scan; keep scanning until k
        # rows pass (at most hnsw.max_scan_tuples, 20,000 by default).
        settings.append("SET LOCAL hnsw.iterative_scan = relaxed_order")
    return settings


def vector_query(space: str, vector, k: int, *, filters: SearchFilters = SearchFilters(),
                 ef_search: int | None = None, exact: bool = False, using: str = "default",
                 principals: Principals = UNRESTRICTED) -> tuple[list[str], str, list]:
    """(SET LOCAL statements, SELECT, parameters) of the vector search: the hit columns and
    the cosine similarity, best first. Exposed so tests can EXPLAIN exactly what runs."""
    connection = connections[using]
    chunk, document = _tables(connection)
    inner, params = _vector_inner(connection, space, vector, filters, exact, principals)
    sql = (f"SELECT {_hit_columns()}, 1 - h.distance FROM ({inner}) h "
           f"JOIN {chunk} c ON c.id = h.id JOIN {document} d ON d.id = c.document_id "
           f"ORDER BY h.distance, c.id")
    return _vector_settings(filters, ef_search, k, exact, len(vector), principals), sql, [*params, k]


def vector_search(space: str, vector, k: int, *, filters: SearchFilters = SearchFilters(),
                  ef_search: int | None = None, exact: bool = False, using: str = "default",
                  principals: Principals = UNRESTRICTED) -> list[tuple]:
    """Rows of (hit columns..., similarity), best first, in one query."""
    settings, sql, params = vector_query(space, vector, k, filters=filters, ef_search=ef_search, exact=exact,
                                         using=using, principals=principals)
    return _execute(using, settings, sql, params)


def vector_ids(space: str, vector, k: int, *, filters: SearchFilters = SearchFilters(),
               ef_search: int | None = None, exact: bool = False, using: str = "default",
               principals: Principals = UNRESTRICTED) -> list[tuple[int, float]]:
    """(chunk id, cosine similarity) of the nearest chunks, best first."""
    connection = connections[using]
    inner, params = _vector_inner(connection, space, vector, filters, exact, principals)
    rows = _execute(using, _vector_settings(filters, ef_search, k, exact, len(vector), principals),
                    f"SELECT h.id, 1 - h.distance FROM ({inner}) h ORDER BY h.distance, h.id", [*params, k])
    return [(int(i), float(s)) for i, s in rows]


def _fulltext_inner(connection, space: str, terms: list[str], filters: SearchFilters,
                    config: str, principals: Principals) -> tuple[str, list]:
    """The text match subquery (id, rank) and its parameters, but for the limit."""
    chunk, document = _tables(connection)
    tsv = tsvector_sql(config)
    where, filter_params = _where(filters, principals, document)
    # websearch_to_tsquery never fails on user text, and "a or b" is its OR: any term may
    # match (a question rarely shares every word with its answer); ts_rank rewards more.
    sql = (f"SELECT c.id, ts_rank({tsv}, q.query) AS rank FROM {chunk} c, "
           f"websearch_to_tsquery('{config}'::regconfig, %s) q(query) "
           f"WHERE c.space = {_literal(space)} AND {tsv} @@ q.query{where} "
           f"ORDER BY rank DESC, c.id LIMIT %s")
    return sql, [" or ".join(terms), *filter_params]


def fulltext_query(space: str, terms: list[str], k: int, *, filters: SearchFilters = SearchFilters(),
                   config: str = COLUMN_CONFIG, using: str = "default",
                   principals: Principals = UNRESTRICTED) -> tuple[str, list]:
    """(SELECT, parameters) of the full-text search: the hit columns and ``ts_rank``, best first."""
    connection = connections[using]
    chunk, document = _tables(connection)
    inner, params = _fulltext_inner(connection, space, terms, filters, config, principals)
    sql = (f"SELECT {_hit_columns()}, t.rank FROM ({inner}) t "
           f"JOIN {chunk} c ON c.id = t.id JOIN {document} d ON d.id = c.document_id "
           f"ORDER BY t.rank DESC, c.id")
    return sql, [*params, k]


def fulltext_search(space: str, terms: list[str], k: int, *, filters: SearchFilters = SearchFilters(),
                    config: str = COLUMN_CONFIG, using: str = "default",
                    principals: Principals = UNRESTRICTED) -> list[tuple]:
    """Rows of (hit columns..., ts_rank), best first, for chunks matching any of ``terms``."""
    sql, params = fulltext_query(space, terms, k, filters=filters, config=config, using=using,
                                 principals=principals)
    return _execute(using, [], sql, params)


def hybrid_search(space: str, vector, terms: list[str], k: int, *, candidates: int,
                  weights: tuple[float, float], rrf_k: int, filters: SearchFilters = SearchFilters(),
                  ef_search: int | None = None, exact: bool = False, config: str = COLUMN_CONFIG,
                  using: str = "default", principals: Principals = UNRESTRICTED) -> list[tuple]:
    """Reciprocal rank fusion of the vector and full-text searches, in one query.

    ``vector`` may be ``None`` and ``terms`` empty: that search then finds nothing. Each search returns ``candidates`` rows; a chunk scores ``weights[0] / (rrf_k + its vector
    rank) + weights[1] / (rrf_k + its text rank)`` (a missing rank adds nothing). Rows are
    (hit columns..., fused score, similarity or None, ts_rank or None), best first.
    """
    connection = connections[using]
    chunk, document = _tables(connection)
    if vector is not None:
        vector_sql, vector_params = _vector_inner(connection, space, vector, filters, exact, principals)
        vector_params = [*vector_params, candidates]
        settings = _vector_settings(filters, ef_search, candidates, exact, len(vector), principals)
    else:
        vector_sql, vector_params, settings = "SELECT NULL::bigint AS id, NULL::float8 AS distance WHERE false", [], []
    if terms:
        text_sql, text_params = _fulltext_inner(connection, space, terms, filters, config, principals)
        text_params = [*text_params, candidates]
    else:
        text_sql, text_params = "SELECT NULL::bigint AS id, NULL::real AS rank WHERE false", []
    sql = (
        f"WITH v AS MATERIALIZED ({vector_sql}), t AS MATERIALIZED ({text_sql}), "
        f"fused AS (SELECT coalesce(vr.id, tr.id) AS id, "
        f"coalesce(%s::float8 / (%s + vr.pos), 0) + coalesce(%s::float8 / (%s + tr.pos), 0) AS score, "
        f"1 - vr.distance AS similarity, tr.rank AS text_rank "
        f"FROM (SELECT id, distance, row_number() OVER (ORDER BY distance, id) AS pos FROM v) vr "
        f"FULL OUTER JOIN (SELECT id, rank, row_number() OVER (ORDER BY rank DESC, id) AS pos FROM t) tr "
        f"ON vr.id = tr.id) "
        f"SELECT {_hit_columns()}, f.score, f.similarity, f.text_rank FROM fused f "
        f"JOIN {chunk} c ON c.id = f.id JOIN {document} d ON d.id = c.document_id "
        f"ORDER BY f.score DESC, c.id LIMIT %s"
    )
    params = [*vector_params, *text_params, weights[0], rrf_k, weights[1], rrf_k, k]
    return _execute(using, settings, sql, params)


# --- Bulk storage ----------------------------------------------------------------------------

_COPY_COLUMNS = ("document_id", "ordinal", "text", "heading", "space", "embedding", "token_count", "metadata",
                 "access", "analysis")
# Binary COPY types as psycopg writes them. ``bytea`` for the embedding: psycopg writes the
# bytes as they are, and they are already pgvector's binary form (the server reads the field
# with the column's own type), so no pgvector adapter needs registering on the connection.
_COPY_TYPES = ("int8", "int4", "text", "text", "text", "bytea", "int4", "jsonb", "jsonb", "bytea")


def copy_chunks(chunks: Iterable, using: str = "default") -> int:
    """Insert unsaved ``Chunk`` objects with one binary ``COPY`` (about 5x the rows per second
    of ``bulk_create``). Runs in the caller's transaction, if any; returns the rows written.
    Primary keys are not set on the objects (COPY returns none)."""
    connection = connections[using]
    chunk, _ = _tables(connection)
    written = 0
    # wrap_database_errors: the driver's exceptions become Django's (DatabaseError...), as
    # they do for execute().
    with connection.cursor() as cursor, connection.wrap_database_errors:
        with cursor.cursor.copy(f"COPY {chunk} ({', '.join(_COPY_COLUMNS)}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(list(_COPY_TYPES))
            for c in chunks:
                copy.write_row((
                    c.document_id, c.ordinal, c.text, c.heading, c.space,
                    None if c.embedding is None else vector_binary(c.embedding),
                    c.token_count, c.metadata if c.metadata is not None else {},
                    c.access if c.access is not None else public_access(),
                    None if c.analysis is None else bytes(c.analysis),
                ))
                written += 1
    return written


def _decoded(value, empty):
    # Django loads jsonb as text (JSONField decodes it); raw cursors see the same.
    return json.loads(value) if isinstance(value, (str, bytes)) else (value or empty)


def decode_metadata(value) -> dict:
    """A chunk's ``metadata`` column as read by a raw cursor."""
    return _decoded(value, {})


def decode_access(value) -> list[str]:
    """A chunk's ``access`` column as read by a raw cursor: its list of principal tokens."""
    return _decoded(value, [])

