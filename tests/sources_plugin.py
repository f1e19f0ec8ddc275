"""Model sources of the tests (``tests/sources_app``), listed in ``RAGCHAT["PLUGINS"]`` by the tests
that use them; and an embedder that counts what it embeds (the hashing one, same space)."""

from __future__ import annotations

from django_ragchat import hookimpl
from django_ragchat.sources import PUBLIC, STAFF, ModelSource
from django_ragchat.stages.embedders import HashingEmbedder
from tests.sources_app.models import Article, Note, Tag


class CountingEmbedder(HashingEmbedder):
    """The hashing embedder (same vectors, same space), counting the texts it embeds."""

    name = "counting"
    enabled_by_default = False
    embedded: list[str] = []

    def embed(self, texts):
        CountingEmbedder.embedded.extend(texts)
        return super().embed(texts)


class ArticleSource(ModelSource):
    name = "articles"
    model = Article
    updated_field = "updated_at"
    depends_on = {Note: "article", Tag: "articles"}

    def get_queryset(self):
        return Article.objects.filter(published=True).prefetch_related("notes", "tags")

    def text(self, obj):
        notes = "".join(f"\n\n{note.text}" for note in obj.notes.all())
        return f"## Summary\n\n{obj.body}{notes}"

    def metadata(self, obj):
        return {"tags": sorted(t.name for t in obj.tags.all())}

    def access(self, obj):
        readers = [who for who in (obj.owner, obj.group) if who is not None]
        if obj.staff_only:
            readers.append(STAFF)
        if obj.permission:
            readers.append(obj.permission)
        return readers or PUBLIC


class PageSource(ModelSource):
    name = "pages"
    model = "sources_app.Page"
    template_name = "sources_app/page.md"


@hookimpl
def register_sources(register):
    register(ArticleSource)
    register(PageSource)


@hookimpl
def register_embedders(register):
    register(CountingEmbedder)
