"""Websocket routes. A site serving ASGI includes them in its ``asgi.py``::

    from channels.auth import AuthMiddlewareStack
    from channels.routing import ProtocolTypeRouter, URLRouter
    from django.core.asgi import get_asgi_application

    django_asgi_app = get_asgi_application()  # first: it sets Django up

    from django_ragchat.transport.origins import SameOriginValidator
    from django_ragchat.transport.routing import unrouted, websocket_urlpatterns

    application = ProtocolTypeRouter({
        "http": django_asgi_app,
        "websocket": SameOriginValidator(AuthMiddlewareStack(URLRouter([*websocket_urlpatterns, unrouted]))),
    })

``unrouted`` (last: the site's own websocket routes go before it) answers any other path
(``/``, ``ws/ragchat`` without its slash) with ``not_found`` and close code 4404: Channels'
router raises for a path no route takes, and the handshake ends in a 500.

``SameOriginValidator`` (``origins.py``) checks the Origin's scheme, host and port, not only
its host as Channels' ``AllowedHostsOriginValidator`` does.

The chat page looks for the websocket at ``/ws/ragchat/`` and falls back to server-sent
events when there is none (a WSGI site).
"""

from django.urls import path, re_path

from django_ragchat.transport.consumers import ChatConsumer, UnknownPathConsumer

WEBSOCKET_PATH = "ws/ragchat/"

websocket_urlpatterns = [
    path(WEBSOCKET_PATH, ChatConsumer.as_asgi()),
    # <str:>, not <uuid:>: a malformed id reaches the consumer, which answers not_found and closes
    # with 4404 as for an unknown one (an unrouted path is a ValueError in Channels' router: a 500).
    path(f"{WEBSOCKET_PATH}conversations/<str:conversation_id>/", ChatConsumer.as_asgi()),
    re_path(rf"^{WEBSOCKET_PATH}", UnknownPathConsumer.as_asgi()),  # last: any other path of ours
]

#: Any path at all, for the end of the site's websocket routes (``asgi.py`` above).
unrouted = re_path(r"", UnknownPathConsumer.as_asgi())
