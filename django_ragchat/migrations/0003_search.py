"""Search structures per database (no model change: the state is untouched).

PostgreSQL: the stored ``search_vector`` column (``tsvector`` of the chunk's text, in the
``english`` configuration) with its GIN index; a GIN index for metadata containment filters
(``metadata @> '{...}'``); and ``toast_tuple_target`` raised so that a chunk's vector and text
stay in the row instead of being compressed and moved to TOAST (measured: +55 % COPY
throughput, and no detoasting in exact scans). SQLite: the FTS5 index and its triggers.
HNSW indexes are per embedding space, so they are made by ``manage.py ragchat_index``.
"""

from django.db import migrations

from django_ragchat.search.migration_operations import CreateSQLiteFullText, RunSQLOnPostgreSQL


class Migration(migrations.Migration):

    dependencies = [
        ("django_ragchat", "0002_feedback"),
    ]

    operations = [
        RunSQLOnPostgreSQL(
            sql=[
                "ALTER TABLE django_ragchat_chunk SET (toast_tuple_target = 8160)",
                "ALTER TABLE django_ragchat_chunk ADD COLUMN search_vector tsvector "
                "GENERATED ALWAYS AS (to_tsvector('english'::regconfig, text)) STORED",
                "CREATE INDEX ragchat_chunk_search_vector ON django_ragchat_chunk USING gin (search_vector)",
                "CREATE INDEX ragchat_chunk_metadata ON django_ragchat_chunk USING gin (metadata jsonb_path_ops)",
            ],
            reverse_sql=[
                "DROP INDEX IF EXISTS ragchat_chunk_metadata",
                "DROP INDEX IF EXISTS ragchat_chunk_search_vector",
                "ALTER TABLE django_ragchat_chunk DROP COLUMN IF EXISTS search_vector",
                "ALTER TABLE django_ragchat_chunk RESET (toast_tuple_target)",
            ],
        ),
        CreateSQLiteFullText(),
    ]
