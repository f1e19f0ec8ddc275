"""The OpenAPI generator of the API's schema view, independent of the site's DRF settings.

drf-spectacular's ``@extend_schema`` on a view *method* builds its schema class on
``REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"]`` as it is when the module is imported; a site that
never set it to drf-spectacular's class gets DRF's own ``AutoSchema`` there, and the schema
answers 500 ("Incompatible AutoSchema used on View ..."). The API views set
``schema = RagchatAutoSchema()`` themselves, and this generator re-bases the method-level schema
classes on it (``use_spectacular_schemas``, called by
``django_ragchat.api.urls`` for its views), so that nothing has to be set by the site: the
schema view, ``manage.py spectacular`` and drf-spectacular's own system check all work.
"""

from __future__ import annotations

from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.openapi import AutoSchema

from django_ragchat.api.permissions import CanChat
from django_ragchat.conf import ragchat_settings


class RagchatAutoSchema(AutoSchema):
    """drf-spectacular's inspector, which also says when an operation needs no sign-in: with
    ``ALLOW_ANONYMOUS`` on, an operation whose only permission is ``CanChat`` lists the empty
    security requirement (``{}``) beside the site's authentication schemes; and that every
    body is required (a request without one is refused 400 ``parse_error``, even where every
    field is optional: ``{}`` is the way to take the defaults)."""

    def _get_request_body(self, direction="request"):
        body = super()._get_request_body(direction)
        if body is not None:
            body["required"] = True
        return body

    def get_auth(self):
        auth = super().get_auth()
        permissions = self.view.get_permissions()
        if (ragchat_settings.ALLOW_ANONYMOUS and permissions and {} not in auth
                and all(isinstance(p, CanChat) for p in permissions)):
            auth.append({})
        return auth


def _rebase(schema_class: type) -> None:
    """Make the ``@extend_schema`` classes above ``schema_class`` inherit ``RagchatAutoSchema``
    instead of another inspector (done once per class; idempotent)."""
    cls = schema_class
    while not issubclass(cls, RagchatAutoSchema):
        if len(cls.__bases__) != 1:
            return  # not the single-inheritance chain @extend_schema builds: leave it alone
        base = cls.__bases__[0]
        # DRF's AutoSchema or DefaultSchema, or drf-spectacular's own (a site's default class).
        if base.__module__.startswith("rest_framework.") or base is AutoSchema:
            cls.__bases__ = (RagchatAutoSchema,)
            return
        cls = base


HTTP_METHODS = ("get", "post", "put", "patch", "delete", "head", "options", "trace")


def use_spectacular_schemas(*view_classes: type) -> None:
    """Re-base the ``@extend_schema`` classes of these views' methods on drf-spectacular's
    ``AutoSchema`` (see the module's docstring)."""
    for view_class in view_classes:
        for method in HTTP_METHODS:
            action_schema = getattr(getattr(view_class, method, None), "kwargs", {}).get("schema")
            if isinstance(action_schema, type) and not issubclass(action_schema, RagchatAutoSchema):
                _rebase(action_schema)


class RagchatSchemaGenerator(SchemaGenerator):
    """drf-spectacular's generator, with the view-level schema classes re-based (see above)."""

    def create_view(self, callback, method, request=None):
        action = getattr(getattr(callback, "cls", None), method.lower(), None)
        action_schema = getattr(action, "kwargs", {}).get("schema") if action is not None else None
        if isinstance(action_schema, type) and not issubclass(action_schema, RagchatAutoSchema):
            _rebase(action_schema)
        return super().create_view(callback, method, request)
