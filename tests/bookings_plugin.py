"""A theatre's pages and one user's bookings, as model sources over the tests' ``Article``: an
article with an owner stands in for a booking, readable by that user alone; one without is a
public page (docs/sources.md, "One user's rows")."""

from __future__ import annotations

from django_ragchat import hookimpl
from django_ragchat.sources import PUBLIC, ModelSource
from tests.sources_app.models import Article


class TheatreSource(ModelSource):
    name = "theatre"
    model = Article

    def title(self, obj):
        return obj.title

    def text(self, obj):
        return obj.body

    def access(self, obj):
        return [obj.owner] if obj.owner else PUBLIC


@hookimpl
def register_sources(register):
    register(TheatreSource)
