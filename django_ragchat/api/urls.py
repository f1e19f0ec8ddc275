"""URLs of the REST API. A site mounts them once::

    path("api/ragchat/", include("django_ragchat.api.urls")),

Ids in paths are matched as strings so that a malformed id answers the same JSON 404 as an
unknown one. ``schema/`` serves the OpenAPI document of these endpoints only, ``docs/`` and
``redoc/`` render it.
"""

from django.urls import include, path
from drf_spectacular.utils import extend_schema
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from django_ragchat.api import views

app_name = "ragchat_api"

urlpatterns = [
    path("conversations/", views.ConversationList.as_view(), name="conversation-list"),
    path("conversations/<str:conversation_id>/", views.ConversationDetail.as_view(), name="conversation-detail"),
    path("conversations/<str:conversation_id>/messages/", views.MessageList.as_view(), name="message-list"),
    path("messages/<str:message_id>/feedback/", views.MessageFeedback.as_view(), name="message-feedback"),
    path("feedback/", views.FeedbackList.as_view(), name="feedback-list"),
    path("memory/", views.MemoryList.as_view(), name="memory-list"),
    path("memory/<str:pk>/", views.MemoryDetail.as_view(), name="memory-detail"),
    path("documents/", views.DocumentList.as_view(), name="document-list"),
    path("documents/tasks/<str:task_id>/", views.DocumentTask.as_view(), name="document-task"),
    path("documents/<str:pk>/", views.DocumentDetail.as_view(), name="document-detail"),
    path("plugins/", views.PluginList.as_view(), name="plugin-list"),
]


class SchemaView(SpectacularAPIView):
    """The OpenAPI document of the endpoints above, wherever the site mounted them."""

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


urlpatterns += [
    path("schema/", SchemaView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="ragchat_api:schema"), name="docs"),
    path("redoc/", SpectacularRedocView.as_view(url_name="ragchat_api:schema"), name="redoc"),
]
