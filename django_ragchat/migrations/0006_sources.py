"""Model sources and access (issue 23).

``access`` on documents and chunks: who may read them (``django_ragchat.access``); every row
stored before is public. ``origin`` / ``object_pk``: the model source and object a document
stands for. ``SourceState``: what the last sync of each source did.

PostgreSQL: a GIN index on the chunks' ``access`` serves the search's ``access ?| principals``.
SQLite: adding a column rebuilds the chunk table, which drops the FTS5 triggers; they are put
back and the full-text index rebuilt (``CreateSQLiteFullText`` is idempotent).
"""

from django.db import migrations, models

import django_ragchat.access
import django_ragchat.fields
from django_ragchat.search.migration_operations import CreateSQLiteFullText, RunSQLOnPostgreSQL


class Migration(migrations.Migration):

    dependencies = [
        ('django_ragchat', '0005_api_keys'),
    ]

    operations = [
        migrations.CreateModel(
            name='SourceState',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=100, unique=True)),
                ('last_sync_started_at', models.DateTimeField(blank=True, null=True)),
                ('last_sync_finished_at', models.DateTimeField(blank=True, null=True)),
                ('last_sync', models.JSONField(blank=True, default=dict)),
                ('last_live_sync_at', models.DateTimeField(blank=True, null=True)),
                ('last_error', models.TextField(blank=True, default='')),
            ],
            options={
                'verbose_name': 'model source',
                'ordering': ['name'],
            },
        ),
        migrations.AddField(
            model_name='chunk',
            name='access',
            field=django_ragchat.fields.AccessField(blank=True, default=django_ragchat.access.public_access),
        ),
        migrations.AddField(
            model_name='document',
            name='access',
            field=django_ragchat.fields.AccessField(blank=True, default=django_ragchat.access.public_access, help_text='Principal tokens that may read it: public, authenticated, staff, user:<pk>, group:<pk>, perm:<app_label.codename>.'),
        ),
        migrations.AddField(
            model_name='document',
            name='object_pk',
            field=models.CharField(blank=True, default='', max_length=100),
        ),
        migrations.AddField(
            model_name='document',
            name='origin',
            field=models.CharField(blank=True, db_index=True, default='', help_text='The model source that indexed it (empty for files and uploads).', max_length=100),
        ),
        migrations.AlterField(
            model_name='document',
            name='checksum',
            field=models.CharField(help_text="sha256 of the source's bytes (of a model object: of its text, title, URL and metadata)", max_length=64),
        ),
        migrations.AlterField(
            model_name='document',
            name='updated_at',
            field=models.DateTimeField(auto_now=True, db_index=True),
        ),
        migrations.AddConstraint(
            model_name='document',
            constraint=models.UniqueConstraint(condition=models.Q(('origin', ''), _negated=True), fields=('origin', 'object_pk'), name='ragchat_document_object_unique'),
        ),
        RunSQLOnPostgreSQL(
            sql=["CREATE INDEX ragchat_chunk_access ON django_ragchat_chunk USING gin (access)"],
            reverse_sql=["DROP INDEX IF EXISTS ragchat_chunk_access"],
        ),
        CreateSQLiteFullText(),
    ]
