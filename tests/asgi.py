"""The ASGI application of the test suite (and of the server processes tests start): Django
for HTTP, the chat consumer for websockets, as a site would set it up (docs/deployment.md)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
django_asgi_app = get_asgi_application()

# Imported once Django is set up (they load models and settings).
from channels.auth import AuthMiddlewareStack
from channels.routing import ProtocolTypeRouter, URLRouter
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

from django_ragchat.transport.origins import SameOriginValidator
from django_ragchat.transport.routing import unrouted, websocket_urlpatterns

application = ProtocolTypeRouter({
    # The page's script and styles are served from the app, as runserver would (the servers
    # tests start run with DEBUG off).
    "http": ASGIStaticFilesHandler(django_asgi_app),
    "websocket": SameOriginValidator(AuthMiddlewareStack(URLRouter([*websocket_urlpatterns, unrouted]))),
})
