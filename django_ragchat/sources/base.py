"""``ModelSource``: how one model of the site becomes documents the assistant searches.

A subclass names the model and says, per object, the text to chunk, its title, URL, metadata
and who may read it, the way django-haystack's ``SearchIndex`` does (``index_queryset``,
``use_template``, ``get_updated_field``). Only ``name``, ``model`` and a text (``text()`` or
``template_name``) are required::

    class ProductSource(ModelSource):
        name = "products"
        model = Product
        updated_field = "updated_at"        # lets `ragchat_sync --since` find recent changes
        depends_on = {FAQ: "product"}       # a FAQ's save re-indexes its product

        def get_queryset(self):
            return Product.objects.filter(published=True).prefetch_related("faqs")

        def text(self, obj):
            return f"{obj.description}\\n\\n## Price\\n{obj.price} EUR"

Each object becomes one ``Document`` (``source`` ``"<name>:<pk>"``, ``origin`` the source's name)
whose text is Markdown: its headings become the chunks' headings, and a text that does not
start with a level-one heading gets the title as one, so every chunk says what it is about.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from django.apps import apps
from django.db import models
from django.template.loader import render_to_string

from django_ragchat.access import PUBLIC, access_tokens
from django_ragchat.ingestion.pipeline import DocumentEntry
from django_ragchat.models import Document

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_\-]{0,63}$")
_TITLE_MAX = Document._meta.get_field("title").max_length
_PK_MAX = Document._meta.get_field("object_pk").max_length


class SourceError(ValueError):
    """One object could not be turned into a document (the message says why)."""


class ModelSource:
    """The site's own model as knowledge. Subclass it and register the subclass with the
    ``register_sources`` hook (docs/sources.md).

    Attributes:

    ``name``
        Unique; lowercase letters, digits, ``_`` and ``-`` (``ragchat_sync products``).
    ``model``
        The model class, or ``"app_label.ModelName"``.
    ``template_name``
        A template rendered with ``{"object": obj, "source": self}`` for the text, when
        ``text()`` is not overridden (haystack's ``use_template``).
    ``depends_on``
        ``{model or "app_label.Model": how}`` for models the text depends on: saving or
        deleting one of those re-indexes the objects ``how`` leads to: the name of a relation
        on that model (a foreign key, a many-to-many or a reverse relation to this source's
        model), or a callable ``(instance) -> objects or primary keys``.
    ``updated_field``
        A date-time field set on every change (``auto_now``): ``ragchat_sync --since`` then
        syncs only objects changed since (a bulk ``update()`` should set it too).
    ``live``
        ``False`` turns live sync off: only ``ragchat_sync`` indexes this source.
    ``profiles``
        The profiles whose embedders' spaces the objects are embedded in; ``None``: every
        profile's (usually one space).
    ``batch_size``
        Objects read per query by a sync.
    """

    name: str = ""
    model: type[models.Model] | str | None = None
    template_name: str | None = None
    depends_on: dict[Any, Any] = {}
    updated_field: str | None = None
    live: bool = True
    profiles: list[str] | None = None
    batch_size: int = 200

    # --- What a site overrides -------------------------------------------------------------

    def get_queryset(self) -> models.QuerySet:
        """What is indexed: every object by default. Objects leaving it leave the index."""
        return self.get_model()._default_manager.all()

    def text(self, obj: Any) -> str:
        """The text to chunk (Markdown). By default ``template_name`` rendered with the object."""
        if not self.template_name:
            raise NotImplementedError(f"Source {self.name!r}: override text(self, obj) or set template_name.")
        return render_to_string(self.template_name, {"object": obj, "source": self})

    def title(self, obj: Any) -> str:
        """The document's title (shown in citations). Default: ``str(obj)``."""
        return str(obj)

    def url(self, obj: Any) -> str:
        """Where the object lives on the site (``metadata["url"]`` of its chunks). Default:
        ``obj.get_absolute_url()`` when the model has it."""
        getter = getattr(obj, "get_absolute_url", None)
        return str(getter()) if callable(getter) else ""

    def metadata(self, obj: Any) -> dict[str, Any]:
        """Values retriever filters can match (``{"metadata": {...}}``): JSON objects."""
        return {}

    def access(self, obj: Any) -> Any:
        """Who may retrieve it: ``PUBLIC`` (the default), ``AUTHENTICATED``, ``STAFF``, users,
        groups and ``"app_label.codename"`` permissions, any mix (``access.access_tokens``).
        Nobody (``None`` or ``[]``) keeps the object out of the index."""
        return PUBLIC

    # --- What the sync uses ----------------------------------------------------------------

    def get_model(self) -> type[models.Model]:
        """The model class (``model`` resolved when it is a label)."""
        if isinstance(self.model, str):
            return apps.get_model(self.model)
        if isinstance(self.model, type) and issubclass(self.model, models.Model):
            return self.model
        raise SourceError(f"Source {self.name!r}: model must be a model class or 'app_label.ModelName', "
                          f"not {self.model!r}.")

    def key(self, pk: Any) -> str:
        """The stored ``Document.source`` of the object with primary key ``pk``."""
        return f"{self.name}:{pk}"

    def entry(self, obj: Any) -> DocumentEntry | None:
        """The document of ``obj``, or ``None`` when nobody may read it. Raises ``SourceError``
        (or whatever the site's methods raise) when it cannot be built."""
        readers = list(access_tokens(self.access(obj)))
        if not readers:
            return None
        pk = str(obj.pk)
        if len(pk) > _PK_MAX:
            raise SourceError(f"the primary key is longer than {_PK_MAX} characters")
        title = " ".join(str(self.title(obj) or "").split())[:_TITLE_MAX]
        body = str(self.text(obj) or "")
        metadata = dict(self.metadata(obj) or {})
        url = str(self.url(obj) or "")
        if url:
            metadata["url"] = url
        try:
            metadata = json.loads(json.dumps(metadata, allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise SourceError(f"metadata must be JSON (strings, numbers, booleans, lists, objects): {exc}") from None
        text = body if body.lstrip().startswith("# ") or not title else f"# {title}\n\n{body}"
        if "\x00" in text:
            raise SourceError("the text holds NUL characters")
        checksum = hashlib.sha256(json.dumps([text, title, metadata], sort_keys=True).encode()).hexdigest()
        # The text is parsed only if the document changed (ingestion.DocumentEntry.load).
        return DocumentEntry(source=self.key(pk), text=text, content_type="markdown", title=title,
                             metadata=metadata, access=readers, origin=self.name, object_pk=pk, checksum=checksum)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"
