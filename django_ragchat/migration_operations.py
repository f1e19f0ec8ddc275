"""Migration operations that depend on the database vendor."""

from django.db.migrations.operations.base import Operation


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
