"""Typed exceptions for the error JSON of the wire API (DESIGN §3).

The server raises these too, so the HTTP and in-process clients fail the same way.
"""

from __future__ import annotations

from typing import Any, ClassVar


class PalaestraError(Exception):
    """Base: `code` is machine-readable, `message` says what to fix."""

    status: ClassVar[int] = 500
    default_code: ClassVar[str] = "internal"
    retryable_default: ClassVar[bool] = False

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        retryable: bool | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.retryable = self.retryable_default if retryable is None else retryable
        self.retry_after = retry_after

    def to_json(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "retryable": self.retryable}}


class BadRequestError(PalaestraError):
    status = 400
    default_code = "bad_request"


class AuthenticationError(PalaestraError):
    status = 401
    default_code = "unauthenticated"


class PermissionDeniedError(PalaestraError):
    status = 403
    default_code = "forbidden"


class NotFoundError(PalaestraError):
    status = 404
    default_code = "not_found"


class ConflictError(PalaestraError):
    """The episode has already ended (or another state conflict)."""

    status = 409
    default_code = "episode_ended"


class InvalidActionError(PalaestraError):
    """The action or request is malformed; the episode goes on."""

    status = 422
    default_code = "invalid_action"


class TooLargeError(PalaestraError):
    """The request (body, archive, batch) is over a limit of the server; send less."""

    status = 413
    default_code = "too_large"


class CapacityError(PalaestraError):
    status = 429
    default_code = "capacity"
    retryable_default = True


class ServerError(PalaestraError):
    status = 500
    default_code = "internal"


class UnavailableError(PalaestraError):
    status = 503
    default_code = "unavailable"
    retryable_default = True


class TransportError(PalaestraError):
    """The server could not be reached (connection refused, reset, timed out)."""

    status = 0
    default_code = "transport"
    retryable_default = True


_BY_STATUS: dict[int, type[PalaestraError]] = {
    cls.status: cls
    for cls in (
        BadRequestError,
        AuthenticationError,
        PermissionDeniedError,
        NotFoundError,
        ConflictError,
        InvalidActionError,
        TooLargeError,
        CapacityError,
        ServerError,
        UnavailableError,
    )
}


def error_from_response(status: int, body: Any, retry_after: str | None = None) -> PalaestraError:
    """Build the typed exception for an HTTP error response."""
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        message = str(err.get("message", ""))
        code = str(err.get("code", "")) or None
        retryable = err.get("retryable")
    else:
        message, code, retryable = f"HTTP {status}: {str(body)[:500]}", None, None
    cls = _BY_STATUS.get(status) or (ServerError if status >= 500 else BadRequestError)
    after: float | None = None
    if retry_after:
        try:
            after = float(retry_after)
        except ValueError:
            after = None
    return cls(
        message,
        code=code,
        retryable=retryable if isinstance(retryable, bool) else None,
        retry_after=after,
    )
