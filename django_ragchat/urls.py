"""The chat page and the server-sent events endpoint. A site mounts them where it likes::

    path("chat/", include("django_ragchat.urls")),

The page also needs the REST API (``django_ragchat.api.urls``) and, under ASGI, may use the
websocket routes of ``django_ragchat.transport.routing``.
"""

from django.urls import path

from django_ragchat.transport import sse, views

app_name = "ragchat"

urlpatterns = [
    path("", views.chat_page, name="chat"),
    # Sign-in and sign-out for any user of the site (LOGIN_URL = "ragchat:login", README).
    path("login/", views.SignInView.as_view(), name="login"),
    path("logout/", views.SignOutView.as_view(), name="logout"),
    # Ids are matched as strings so a malformed one answers the same JSON 404 as an unknown one.
    path("conversations/<str:conversation_id>/stream/", sse.stream_view, name="stream"),
    # A new conversation: created only once its first message is accepted (id in the ack).
    path("stream/", sse.stream_view, name="stream-new"),
]
