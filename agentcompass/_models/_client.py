"""What every API's client shares: one call, classified.

:class:`EndpointClient` binds a :class:`~agentcompass.ModelSpec` (model name
and request ``params``) to the shared ``httpx.AsyncClient`` of its endpoint
(see ``_pool``) and the one URL it posts to; ``_native`` builds the
``openai-chat``, ``openai-responses`` and ``anthropic-messages`` clients on
it (``_gemini`` the ``google-generate-content`` one), and the model gateway
forwards through one. A call posts once and
returns the API's reply, or raises :class:`ModelError` classified as SPEC
section 10 lists it:

=============================== ======== ======================
what happened                   severity code
=============================== ======== ======================
HTTP 401 or 403                 fatal    ``model_auth``
HTTP 402                        fatal    ``model_quota``
HTTP 404                        fatal    ``model_not_found``
HTTP 429                        fatal    ``model_rate_limited`` (``retry_after``)
HTTP 5xx                        fatal    ``model_server_error``
connection failed or dropped    fatal    ``model_unreachable``
connect timeout                 fatal    ``model_unreachable``
read / write / pool timeout     error    ``model_timeout``
other HTTP 4xx (a bad request)  error    ``model_bad_request``
no usable message in the reply  error    ``no_valid_output``
an error event in a stream      fatal    ``model_server_error``
=============================== ======== ======================

A 404 is FATAL: it is a wrong ``base_url`` (a missing ``/v1``) or model
name, so no result of the run measures the agent. Another 4xx (400, 422)
is an ERROR: the usual cause is the agent's own conversation (a context that
outgrew the model), which is a result about the agent. The client never
retries a call on its own (its endpoint's transport resends only a request
that met a stale keep-alive connection, see ``_http``): a FATAL failure is
retried by the runtime (a whole attempt), so the retry budget, backoff and
records stay in one place.

Messages are one line, name the model and endpoint, and carry at most 500
characters of the server's error body with the API key and anything shaped
like a credential masked: a server that echoes the request's headers into
its error body leaks nothing.
"""

from __future__ import annotations

import email.utils
import json
import math
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from .._redact import redact
from ..runtime._errors import IssueError
from ..runtime._results import Issue, Phase, Severity
from ..runtime._values import ModelSpec
from ._budget import current_meter

if TYPE_CHECKING:
    import httpx

__all__ = ["EndpointClient", "ModelError", "ToolCall"]

_BODY_CHARS = 500


class ModelError(IssueError):
    """A classified failure of one model call (see the module's table).

    ``retry_after`` is the delay in seconds a 429 reply asked for (its
    ``Retry-After`` header), else ``None``; the runtime raises the retry's
    backoff to it, within ``retry_max_delay_seconds``.
    """

    def __init__(self, severity: Severity, code: str, message: str, retry_after: float | None = None):
        super().__init__(severity, code, message)
        self.retry_after = retry_after

    def to_issue(self, phase: Phase) -> Issue:
        """The Issue of this failure in ``phase`` (a harness returns it with its partial result)."""
        issue = super().to_issue(phase)
        return attrs.evolve(issue, retry_after_seconds=self.retry_after) if self.retry_after is not None else issue


@attrs.frozen
class ToolCall:
    """One tool call of an assistant message; ``arguments`` is the JSON text as sent."""

    id: str
    name: str
    arguments: str


@attrs.define(eq=False)
class EndpointClient:
    """What every API's client shares: the ModelSpec, its endpoint's shared
    ``httpx.AsyncClient``, the one URL it posts to, and the classification of
    failures (the module's table). The model gateway forwards through one."""

    model: ModelSpec
    http: httpx.AsyncClient
    #: ``{base_url}{path}``, parsed once per endpoint.
    url: httpx.URL | None = None
    #: The API's route under ``base_url``.
    path: ClassVar[str] = "/chat/completions"

    def __attrs_post_init__(self) -> None:
        if self.url is None:
            import httpx

            self.url = httpx.URL((self.model.base_url or "").rstrip("/") + self.path)

    @property
    def where(self) -> str:
        return f"model {self.model.name!r} at {self.model.base_url}"

    def _body(self, body: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
        """``body`` with the ModelSpec's ``params``, then the call's, on top."""
        body.update(self.model.params)
        body.update(params)
        return body

    async def _exchange(
        self,
        body: dict[str, Any],
        stream: bool,
        read: Callable[[httpx.Response], Any],
        read_stream: Callable[[httpx.Response], Awaitable[Any]],
        url: httpx.URL | None = None,
    ) -> Any:
        """Post ``body`` once (to ``url``, else the client's own); ``read`` a
        complete reply, ``read_stream`` an event stream (when ``stream`` and
        the server streams). Every failure is raised as a classified
        :class:`ModelError`; a call past the run's budgets (``_budget``) is
        ERROR ``harness_limit_reached`` and is never posted."""
        meter = current_meter()
        if meter is not None:
            limit = meter.admit()
            if limit is not None:
                raise ModelError("error", "harness_limit_reached", meter.message(limit))
        reply = await self._post(body, stream, read, read_stream, url)
        if meter is not None:
            meter.charge(reply.usage)
        return reply

    async def _post(
        self,
        body: dict[str, Any],
        stream: bool,
        read: Callable[[httpx.Response], Any],
        read_stream: Callable[[httpx.Response], Awaitable[Any]],
        url: httpx.URL | None = None,
    ) -> Any:
        import httpx  # loaded by the pool already; imported here so the contracts load without it

        # As httpx's ``json=`` encodes it, with one encoder for every call.
        assert self.url is not None
        request = self.http.build_request(
            "POST", url or self.url, content=_JSON.encode(body).encode(), headers=_HEADERS
        )
        try:
            response = await self.http.send(request, stream=True)
            try:
                if response.status_code >= 400:
                    await response.aread()
                    raise self._status_error(response)
                if stream and response.headers.get("content-type", "").startswith("text/event-stream"):
                    return await read_stream(response)
                await response.aread()
                return read(response)
            finally:
                await response.aclose()
        except httpx.TimeoutException as exc:
            if isinstance(exc, httpx.ConnectTimeout):
                raise self._error("fatal", "model_unreachable", f"could not connect ({_name(exc)})") from None
            raise self._error(
                "error", "model_timeout", f"no reply within {self._timeout_text()} ({_name(exc)})"
            ) from None
        except httpx.TransportError as exc:
            raise self._error("fatal", "model_unreachable", f"connection failed ({_cause(exc)})") from None
        except httpx.DecodingError:
            raise self._error("error", "no_valid_output", "the reply's body could not be decoded") from None

    def _timeout_text(self) -> str:
        timeout = self.model.timeout_seconds
        return "the timeout" if timeout is None else f"{timeout:g}s"

    def _error(self, severity: Severity, code: str, detail: str, retry_after: float | None = None) -> ModelError:
        secrets = [self.model.api_key] if self.model.api_key else []
        message = redact(f"{self.where}: {detail}", secrets).replace("\n", " ")
        return ModelError(severity, code, message, retry_after)

    def _status_error(self, response: httpx.Response) -> ModelError:
        status = response.status_code
        detail = f"HTTP {status}"
        text = response.text.strip()
        if text:
            detail += f": {' '.join(text.split())[:_BODY_CHARS]}"
        if status in (401, 403):
            return self._error("fatal", "model_auth", detail)
        if status == 402:
            return self._error("fatal", "model_quota", detail)
        if status == 404:
            return self._error("fatal", "model_not_found", f"{detail} (is base_url or the model name wrong?)")
        if status == 429:
            return self._error("fatal", "model_rate_limited", detail, retry_after(response.headers.get("retry-after")))
        if status >= 500:  # Anthropic's 529 "overloaded" among them
            return self._error("fatal", "model_server_error", detail)
        return self._error("error", "model_bad_request", detail)


_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_HEADERS = {"Content-Type": "application/json"}


def retry_after(value: str | None) -> float | None:
    """Seconds asked for by a ``Retry-After`` header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - time.time()
    return max(0.0, seconds) if math.isfinite(seconds) else None


def _name(exc: BaseException) -> str:
    return type(exc).__name__


def _cause(exc: BaseException) -> str:
    """``Name: message`` of ``exc``, or of the first exception under it that
    says something (httpx's ``ConnectError`` over a TLS failure has no text
    of its own; the ``SSLCertVerificationError`` it came from does)."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            break
        if str(seen):
            return f"{_name(exc)}: {_name(seen) + ': ' if seen is not exc else ''}{seen}"
        seen = seen.__cause__ or seen.__context__
    return _name(exc)
