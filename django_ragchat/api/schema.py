"""The OpenAPI generator of the API's schema view, independent of the site's DRF settings.

drf-spectacular's ``@extend_schema`` on a view *method* builds its schema class on
``REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"]`` as it is when the module is imported; a site that
never set it to drf-spectacular's class gets DRF's own ``AutoSchema`` there, and the schema
answers 500 ("Incompatible AutoSchema used on View ..."). The API views set
``schema = AutoSchema()`` themselves, and this generator re-bases the method-level schema
classes on drf-spectacular's ``AutoSchema`` (``use_spectacular_schemas``, called by
``django_ragchat.api.urls`` for its views), so that nothing has to be set by the site: the
schema view, ``manage.py spectacular`` and drf-spectacular's own system check all work.
"""

from __future__ import annotations

from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.openapi import AutoSchema


def _rebase(schema_class: type) -> None:
    """Make the ``@extend_schema`` classes above ``schema_class`` inherit drf-spectacular's
    ``AutoSchema`` instead of another inspector (done once per class; idempotent)."""
    cls = schema_class
    while not issubclass(cls, AutoSchema):
        if len(cls.__bases__) != 1:
            return  # not the single-inheritance chain @extend_schema builds: leave it alone
        base = cls.__bases__[0]
        if base.__module__.startswith("rest_framework."):  # DRF's AutoSchema or DefaultSchema
            cls.__bases__ = (AutoSchema,)
            return
        cls = base


HTTP_METHODS = ("get", "post", "put", "patch", "delete", "head", "options", "trace")


def use_spectacular_schemas(*view_classes: type) -> None:
    """Re-base the ``@extend_schema`` classes of these views' methods on drf-spectacular's
    ``AutoSchema`` (see the module's docstring)."""
    for view_class in view_classes:
        for method in HTTP_METHODS:
            action_schema = getattr(getattr(view_class, method, None), "kwargs", {}).get("schema")
            if isinstance(action_schema, type) and not issubclass(action_schema, AutoSchema):
                _rebase(action_schema)


class RagchatSchemaGenerator(SchemaGenerator):
    """drf-spectacular's generator, with the view-level schema classes re-based (see above)."""

    def create_view(self, callback, method, request=None):
        action = getattr(getattr(callback, "cls", None), method.lower(), None)
        action_schema = getattr(action, "kwargs", {}).get("schema") if action is not None else None
        if isinstance(action_schema, type) and not issubclass(action_schema, AutoSchema):
            _rebase(action_schema)
        return super().create_view(callback, method, request)
