"""The websocket Origin check: a page may open the chat socket only from the site's own origin.

Browsers send websockets cookies whatever page opens them, so the Origin header is what stops
another site from talking as the visitor (cross-site websocket hijacking). Channels'
``AllowedHostsOriginValidator`` compares the Origin's host with ``ALLOWED_HOSTS`` only: a page
served over plain HTTP, or from another port of the same host, passes. ``SameOriginValidator``
compares scheme, host and port:

* with the socket's own origin: the ``Host`` header and the scheme the connection arrived with
  (``wss`` is ``https``; behind a TLS-terminating proxy, ``SECURE_PROXY_SSL_HEADER`` as Django
  reads it), the host being one of ``ALLOWED_HOSTS``;
* or with an entry of ``CSRF_TRUSTED_ORIGINS`` (``https://chat.example.com``,
  ``https://*.example.com``), the setting Django's CSRF check trusts for the same purpose.

A missing or malformed Origin is refused, as Channels does. Use it in ``asgi.py`` in place of
``AllowedHostsOriginValidator`` (docs/deployment.md)::

    "websocket": SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
"""

from __future__ import annotations

from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host

DEFAULT_PORTS = {"http": 80, "https": 443}

Origin = tuple[str, str, int]  # scheme, host (lower case, IPv6 without brackets), port


def parse_origin(value: str) -> Origin | None:
    """``(scheme, host, port)`` of an origin such as ``https://example.com:8443``; ``None`` when
    it is not an http(s) origin."""
    try:
        parts = urlsplit(value.strip())
        scheme, host, port = parts.scheme.lower(), parts.hostname, parts.port
    except ValueError:
        return None
    if scheme not in DEFAULT_PORTS or not host or parts.path not in ("", "/") or parts.username or parts.query:
        return None
    return scheme, host.lower(), port or DEFAULT_PORTS[scheme]


def _headers(scope) -> dict[bytes, str]:
    return {name.lower(): value.decode("latin1") for name, value in scope.get("headers", [])}


def socket_origin(scope) -> Origin | None:
    """The origin the socket itself was opened at, if its host is one of ``ALLOWED_HOSTS``."""
    headers = _headers(scope)
    host = headers.get(b"host", "")
    scheme = "https" if scope.get("scheme") in ("wss", "https") else "http"
    proxy_header = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if proxy_header:
        name, secure_value = proxy_header
        name = name.removeprefix("HTTP_").replace("_", "-").lower().encode()
        if headers.get(name, "").split(",")[0].strip() == secure_value:
            scheme = "https"
    domain, _ = split_domain_port(host)
    allowed = list(settings.ALLOWED_HOSTS)
    if settings.DEBUG and not allowed:  # Django's own default under DEBUG
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    if not domain or not validate_host(domain, allowed):
        return None
    return parse_origin(f"{scheme}://{host}")


def _trusted(origin: Origin) -> bool:
    scheme, host, port = origin
    for entry in getattr(settings, "CSRF_TRUSTED_ORIGINS", ()):
        wildcard = "://*." in entry
        trusted = parse_origin(entry.replace("://*.", "://", 1))
        if trusted is None or trusted[0] != scheme or trusted[2] != port:
            continue
        if host == trusted[1] or (wildcard and host.endswith("." + trusted[1])):
            return True
    return False


def origin_allowed(scope) -> bool:
    """Whether the websocket handshake in ``scope`` comes from an allowed origin."""
    value = _headers(scope).get(b"origin")
    origin = parse_origin(value) if value else None
    if origin is None:
        return False
    return origin == socket_origin(scope) or _trusted(origin)


class SameOriginValidator:
    """ASGI middleware: refuses (403 at the handshake) websockets whose Origin is not the
    site's own (scheme, host and port) or one of ``CSRF_TRUSTED_ORIGINS``."""

    def __init__(self, application):
        self.application = application

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket" and not origin_allowed(scope):
            return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)
