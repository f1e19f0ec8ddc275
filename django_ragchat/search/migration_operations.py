"""Migration operations that depend on the database vendor."""

import warnings

from django.db.migrations.operations.base import Operation

from django_ragchat.search import sqlite


class CreateVectorExtension(Operation):
    """``CREATE EXTENSION IF NOT EXISTS vector`` on PostgreSQL; nothing elsewhere.

    On a server without pgvector installed this fails with PostgreSQL's own message; the
    system check ``ragchat.E010`` says how to install it (scripts/install-pgvector.sh).
    """

    reversible = True
    reduces_to_sql = True

    def state_forwards(self, app_label, state):
        pass

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute("CREATE EXTENSION IF NOT EXISTS vector")

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        pass  # other apps may use the extension; never drop it

    def describe(self):
        return "Creates the pgvector extension on PostgreSQL"


class RunSQLOnPostgreSQL(Operation):
    """Statements run on PostgreSQL only (``reverse_sql`` on the way back); nothing elsewhere."""

    reversible = True
    reduces_to_sql = True

    def __init__(self, sql: list[str], reverse_sql: list[str]):
        self.sql = list(sql)
        self.reverse_sql = list(reverse_sql)

    def deconstruct(self):
        return (self.__class__.__qualname__, [], {"sql": self.sql, "reverse_sql": self.reverse_sql})

    def state_forwards(self, app_label, state):
        pass

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            for statement in self.sql:
                schema_editor.execute(statement)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            for statement in self.reverse_sql:
                schema_editor.execute(statement)

    def describe(self):
        return "Runs SQL on PostgreSQL only"


class CreateSQLiteFullText(Operation):
    """On SQLite: the FTS5 index of the chunks' text and the triggers that keep it in step
    (see ``django_ragchat.search.sqlite``). Skipped, with a warning, on a SQLite built without
    FTS5 (full-text search then reports that it is unavailable); nothing on other databases."""

    reversible = True

    def state_forwards(self, app_label, state):
        pass

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        connection = schema_editor.connection
        if connection.vendor != "sqlite":
            return

        if not sqlite.fts5_available(connection):
            warnings.warn("This SQLite has no FTS5: django-ragchat's full-text search will be unavailable.", stacklevel=2)
            return
        for statement in sqlite.fulltext_sql(connection):
            schema_editor.execute(statement)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        connection = schema_editor.connection
        if connection.vendor == "sqlite":
            for statement in sqlite.drop_fulltext_sql(connection):
                schema_editor.execute(statement)

    def describe(self):
        return "Creates the FTS5 full-text index of chunks on SQLite"
