"""The site's own models as knowledge, kept in sync, each answer limited to what its asker may read.

Declare a source and register it from a plugin (docs/sources.md)::

    from django_ragchat import hookimpl
    from django_ragchat.sources import PUBLIC, ModelSource

    class ProductSource(ModelSource):
        name = "products"
        model = Product

        def get_queryset(self):
            return Product.objects.filter(published=True)

        def text(self, obj):
            return obj.description

    @hookimpl
    def register_sources(register):
        register(ProductSource)

* ``base``: ``ModelSource``, what a site subclasses.
* ``registry``: the registered sources, checked (system checks ``ragchat.E050``-``E057``).
* ``sync``: ``sync(source)``: every object, the recent ones (``since``) or given ones; what
  ``manage.py ragchat_sync`` runs.
* ``live``: signals to tasks, after the transaction commits (``paused()`` for bulk imports).

Access tokens (``PUBLIC``, ``AUTHENTICATED``, ``STAFF``, users, groups, permissions) are those of
``django_ragchat.access``, re-exported here.
"""

from django_ragchat.access import AUTHENTICATED, PUBLIC, STAFF, InvalidAccess, access_tokens
from django_ragchat.sources.base import ModelSource, SourceError
from django_ragchat.sources.live import paused
from django_ragchat.sources.registry import get_source, sources
from django_ragchat.sources.sync import SyncReport, parse_since, remove, sync

__all__ = [
    "AUTHENTICATED", "PUBLIC", "STAFF", "InvalidAccess", "ModelSource", "SourceError", "SyncReport", "access_tokens",
    "get_source", "parse_since", "paused", "remove", "sources", "sync",
]
