"""URLs of the REST API. A site mounts them once::

    path("api/ragchat/", include("django_ragchat.api.urls")),

Ids in paths are matched as strings so that a malformed id answers the same JSON 404 as an
unknown one. ``schema/`` serves the OpenAPI document of these endpoints only, ``docs/`` and
``redoc/`` render it with Swagger UI and Redoc served from the site's own static files
(drf-spectacular-sidecar; no CDN), whatever the site's ``SPECTACULAR_SETTINGS`` say.
"""

from django.templatetags.static import static
from django.urls import include, path
from django.views import View
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import extend_schema
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from django_ragchat.api import views
from django_ragchat.api.schema import RagchatSchemaGenerator, use_spectacular_schemas

app_name = "ragchat_api"

urlpatterns = [
    path("conversations/", views.ConversationList.as_view(), name="conversation-list"),
    path("conversations/<str:conversation_id>/", views.ConversationDetail.as_view(), name="conversation-detail"),
    path("conversations/<str:conversation_id>/messages/", views.MessageList.as_view(), name="message-list"),
    path("conversations/<str:conversation_id>/cancel/", views.ConversationCancel.as_view(), name="conversation-cancel"),
    path("messages/<str:message_id>/feedback/", views.MessageFeedback.as_view(), name="message-feedback"),
    path("feedback/", views.FeedbackList.as_view(), name="feedback-list"),
    path("tool-calls/<str:confirmation_id>/", views.ToolCallDetail.as_view(), name="tool-call-detail"),
    path("tool-calls/<str:confirmation_id>/decision/", views.ToolCallDecision.as_view(), name="tool-call-decision"),
    path("memory/", views.MemoryList.as_view(), name="memory-list"),
    path("memory/<str:pk>/", views.MemoryDetail.as_view(), name="memory-detail"),
    path("documents/", views.DocumentList.as_view(), name="document-list"),
    path("documents/tasks/<str:task_id>/", views.DocumentTask.as_view(), name="document-task"),
    path("documents/<str:pk>/", views.DocumentDetail.as_view(), name="document-detail"),
    path("plugins/", views.PluginList.as_view(), name="plugin-list"),
]


def _sidecar(path: str) -> str:
    # drf-spectacular-sidecar's copy, found by the static files finders (its app is installed).
    return static(f"drf_spectacular_sidecar/{path}")


class SchemaView(SpectacularAPIView):
    """The OpenAPI document of the endpoints above, wherever the site mounted them."""

    schema = AutoSchema()  # whatever the site's DEFAULT_SCHEMA_CLASS (it is in the document's patterns)
    generator_class = RagchatSchemaGenerator

    custom_settings = {
        "TITLE": "django-ragchat API",
        "DESCRIPTION": "Conversations, messages, feedback, memory, documents and plugins. See docs/api.md.",
        "VERSION": "1",
    }

    @extend_schema(exclude=True)
    def get(self, request, *args, **kwargs):
        # The route this view matched, minus "schema/", is where the site included these URLs.
        prefix = request.resolver_match.route.removesuffix("schema/")
        self.patterns = [path(prefix, include(urlpatterns))]
        return super().get(request, *args, **kwargs)


class _Page:
    """A page rendered from a template: ``OPTIONS`` gets Django's answer (the methods allowed),
    not DRF's metadata, which its HTML renderer has no template for (a 500, an outside probe)."""

    def options(self, request, *args, **kwargs):
        return View.options(self, request, *args, **kwargs)


class SwaggerView(_Page, SpectacularSwaggerView):
    """Swagger UI over :class:`SchemaView`, from the site's static files (works offline)."""

    schema = AutoSchema()
    url_name = "ragchat_api:schema"
    title = "django-ragchat API"

    @staticmethod
    def _swagger_ui_resource(filename):
        return _sidecar(f"swagger-ui-dist/{filename}")

    @staticmethod
    def _swagger_ui_favicon():
        return _sidecar("swagger-ui-dist/favicon-32x32.png")


class RedocView(_Page, SpectacularRedocView):
    """Redoc over :class:`SchemaView`, from the site's static files (works offline)."""

    schema = AutoSchema()
    url_name = "ragchat_api:schema"
    title = "django-ragchat API"
    template_name = "django_ragchat/api/redoc.html"  # without the Google Fonts links

    @staticmethod
    def _redoc_standalone():
        return _sidecar("redoc/bundles/redoc.standalone.js")


urlpatterns += [
    path("schema/", SchemaView.as_view(), name="schema"),
    path("docs/", SwaggerView.as_view(), name="docs"),
    path("redoc/", RedocView.as_view(), name="redoc"),
]

# Whatever the site's REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"] (see django_ragchat.api.schema).
use_spectacular_schemas(*(pattern.callback.cls for pattern in urlpatterns))
