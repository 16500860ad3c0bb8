"""What /openapi.json declares, so that it matches what the server answers (schemathesis
checks responses against it): every route's errors in OpenAI's shape with the statuses it can
return (FastAPI's default 422 is never sent: validation errors are 400), /health's empty body
and 503, /metrics as text/plain.
"""

from __future__ import annotations

from fastapi import FastAPI

from pagedllm.entrypoints.protocol import ErrorResponse

_ERROR = {"model": ErrorResponse}
_ALWAYS = {400: {**_ERROR, "description": "invalid request (Host, parameters)"},
           503: {**_ERROR, "description": "shutting down, engine dead or connection cap"}}
POST_ERRORS = {**_ALWAYS,
               401: {**_ERROR, "description": "missing or wrong API key"},
               404: {**_ERROR, "description": "unknown model"},
               408: {**_ERROR, "description": "request body not complete in time"},
               413: {**_ERROR, "description": "request body too large"},
               415: {**_ERROR, "description": "Content-Type is not application/json"},
               429: {**_ERROR, "description": "queue full; retry after Retry-After seconds"},
               500: {**_ERROR, "description": "engine error in this request"}}
GET_ERRORS = {**_ALWAYS, 401: {**_ERROR, "description": "missing or wrong API key"}}
HEALTH = {200: {"description": "healthy (empty body)", "content": {}},
          **_ALWAYS}
METRICS = {200: {"description": "Prometheus text exposition",
                 "content": {"text/plain": {"schema": {"type": "string"}}}}}


def without_422(app: FastAPI) -> None:
    """Drop the 422 FastAPI declares on every route with a body (this server answers 400)."""
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = build()
            for path in schema.get("paths", {}).values():
                for op in path.values():
                    op.get("responses", {}).pop("422", None)
            for name in ("HTTPValidationError", "ValidationError"):
                schema.get("components", {}).get("schemas", {}).pop(name, None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi
