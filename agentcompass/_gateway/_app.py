"""The gateway's ASGI app: check the token, forward the call unchanged, record it.

Routes (any prefix, so ``base_url`` may or may not end in ``/v1``): the
model's API route (``POST .../chat/completions``, ``.../responses`` or
``.../messages``, see ``_apis``) is forwarded to the model's endpoint with
the body exactly as the agent sent it (unknown fields kept; but a
streamed chat request under a ``tokens`` or ``cost_usd`` budget is given
``stream_options.include_usage``, without which its tokens are unknown; a streamed
request is relayed event by event as the upstream sends them), its query
string (Claude Code's ``?beta=true``) and the API's own request headers
(``anthropic-version``, ``anthropic-beta``; ``openai-beta``), and the
upstream's status, body, ``Content-Type`` and ``Retry-After`` come back
unchanged (but for the real key, masked in an error body should the
upstream echo its request's headers); ``GET .../models`` lists the one model; ``HEAD`` of any path
(Claude Code's connectivity probe) is 200 with no body and is not recorded.
The token is accepted as ``Authorization: Bearer`` or ``x-api-key``; a
request without it gets 401 and is not recorded; a body over
:data:`MAX_BODY_BYTES` gets 413. Upstream failures are classified as the
model client classifies them (``agentcompass._models._client``; an error
event inside a 200 stream is FATAL ``model_server_error`` too) and recorded
on the attempt; the agent sees 502 for a connection failure and 504 for a
timeout, with an error body in its API's shape.
"""

from __future__ import annotations

import hmac
import json
from typing import Any

import attrs
import trio

from .._asgi import lifespan
from .._models import EndpointClient, ModelError
from .._models._budget import Meter
from .._models._cost import priced
from .._models._wire import Parsed, ReplyError
from .._redact import MASK
from ..runtime._cleanup import cleanup_deadline
from ..runtime._results import Issue
from ._apis import API_OF
from ._record import GatewayRecord

__all__ = ["MAX_BODY_BYTES", "GatewayApp"]

#: The largest request body accepted from an agent.
MAX_BODY_BYTES = 32 * 1024 * 1024
#: How much of a streamed reply is kept to record it (the relay is not limited).
_RECORD_BYTES = 16 * 1024 * 1024


class GatewayApp:
    """One attempt's app (see the module docstring)."""

    def __init__(self, client: EndpointClient, token: str, record: GatewayRecord, meter: Meter):
        self.client = client
        self.api = API_OF[client.model.api]
        self.token = token.encode()
        self.record = record
        self.meter = meter
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
        body = await _read_body(receive)
        if body is None:
            await _json(send, 413, api.error(f"request body over {MAX_BODY_BYTES} bytes", "request_too_large"))
            return
        await self._forward(body, scope, send)

    def _authorized(self, scope: dict[str, Any]) -> bool:
        for name, value in scope["headers"]:
            if name == b"authorization" and value[:7].lower() == b"bearer ":
                return hmac.compare_digest(value[7:].strip(), self.token)
            if name == b"x-api-key":
                return hmac.compare_digest(value.strip(), self.token)
        return False

    async def _forward(self, body: bytes, scope: dict[str, Any], send: Any) -> None:
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
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
        record.add_request(api.conversation(parsed))
        streamed = isinstance(parsed, dict) and parsed.get("stream") is True
        if streamed and api.route == "/chat/completions" and self.meter.counts_usage():
            body = _with_stream_usage(parsed, body)
        import httpx  # the shared client's: loaded already

        client = self.client
        assert client.url is not None
        url = client.url
        if scope.get("query_string"):
            url = url.copy_with(query=scope["query_string"])
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream" if streamed else "application/json"}
        for name, value in scope["headers"]:
            if api.forward and name.lower().startswith(api.forward):
                headers[name.decode("latin-1")] = value.decode("latin-1")
        request = client.http.build_request("POST", url, content=body, headers=headers)
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
        record = self.record
        headers = [
            (name.encode("latin-1"), value.encode("latin-1"))
            for name, value in response.headers.items()
            if name.lower() in ("content-type", "retry-after")
        ]
        if response.status_code >= 400:
            data = await response.aread()
            record.add_issue(self.client._status_error(response).to_issue("run"))
            record.add_reply(None, response.status_code, trio.current_time() - start)
            key = self.client.model.api_key
            if key is not None and len(key.reveal()) >= 4:
                # An upstream that echoes its request's headers would hand the session the real key.
                data = data.replace(key.reveal().encode(), MASK.encode())
            await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
            await send({"type": "http.response.body", "body": data})
            return
        await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
        # Each reply is recorded before its last byte goes out: once the agent
        # has it, the attempt may end (and this task be cancelled) at any time.
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            kept = bytearray()
            # Decoded: the upstream's Content-Encoding is not relayed, so neither is its encoding.
            async for chunk in response.aiter_bytes():
                if len(kept) < _RECORD_BYTES:
                    kept += chunk
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            self._recorded(self.api.stream, bytes(kept), response.status_code, start)
            await send({"type": "http.response.body", "body": b""})
        else:
            data = await response.aread()
            self._recorded(self.api.reply, data, response.status_code, start)
            await send({"type": "http.response.body", "body": data})

    def _recorded(self, parse: Any, data: bytes, status: int, start: float) -> None:
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
        self.record.add_reply(reply, status, trio.current_time() - start)

    async def _failed(self, send: Any, status: int, error: ModelError, start: float) -> None:
        self.record.add_issue(error.to_issue("run"))
        self.record.add_reply(None, status, trio.current_time() - start)
        await _json(send, status, self.api.error(error.message, error.code))


def _with_stream_usage(parsed: dict[str, Any], body: bytes) -> bytes:
    """A streamed chat request that asks for its usage: without it a token or
    cost budget could not count the call (the one field the gateway adds)."""
    options = parsed.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return body
    options = dict(options) if isinstance(options, dict) else {}
    return json.dumps({**parsed, "stream_options": {**options, "include_usage": True}}).encode()


async def _json(send: Any, status: int, body: Any) -> None:
    payload = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


async def _read_body(receive: Any) -> bytes | None:
    """The request's body; None when it is over the limit (or the client left)."""
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        body += message.get("body", b"")
        if len(body) > MAX_BODY_BYTES:
            return None
        if not message.get("more_body"):
            return bytes(body)
