"""Every URL a site needs, under the prefixes the README and docs use, for one include::

    path("", include("django_ragchat.site_urls")),

``chat/``: the chat page, its sign-in and the server-sent events (``django_ragchat.urls``);
``api/ragchat/``: the REST API, its schema and docs (``django_ragchat.api.urls``). A site that
wants other prefixes includes those two modules itself. The OpenAI-compatible endpoint is not
here: it is opt-in (``django_ragchat.openai_api.urls``, docs/openai-endpoint.md).
"""

from django.urls import include, path

urlpatterns = [
    path("chat/", include("django_ragchat.urls")),
    path("api/ragchat/", include("django_ragchat.api.urls")),
]
