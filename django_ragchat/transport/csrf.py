"""Django's CSRF check, for the HTTP endpoints that answer its failure in their own shape
(JSON with the code ``csrf_failed``) instead of the site's CSRF failure page: the server-sent
events view, the OpenAI-compatible endpoint (session callers) and the REST API (anonymous
session callers, whom DRF's ``SessionAuthentication`` does not check).

Such a view is ``csrf_exempt`` (the middleware then leaves it alone) and calls ``failure``
itself: the same check ``CsrfViewMiddleware`` makes, with the site's settings
(``CSRF_TRUSTED_ORIGINS``, ``CSRF_USE_SESSIONS``, ``CSRF_HEADER_NAME``...), and the test client's
``enforce_csrf_checks=False`` still honoured.
"""

from __future__ import annotations

from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.http import RawPostDataException
from django.http.multipartparser import MultiPartParserError
from django.middleware.csrf import CsrfViewMiddleware

#: The code of the refusal, alike on every endpoint.
CODE = "csrf_failed"


class _Check(CsrfViewMiddleware):
    """The middleware's check, giving the reason instead of the 403 page."""

    def _reject(self, request, reason):
        return reason


def failure(request) -> str | None:
    """Why Django's CSRF check refuses ``request`` (``"CSRF token missing."``...), or ``None``
    when it passes (always for ``GET``, ``HEAD``, ``OPTIONS`` and ``TRACE``).

    No database work once the session is loaded (``CSRF_USE_SESSIONS`` reads it): an async view
    calls it after ``await request.auser()``."""
    check = _Check(lambda request: None)
    check.process_request(request)
    # The check reads a form's token from ``request.POST``: parsed from the stream, that would
    # leave the view's ``request.body`` unreadable (a multipart body was a 500). Read from the
    # body instead, which the view reads anyway; none of these endpoints takes a form, so a
    # form it cannot parse carries no token, and the view refuses its media type (415).
    try:
        _ = request.body  # buffered: request.POST is parsed from it
    except (RequestDataTooBig, RawPostDataException):
        pass  # too large: the view refuses it (413); already read: POST is parsed from it
    try:
        return check.process_view(request, None, (), {})
    except (MultiPartParserError, RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent):
        # A form it cannot read carries no token it can read: the header alone decides.
        request._mark_post_parse_error()  # request.POST is empty from now on, as Django leaves it
        return check.process_view(request, None, (), {})


def message(reason: str, advice: str = "") -> str:
    """The refusal's message, safe to show; ``advice`` is added as a last clause."""
    return (f"CSRF check failed ({reason}): a request authenticated by the session must carry the "
            f"X-CSRFToken header{advice}.")
