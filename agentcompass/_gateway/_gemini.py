"""What the gateway does differently for Gemini (``google-generate-content``):
the route names the model and whether the reply streams, the agent's token
may come as ``?key=``, and errors have Google's shape."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlencode

__all__ = ["error", "upstream"]

#: Google's status names of the gateway's own refusals.
_STATUS = {
    "authentication_error": (401, "UNAUTHENTICATED"),
    "not_found_error": (404, "NOT_FOUND"),
    "request_too_large": (413, "INVALID_ARGUMENT"),
    "harness_limit_reached": (429, "RESOURCE_EXHAUSTED"),
    "model_timeout": (504, "DEADLINE_EXCEEDED"),
}


def error(message: str, kind: str) -> dict[str, Any]:
    """A Google API error body (``{"error": {"code", "message", "status"}}``)."""
    code, status = _STATUS.get(kind, (502, "UNAVAILABLE"))
    return {"error": {"code": code, "message": message, "status": status}}


def upstream(client: Any, path: str, query: bytes) -> tuple[Any, bool]:
    """The request model's generate method (streamed when the agent's route
    is ``:streamGenerateContent``), whatever model the agent's path named:
    the gateway serves one model. The agent's query string is kept (``alt=sse``
    decides the stream's format) but for ``key``, its token."""
    streamed = path.endswith(":streamGenerateContent")
    pairs = [(k, v) for k, v in parse_qsl(query.decode("latin-1"), keep_blank_values=True) if k != "key"]
    url = client.stream_url if streamed else client.url
    return url.copy_with(
        raw_path=url.raw_path.split(b"?")[0] + (b"?" + urlencode(pairs).encode() if pairs else b"")
    ), streamed
