"""What the routers share: the documented error replies, JSON answers in the contract's
shape, and the OpenAPI body of a route that parses its request itself."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from palaestra.sdk.models import ErrorResponse

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 403, 404, 409, 422, 429, 503)
}

REF_TEMPLATE = "#/components/schemas/{model}"


def json_reply(model: BaseModel, status: int = 200) -> Response:
    """`model` serialized once (`model_dump_json`), as the hot routes answer."""
    return Response(
        content=model.model_dump_json(), media_type="application/json", status_code=status
    )


def error_reply(
    status: int,
    code: str,
    message: str,
    retryable: bool = False,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """`{"error": {"code", "message", "retryable"}}` (DESIGN §3)."""
    body = {"error": {"code": code, "message": message, "retryable": retryable}}
    return JSONResponse(body, status_code=status, headers=headers)


def body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """An OpenAPI requestBody for a route that parses `model` itself (its `$defs` go to
    the components: the app's `_complete_openapi`)."""
    schema = model.model_json_schema(ref_template=REF_TEMPLATE)
    schema.pop("$defs", None)
    content = {"application/json": {"schema": schema}}
    return {"requestBody": {"required": True, "content": content}}
