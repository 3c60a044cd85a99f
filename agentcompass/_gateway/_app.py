"""The gateway's ASGI app: check the token, forward the call unchanged, record it.

Routes (any prefix, so ``base_url`` may or may not end in ``/v1``): the
model's API route (``POST .../chat/completions``, ``.../responses``,
``.../messages`` or ``.../models/NAME:generateContent`` and
``:streamGenerateContent``, see ``_apis``) is forwarded to the model's endpoint with
the body exactly as the agent sent it (unknown fields kept; but a
streamed chat request under a ``tokens`` or ``cost_usd`` budget is given
``stream_options.include_usage``, without which its tokens are unknown; a streamed
request is relayed event by event as the upstream sends them), its query
string (Claude Code's ``?beta=true``) and the API's own request headers
(``anthropic-version``, ``anthropic-beta``; ``openai-beta``), and the
upstream's status, body, ``Content-Type`` and ``Retry-After`` come back
as sent but for the redaction every relayed byte passes, of any status,
streamed or not (``_redactor``: the run's secrets and the real key, should
the upstream echo its request's headers, never reach the session);
``GET .../models`` lists the one model; ``HEAD`` of any path
(Claude Code's connectivity probe) is 200 with no body and is not recorded.
The token is accepted as ``Authorization: Bearer`` or ``x-api-key`` (for
Gemini also ``x-goog-api-key`` or ``?key=``, which is not forwarded); a
request without it gets 401 and is not recorded. The body is read into one
buffer and streamed from it to the upstream; one over the attempt's
``max_body_bytes`` gets 413 (``_asgi.read_body``) and one nested past
``max_json_depth`` 400 (``_bounds``), neither forwarded, and either adds one WARNING
``gateway_refused`` to the record, once per attempt however many. Upstream
failures are classified as the model client classifies them (``agentcompass._models._client``; an error
event inside a 200 stream is FATAL ``model_server_error`` too) and recorded
on the attempt; the agent sees 502 for a connection failure and 504 for a
timeout, with an error body in its API's shape.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qs

import attrs
import httpx
import trio

from .._asgi import BodyRefused, lifespan, read_body
from .._models import EndpointClient, ModelError
from .._models._budget import Meter
from .._models._chat_wire import with_stream_usage
from .._models._cost import priced
from .._models._wire import Parsed, ReplyError
from ..runtime._cleanup import cleanup_deadline
from ..runtime._results import Issue
from ..runtime._values import GatewaySpec
from ._apis import API_OF
from ._bounds import parse_body
from ._record import GatewayRecord
from ._redactor import StreamRedactor

__all__ = ["MAX_BODY_BYTES", "GatewayApp"]

#: The largest request body accepted from an agent, by default.
MAX_BODY_BYTES = GatewaySpec().max_body_bytes
#: The most of an upstream error body kept to classify it.
_ERROR_BYTES = 64 * 1024
#: The size of the pieces a body is streamed to the upstream in.
_PIECE = 64 * 1024


class GatewayApp:
    """One attempt's app (see the module docstring)."""

    def __init__(
        self,
        client: EndpointClient,
        token: str,
        record: GatewayRecord,
        meter: Meter,
        spec: GatewaySpec | None = None,
    ):
        self.client = client
        self.api = API_OF[client.model.api]
        self.token = token.encode()
        self.record = record
        self.meter = meter
        self.spec = spec or GatewaySpec()
        key = client.model.api_key
        self.secrets = (key.reveal(), token) if key is not None else (token,)
        self.closed = False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if scope["method"] == "HEAD":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
            return
        api = self.api
        if self.closed or not self._authorized(scope):
            await _json(send, 401, api.error("invalid gateway token", "authentication_error"))
            return
        path = scope["path"].rstrip("/")
        if scope["method"] == "GET" and path.endswith("/models"):
            model = {"id": self.client.model.name, "object": "model", "created": 0, "owned_by": "agentcompass"}
            await _json(send, 200, {"object": "list", "data": [model]})
            return
        if scope["method"] != "POST" or not path.endswith(api.route):
            await _json(send, 404, api.error(f"no route {scope['method']} {scope['path']}", "not_found_error"))
            return
        try:
            body = await read_body(receive, self.spec.max_body_bytes)
        except BodyRefused as exc:
            if not exc.left:
                await self._refuse(send, 413, str(exc), "request_too_large")
            return
        parsed, deep = parse_body(body, self.spec.max_json_depth)  # the record's parse
        if deep:
            depth = self.spec.max_json_depth
            await self._refuse(send, 400, f"request body nested deeper than {depth}", "invalid_request_error")
            return
        messages = api.conversation(parsed)
        streamed = isinstance(parsed, dict) and parsed.get("stream") is True
        if streamed and api.route == "/chat/completions" and self.meter.counts_usage():
            body = bytearray(with_stream_usage(parsed, body))
        del parsed  # the record takes what it keeps; the forwarded body is the buffer itself
        try:
            await self._forward(body, messages, streamed, scope, send)
        finally:
            body.clear()  # what still refers to it (a pooled connection's last request) holds no body

    async def _refuse(self, send: Any, status: int, message: str, kind: str) -> None:
        """A body the gateway refuses (413, 400): one WARNING per attempt on the record, then the reply."""
        if not self.closed:
            self.record.add_issue(
                Issue("warning", "run", "gateway_refused", f"the model gateway answered {status}: {message}")
            )
        await _json(send, status, self.api.error(message, kind))

    def _authorized(self, scope: dict[str, Any]) -> bool:
        for name, value in scope["headers"]:
            if name == b"authorization" and value[:7].lower() == b"bearer ":
                return hmac.compare_digest(value[7:].strip(), self.token)
            if name == b"x-api-key" or (name == self.api.key_header and self.api.key_header):
                return hmac.compare_digest(value.strip(), self.token)
        if self.api.key_query and scope.get("query_string"):
            given = parse_qs(scope["query_string"].decode("latin-1")).get(self.api.key_query)
            return given is not None and hmac.compare_digest(given[-1].encode("latin-1"), self.token)
        return False

    async def _forward(
        self, body: bytearray, messages: list[dict[str, Any]], streamed: bool, scope: dict[str, Any], send: Any
    ) -> None:
        record, api = self.record, self.api
        limit = self.meter.admit()
        if limit is not None:
            # Answered here, in the API's own shape; the upstream never sees it.
            record.refused += 1
            message = self.meter.message(limit)
            record.add_issue(Issue("error", "run", "harness_limit_reached", message))
            await _json(send, 429, api.error(message, "harness_limit_reached"))
            return
        record.calls += 1
        record.add_request(messages, len(body))
        messages.clear()  # what the record keeps it copied; the rest goes now
        client = self.client
        assert client.url is not None
        url = client.url
        if api.upstream is not None:
            url, streamed = api.upstream(client, scope["path"].rstrip("/"), scope.get("query_string") or b"")
        elif scope.get("query_string"):
            url = url.copy_with(query=scope["query_string"])
        headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream" if streamed else "application/json",
            "Content-Length": str(len(body)),  # so the streamed body is not sent chunked
        }
        for name, value in scope["headers"]:
            if api.forward and name.lower().startswith(api.forward):
                headers[name.decode("latin-1")] = value.decode("latin-1")
        request = client.http.build_request("POST", url, content=_Pieces(body), headers=headers)
        start = trio.current_time()
        try:
            response = await client.http.send(request, stream=True)
        except httpx.TimeoutException as exc:
            if isinstance(exc, httpx.ConnectTimeout):
                await self._failed(send, 502, client._error("fatal", "model_unreachable", "could not connect"), start)
            else:
                await self._failed(send, 504, client._error("error", "model_timeout", "no reply in time"), start)
            return
        except httpx.TransportError as exc:
            error = client._error("fatal", "model_unreachable", f"connection failed ({type(exc).__name__})")
            await self._failed(send, 502, error, start)
            return
        try:
            await self._relay(response, send, start)
        except httpx.TransportError as exc:
            # The head went out already: the agent sees a cut-off reply.
            error = client._error("fatal", "model_unreachable", f"the reply broke off ({type(exc).__name__})")
            record.add_issue(error.to_issue("run"))
        finally:
            with trio.move_on_at(cleanup_deadline(), shield=True):
                await response.aclose()

    async def _relay(self, response: Any, send: Any, start: float) -> None:
        record, status = self.record, response.status_code
        headers = [
            (name.encode("latin-1"), value.encode("latin-1"))
            for name, value in response.headers.items()
            if name.lower() in ("content-type", "retry-after")
        ]
        streamed = response.headers.get("content-type", "").startswith("text/event-stream")
        # What is parsed for the record: an error body's head, else up to the body limit.
        limit = _ERROR_BYTES if status >= 400 else max(self.spec.max_body_bytes, self.spec.record_reply_bytes)
        kept = bytearray()
        size = 0
        whole = True  # kept holds the whole (redacted) reply
        redactor = StreamRedactor(self.secrets)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        # Decoded: the upstream's Content-Encoding is not relayed, so neither is its encoding.
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            out = redactor.feed(chunk)
            whole = whole and len(kept) + len(out) <= limit
            if len(kept) < limit:
                kept += out[: limit - len(kept)]  # the record reads what the agent read
            if out:
                await send({"type": "http.response.body", "body": out, "more_body": True})
        tail = redactor.end()
        whole = whole and len(kept) + len(tail) <= limit
        if len(kept) < limit:
            kept += tail[: limit - len(kept)]
        # Each reply is recorded before its last byte goes out: once the agent
        # has it, the attempt may end (and this task be cancelled) at any time.
        if status >= 400:
            head = httpx.Response(status, headers=headers, content=bytes(kept))  # decoded: no Content-Encoding
            record.add_issue(self.client._status_error(head).to_issue("run"))
            record.add_reply(None, status, trio.current_time() - start, size)
        elif not whole and not streamed:
            record.add_reply(None, status, trio.current_time() - start, size)  # too large to parse: sizes only
        else:
            self._recorded(self.api.stream if streamed else self.api.reply, bytes(kept), status, start, size)
        del kept
        await send({"type": "http.response.body", "body": tail})

    def _recorded(self, parse: Any, data: bytes, status: int, start: float, size: int) -> None:
        reply: Parsed | None = None
        try:
            reply = parse(data)
            reply = attrs.evolve(reply, usage=priced(reply.usage, self.client.model.pricing))
            self.meter.charge(reply.usage)
        except ReplyError as exc:
            if exc.code == "model_server_error":
                error = self.client._error("fatal", exc.code, exc.detail)
            else:
                detail = f"a reply through the gateway had no usable message ({exc.detail})"
                error = self.client._error("error", exc.code, detail)
            self.record.add_issue(error.to_issue("run"))
        self.record.add_reply(reply, status, trio.current_time() - start, size)

    async def _failed(self, send: Any, status: int, error: ModelError, start: float) -> None:
        self.record.add_issue(error.to_issue("run"))
        self.record.add_reply(None, status, trio.current_time() - start)
        await _json(send, status, self.api.error(error.message, error.code))


async def _json(send: Any, status: int, body: Any) -> None:
    payload = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


@attrs.frozen
class _Pieces:
    """A body for httpx to stream in pieces (each a small copy, the buffer never
    copied whole); iterable again, for the shared client's one stale-connection retry."""

    body: bytearray

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for offset in range(0, len(self.body), _PIECE):
            yield bytes(self.body[offset : offset + _PIECE])
