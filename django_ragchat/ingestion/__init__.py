"""Document ingestion for django-ragchat.

``loaders`` turns files on disk (Markdown, reStructuredText, HTML, plain
text) into :class:`~django_ragchat.ingestion.loaders.LoadedDocument` objects
made of heading-scoped sections, and ``chunking`` splits those into
retrieval-sized :class:`~django_ragchat.ingestion.chunking.TextChunk` objects.
Both are pure Python and import nothing from Django, so they can be used and
tested without settings.

``pipeline`` embeds and stores them as ``Document`` and ``Chunk`` rows
(``ingest_paths``, ``ingest_text``, ``reembed``; see docs/ingestion.md).
"""
