"""ASGI entry point of the demo site: HTTP (page, API, server-sent events) and websockets.

    daphne example_project.asgi:application
    uvicorn example_project.asgi:application

Set REDIS_URL to share websocket events between several worker processes (settings.py).
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
django_asgi_app = get_asgi_application()  # first: it sets Django up before the imports below

# Imported once Django is set up (they load models and settings).
from channels.auth import AuthMiddlewareStack
from channels.routing import ProtocolTypeRouter, URLRouter

from django_ragchat.transport.origins import SameOriginValidator
from django_ragchat.transport.routing import unrouted, websocket_urlpatterns

application = ProtocolTypeRouter({
    "http": django_asgi_app,
    "websocket": SameOriginValidator(AuthMiddlewareStack(URLRouter([*websocket_urlpatterns, unrouted]))),
})
