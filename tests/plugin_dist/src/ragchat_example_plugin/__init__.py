"""A third-party plugin, as one would write it: two query transformers and a lifecycle hook.

``EarlyMarker`` (order 10) runs before the built-in transformers; ``LateMarker`` (order 100)
ties with the settings-listed test plugin's transformer and, being loaded later (entry points
load after settings plugins), runs after it.
"""

from django_ragchat import hookimpl
from django_ragchat.stages.transformers import QueryTransformer

COMPLETED_TURNS = []


class EarlyMarker(QueryTransformer):
    name = "entrypoint_early"
    order = 10

    def transform(self, query, turn):
        return query.replace(metadata={**query.metadata, "transform_note": "entry point, order 10"})


class LateMarker(QueryTransformer):
    name = "entrypoint_late"
    order = 100

    async def transform(self, query, turn):  # async on purpose: hooks may return awaitables
        return query.replace(metadata={**query.metadata, "transform_note": "entry point, order 100"})


@hookimpl
def register_query_transformers(register):
    register(EarlyMarker)
    register(LateMarker)


@hookimpl
def on_turn_completed(turn, message):
    COMPLETED_TURNS.append(message.pk)
