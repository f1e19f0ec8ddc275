"""The OpenAI-compatible endpoint's URLs. A site mounts them under a prefix ending in ``v1``, so
that an OpenAI client's ``base_url`` is that prefix::

    path("openai/v1/", include("django_ragchat.openai_api.urls")),

    client = openai.OpenAI(base_url="https://example.com/openai/v1", api_key="rck-...")

See docs/openai-endpoint.md.
"""

from django.urls import path, re_path

from django_ragchat.openai_api import views

app_name = "ragchat_openai"

urlpatterns = [
    path("models", views.models, name="models"),
    path("models/<str:model_id>", views.model, name="model"),
    path("chat/completions", views.chat_completions, name="chat-completions"),
    # Anything else: a JSON 404 in OpenAI's shape, which clients can read.
    re_path(r"^(?P<path>.*)$", views.unknown_url, name="unknown"),
]
