"""Model sources that are each wrong in one way (the system checks ragchat.E050-E057)."""

from django_ragchat import hookimpl
from django_ragchat.sources import ModelSource
from tests.sources_app.models import Article, Note


class NotASource:
    name = "impostor"


class Duplicate(ModelSource):
    name = "articles"
    model = Article

    def text(self, obj):
        return obj.body


class NoModel(ModelSource):
    name = "no_model"
    model = "nope.Nothing"

    def text(self, obj):
        return ""


class NoText(ModelSource):
    name = "no_text"
    model = Article


class NoTemplate(ModelSource):
    name = "no_template"
    model = Article
    template_name = "sources_app/does-not-exist.md"


class BadDependency(ModelSource):
    name = "bad_dependency"
    model = Article
    depends_on = {Note: "nowhere"}

    def text(self, obj):
        return obj.body


class BadUpdatedField(ModelSource):
    name = "bad_updated_field"
    model = Article
    updated_field = "title"

    def text(self, obj):
        return obj.body


class GhostProfile(ModelSource):
    name = "ghost_profile"
    model = Article
    profiles = ["ghost"]

    def text(self, obj):
        return obj.body


@hookimpl
def register_sources(register):
    for cls in (NotASource, Duplicate, NoModel, NoText, NoTemplate, BadDependency, BadUpdatedField, GhostProfile):
        register(cls)
