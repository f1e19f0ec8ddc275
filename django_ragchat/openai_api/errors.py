"""Errors in the OpenAI API's shape: ``{"error": {"message", "type", "param", "code"}}``.

``code`` is django-ragchat's stable code for the cause (the one every other transport sends:
``rate_limited``, ``not_found``, ``empty``...), or OpenAI's where the cause exists only here
(``invalid_api_key``, ``model_not_found``, ``missing_required_parameter``). ``type`` and the HTTP
status follow OpenAI: the ``openai`` client raises ``AuthenticationError`` for 401,
``NotFoundError`` for 404, ``BadRequestError`` for 400, ``RateLimitError`` for 429.
"""

from __future__ import annotations

import math
from typing import Any

from django.http import JsonResponse

from django_ragchat.transport.turns import TurnRefused

#: The status a failure after the turn started (an ``error`` event) is answered with, by code;
#: anything else is 500. The model's own rate limit is 503, not 429: 429 means the user's limits.
FAILED_STATUS = {
    "rate_limited": 503,
    "model_unavailable": 502,
    "bad_response": 502,
    "stream_interrupted": 502,
    "timeout": 504,
    "server_shutdown": 503,
    "conversation_deleted": 410,
}
#: Refusals whose HTTP status differs here from the other HTTP transports': OpenAI answers 400
#: for a message that is too long (its ``context_length_exceeded``), not 413.
REFUSAL_STATUS = {"too_long": 400}


def error_type(status: int) -> str:
    """OpenAI's ``type`` for an HTTP status."""
    if status == 429:
        return "requests"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


class OpenAIError(Exception):
    """An error answered in OpenAI's shape; ``retry_after`` (seconds) adds ``Retry-After``."""

    def __init__(self, status: int, code: str | None, message: str, *, param: str | None = None,
                 retry_after: float | None = None, extra: dict[str, Any] | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.param = param
        self.retry_after = retry_after
        self.extra = extra or {}

    @classmethod
    def from_refusal(cls, refusal: TurnRefused, param: str | None = None) -> OpenAIError:
        """The answer to a request the turn refused before it started (nothing saved)."""
        status = REFUSAL_STATUS.get(refusal.code, refusal.http_status)
        return cls(status, refusal.code, refusal.message, param=param, retry_after=refusal.retry_after)

    @classmethod
    def from_failed(cls, code: str, message: str, retry_after: float | None, conversation_id: str | None
                    ) -> OpenAIError:
        """The answer to a turn that failed after it started (its partial answer is saved)."""
        extra = {"conversation": conversation_id} if conversation_id else {}
        return cls(FAILED_STATUS.get(code, 500), code, message, retry_after=retry_after, extra=extra)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": error_type(self.status), "param": self.param,
                          "code": self.code, **self.extra}}

    def headers(self) -> dict[str, str]:
        if self.retry_after is None:
            return {}
        # The openai client reads retry-after-ms first (fractions of a second), others Retry-After.
        return {"Retry-After": str(max(1, math.ceil(self.retry_after))),
                "retry-after-ms": str(max(1, math.ceil(self.retry_after * 1000)))}

    def response(self, headers: dict[str, str] | None = None) -> JsonResponse:
        return JsonResponse(self.body(), status=self.status, headers={**self.headers(), **(headers or {})})


def bad_request(message: str, *, param: str | None = None, code: str = "invalid_value") -> OpenAIError:
    return OpenAIError(400, code, message, param=param)


def model_not_found(model: str) -> OpenAIError:
    return OpenAIError(404, "model_not_found", f"The model {model!r} does not exist or you do not have access to it.",
                       param="model")
