"""The ``openai-chat`` client: one chat-completions call, classified.

:class:`ChatClient` binds a :class:`~agentcompass.ModelSpec` (model name and
request ``params``) to the shared ``httpx.AsyncClient`` of its endpoint (see
``_pool``). :meth:`ChatClient.chat` posts ``{base_url}/chat/completions``
once and returns a :class:`ChatReply`, or raises :class:`ModelError`
classified as SPEC section 10 lists it:

=============================== ======== ======================
what happened                   severity code
=============================== ======== ======================
HTTP 401 or 403                 fatal    ``model_auth``
HTTP 402                        fatal    ``model_quota``
HTTP 429                        fatal    ``model_rate_limited`` (``retry_after``)
HTTP 5xx                        fatal    ``model_server_error``
connection failed or dropped    fatal    ``model_unreachable``
read / write / pool timeout     error    ``model_timeout``
other HTTP 4xx (a bad request)  error    ``model_bad_request``
no usable message in the reply  error    ``no_valid_output``
=============================== ======== ======================

Another 4xx (400, 404, 422) is an ERROR, not FATAL: the usual cause is the
agent's own conversation (a context that outgrew the model), which is a
result about the agent. The client never retries on its own: a FATAL
failure is retried by the runtime (a whole attempt), so the retry budget,
backoff and records stay in one place.

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
from typing import TYPE_CHECKING, Any

import attrs

from .._redact import redact
from ..runtime._errors import IssueError
from ..runtime._results import Issue, Phase, Severity
from ..runtime._values import ModelSpec

if TYPE_CHECKING:
    import httpx

__all__ = ["ChatClient", "ChatReply", "ModelError", "ToolCall"]

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


@attrs.frozen
class ChatReply:
    """The assistant message of one chat completion.

    ``message`` is the message as the conversation should continue with it
    (OpenAI format: ``role``, ``content``, ``tool_calls``); ``usage`` holds
    ``prompt_tokens`` and ``completion_tokens`` (0 when the server omits them).
    """

    content: str | None
    tool_calls: tuple[ToolCall, ...]
    usage: dict[str, int]
    finish_reason: str | None
    message: dict[str, Any]


@attrs.define(eq=False)
class ChatClient:
    """Chat completions for one model over its endpoint's shared HTTP client.

    Obtain one with :func:`agentcompass.runtime.chat_client`; never build an
    ``httpx`` client of your own. It holds no connection itself: closing is
    the orchestration's job. Cancelling :meth:`chat` closes the connection
    the call was using (an interrupted HTTP/1.1 exchange cannot be reused).
    """

    model: ModelSpec
    http: httpx.AsyncClient
    #: Parsed once: parsing a URL string is half of httpx's cost of building a request.
    url: httpx.URL
    #: The client's headers (its key's ``Authorization`` among them) plus the JSON
    #: content type, and its timeouts: built once per endpoint, so that a call
    #: builds its body and nothing else (``http.send`` of a prepared request).
    headers: httpx.Headers | None = attrs.field(default=None, repr=False)
    extensions: dict[str, Any] | None = attrs.field(default=None, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.headers is None:
            self.headers, self.extensions = prepared_request_parts(self.http)

    @property
    def where(self) -> str:
        return f"model {self.model.name!r} at {self.model.base_url}"

    async def chat(
        self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None, **params: Any
    ) -> ChatReply:
        """One completion of ``messages``; ``tools`` are OpenAI function tools.

        The request body is ``{"model", "messages", "tools"}`` plus the
        ModelSpec's ``params`` (temperature, max_tokens, ...), then ``params``
        given here. Raises :class:`ModelError`.
        """
        body: dict[str, Any] = {"model": self.model.name, "messages": messages}
        if tools:
            body["tools"] = tools
        body.update(self.model.params)
        body.update(params)
        import httpx  # loaded by the pool already; imported here so the contracts load without it

        # As httpx's ``json=`` encodes it, with one encoder for every call.
        content = _JSON.encode(body).encode()
        request = httpx.Request("POST", self.url, headers=self.headers, content=content, extensions=self.extensions)
        try:
            response = await self.http.send(request)
        except httpx.TimeoutException as exc:
            if isinstance(exc, httpx.ConnectTimeout):
                raise self._error("fatal", "model_unreachable", f"could not connect ({_name(exc)})") from None
            raise self._error(
                "error", "model_timeout", f"no reply within {self._timeout_text()} ({_name(exc)})"
            ) from None
        except httpx.TransportError as exc:
            raise self._error("fatal", "model_unreachable", f"connection failed ({_name(exc)}: {exc})") from None
        except httpx.DecodingError:
            raise self._error("error", "no_valid_output", "the reply's body could not be decoded") from None
        if response.status_code >= 400:
            raise self._status_error(response)
        return self._parse(response)

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
        if status == 429:
            return self._error("fatal", "model_rate_limited", detail, retry_after(response.headers.get("retry-after")))
        if status >= 500:
            return self._error("fatal", "model_server_error", detail)
        return self._error("error", "model_bad_request", detail)

    def _parse(self, response: httpx.Response) -> ChatReply:
        try:
            data = response.json()
        except ValueError:
            raise self._error("error", "no_valid_output", "the reply is not JSON") from None
        choices = data.get("choices") if isinstance(data, dict) else None
        if not choices or not isinstance(choices, list) or not isinstance(choices[0], dict):
            raise self._error("error", "no_valid_output", "the reply has no choices")
        choice = choices[0]
        message = choice.get("message")
        if not isinstance(message, dict):
            raise self._error("error", "no_valid_output", "the reply's first choice has no message")
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            raise self._error("error", "no_valid_output", "the reply's content is not text")
        calls: list[ToolCall] = []
        for raw in message.get("tool_calls") or ():
            function = raw.get("function") if isinstance(raw, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise self._error("error", "no_valid_output", "the reply has a malformed tool call")
            arguments = function.get("arguments")
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments if arguments is not None else {})
            calls.append(ToolCall(str(raw.get("id") or f"call_{len(calls)}"), function["name"], arguments))
        if content is None and not calls:
            raise self._error("error", "no_valid_output", "the reply has neither content nor tool calls")
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        out: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            out["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls
            ]
        return ChatReply(
            content=content,
            tool_calls=tuple(calls),
            usage={
                "prompt_tokens": _count(usage.get("prompt_tokens")),
                "completion_tokens": _count(usage.get("completion_tokens")),
            },
            finish_reason=choice.get("finish_reason"),
            message=out,
        )


def prepared_request_parts(http: httpx.AsyncClient) -> tuple[httpx.Headers, dict[str, Any]]:
    """The headers and extensions ``http.build_request`` would give a JSON POST."""
    import httpx

    headers = httpx.Headers(http.headers)
    headers["Content-Type"] = "application/json"
    return headers, {"timeout": http.timeout.as_dict()}


_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


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


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _name(exc: BaseException) -> str:
    return type(exc).__name__
