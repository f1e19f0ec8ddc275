"""A plugin listed in RAGCHAT["PLUGINS"] by the plugin tests."""

from django_ragchat import hookimpl
from django_ragchat.stages.transformers import QueryTransformer


class SettingsMarker(QueryTransformer):
    name = "settings_marker"
    order = 100

    def transform(self, query, turn):
        return query.replace(metadata={**query.metadata, "transform_note": "settings plugin, order 100"})


@hookimpl
def register_query_transformers(register):
    register(SettingsMarker)
