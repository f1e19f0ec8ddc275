"""The ASGI application of the test suite (and of the server processes tests start): Django
for HTTP, the chat consumer for websockets, as a site would set it up (docs/deployment.md)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (after Django is set up)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from django_ragchat.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter({
    # The page's script and styles are served from the app, as runserver would (the servers
    # tests start run with DEBUG off).
    "http": ASGIStaticFilesHandler(django_asgi_app),
    "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
})
