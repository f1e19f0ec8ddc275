"""The errors django-ragchat reports to users, with one shape.

Every error a user can cause or meet (an invalid message, a turn already running, a model that
failed, a request over a limit) is a ``RagchatError``: ``code`` is short and stable (clients
branch on it; it is the ``code`` of the protocol's ``error`` event and of the API's error
body), ``message`` is safe to show to the user (the detail goes to the log), and
``retry_after`` (seconds) is set when waiting will help. ``http_status`` is what an HTTP
transport answers with.

This module imports nothing from the package, so any module may import it.
"""

from __future__ import annotations


class RagchatError(Exception):
    """Base class: a stable ``code``, a user-safe ``message``, an optional ``retry_after``."""

    code: str = "internal_error"
    http_status: int = 500
    default_message: str = "The assistant failed to answer; the error has been logged."

    def __init__(self, message: str | None = None, *, code: str | None = None,
                 retry_after: float | None = None, http_status: int | None = None):
        self.message = message if message is not None else self.default_message
        if code is not None:
            self.code = code
        if http_status is not None:
            self.http_status = http_status
        self.retry_after = retry_after
        super().__init__(self.message)

    @property
    def user_message(self) -> str:
        """The text to show the user (same as ``message``)."""
        return self.message

    def as_dict(self) -> dict:
        """``{"code", "message"[, "retry_after"]}``: the JSON form clients receive."""
        data = {"code": self.code, "message": self.message}
        if self.retry_after is not None:
            data["retry_after"] = self.retry_after
        return data


class InvalidMessage(RagchatError, ValueError):
    """The user's text cannot be accepted; nothing was saved."""

    http_status = 400

    def __init__(self, code: str, message: str):
        super().__init__(message, code=code, http_status=413 if code == "too_long" else 400)


class TurnInProgress(RagchatError):
    """The conversation already has an answer streaming; one turn at a time."""

    code = "turn_in_progress"
    http_status = 409
    default_message = "An answer is still being written in this conversation; wait for it to finish or cancel it."
    #: Seconds to wait before sending again: the answer ends when it ends, usually soon (as for
    #: ``too_many_streams``: a refusal costs nothing, so a short poll is cheap).
    RETRY_AFTER = 1.0

    def __init__(self, message: str | None = None, **kwargs):
        kwargs.setdefault("retry_after", self.RETRY_AFTER)
        super().__init__(message, **kwargs)


class ProfileUnavailable(RagchatError):
    """The conversation's profile cannot be built (a component no plugin registers, a plugin
    that failed to import: ``manage.py check`` says which, as ``ragchat.E002``/``E004``); the
    message is refused before anything is saved, the detail is in the log."""

    code = "profile_unavailable"
    http_status = 500
    default_message = "This assistant is not set up correctly, so it cannot answer; the error has been logged."


class SettingsInvalid(RagchatError):
    """A ``RAGCHAT`` setting every turn reads has a value of the wrong type or range
    (``manage.py check`` names it, ``ragchat.E007``, but a running server runs no checks): the
    message is refused before anything is saved, on every transport alike, the detail is in the
    log. Refused rather than run with a guess: a limit the site mistyped is not a limit to drop."""

    code = "settings_invalid"
    http_status = 500
    default_message = "The chat is not set up correctly, so it cannot answer; the error has been logged."


class LLMError(RagchatError):
    """A model call failed in a way the user should hear about.

    ``code`` is short and stable (``rate_limited``, ``timeout``, ``model_unavailable``,
    ``bad_response``, ``stream_interrupted``); ``message`` (also ``user_message``) is safe to
    show. The detail goes to the log, not to the user.
    """

    http_status = 502

    def __init__(self, code: str, user_message: str, *, retry_after: float | None = None):
        super().__init__(user_message, code=code, retry_after=retry_after)

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"
