"""One shared HTTP client per model endpoint, for one orchestration.

``launch`` opens a :class:`ModelClients` pool for its whole run and closes
it within the cleanup grace on the way out; every task of the orchestration
sees it through a context variable (Trio tasks inherit the context of the
nursery that started them, so two concurrent ``launch`` calls each see
their own). :func:`chat_client` (and :func:`responses_client`, :func:`messages_client`, :func:`gemini_client`,
:func:`model_client` for the other APIs) is how harnesses and harness-free
benchmarks get a client: the first call for an endpoint creates its
``httpx.AsyncClient``, every later one shares it.

An endpoint is ``(api, base_url, api_key, max_connections, timeout_seconds)``
(the api decides which header carries the key):
two ModelSpecs that differ only in name or ``params`` share one connection
pool. The pool size is the spec's ``max_connections``, else the
orchestration's ``task_concurrency`` (so the tasks that use it never queue
for a connection); ``timeout_seconds`` bounds each read, write and wait for
a connection (``None``: 600 s, as the OpenAI SDK's default) and connecting
takes at most :data:`CONNECT_TIMEOUT_SECONDS` of it. An executor that runs
tasks in a process of its own (SPEC 11) opens a pool there with
:func:`open_model_clients`.

How each endpoint's client is built (httpx's own transport, proxies and
trust store from the environment) is ``_http``'s docstring.
"""

from __future__ import annotations

import contextvars
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from .._redact import register_secret
from ..runtime._errors import ConfigError
from ..runtime._values import ModelSpec
from ._client import EndpointClient
from ._gemini import GeminiClient
from ._native import ChatClient, MessagesClient, ResponsesClient

if TYPE_CHECKING:
    import ssl

    import httpx

# httpx loads with the first client: importing the contracts stays cheap.

__all__ = [
    "DEFAULT_TIMEOUT_SECONDS",
    "ModelClients",
    "chat_client",
    "gemini_client",
    "messages_client",
    "model_client",
    "open_model_clients",
    "responses_client",
]

DEFAULT_TIMEOUT_SECONDS = 600.0

_current: contextvars.ContextVar[ModelClients | None] = contextvars.ContextVar(
    "agentcompass_model_clients", default=None
)


class ModelClients:
    """The shared clients of one orchestration, keyed by endpoint."""

    def __init__(self, default_max_connections: int, *, transport: httpx.AsyncBaseTransport | None = None):
        self.default_max_connections = max(1, default_max_connections)
        self.transport = transport
        self._http: dict[tuple[Any, ...], httpx.AsyncClient] = {}
        # Per endpoint: its chat URL, parsed once.
        self._urls: dict[tuple[Any, ...], httpx.URL] = {}
        self._verify: ssl.SSLContext | None = None
        self.closed = False

    def client(self, model: ModelSpec) -> EndpointClient:
        """The client of ``model``'s API on its endpoint's shared HTTP client."""
        if self.closed:
            raise RuntimeError("the orchestration's model clients are closed")
        kind = _CLIENTS.get(model.api)
        if kind is None:
            raise ConfigError(f"model {model.name!r}: api {model.api!r} has no client")
        if not model.base_url:
            raise ConfigError(f"model {model.name!r}: base_url is required for api {model.api!r}")
        key = model.api_key.reveal() if model.api_key else ""
        # The api is part of the endpoint: it decides the header the key goes in.
        endpoint = (model.api, model.base_url, key, model.max_connections, model.timeout_seconds)
        http = self._http.get(endpoint)
        if http is None:
            import httpx

            from ._http import endpoint_client, trust_store

            if key:
                register_secret(key)
            size = model.max_connections or self.default_max_connections
            timeout = DEFAULT_TIMEOUT_SECONDS if model.timeout_seconds is None else model.timeout_seconds
            if self.transport is None and self._verify is None:
                self._verify = trust_store()
            http = endpoint_client(key, timeout, size, self._verify, self.transport, api=model.api)
            self._http[endpoint] = http
            self._urls[endpoint] = httpx.URL(model.base_url.rstrip("/") + kind.path)
        return kind(model, http, self._urls[endpoint])

    async def aclose(self) -> None:
        """Close every client (idempotent). The caller bounds it (the grace)."""
        self.closed = True
        clients, self._http, self._urls = list(self._http.values()), {}, {}
        for http in clients:
            await http.aclose()


@asynccontextmanager
async def open_model_clients(
    default_max_connections: int,
    grace_seconds: float | None = None,
    *,
    close_deadline: Callable[[], float] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> AsyncIterator[ModelClients]:
    """Make a :class:`ModelClients` pool current for the body and close it on
    the way out, shielded until ``close_deadline()`` (a ``trio.current_time()``
    value), else for at most ``grace_seconds``, else until
    :func:`~agentcompass.runtime.cleanup_deadline` (under ``launch``: the
    run's one grace deadline).

    ``transport``, when given, carries every endpoint's requests instead of
    httpx's connection pools (an ``httpx.MockTransport`` to test a harness
    without a server, say; no proxies from the environment, no retry of a
    stale connection); each endpoint's client closes it when the pool closes.

    ``launch`` does this for its run; call it yourself only to use a
    component outside ``launch`` (a test, a notebook)."""
    pool = ModelClients(default_max_connections, transport=transport)
    token = _current.set(pool)
    try:
        yield pool
    finally:
        _current.reset(token)
        import trio

        if close_deadline is not None:
            limit = close_deadline()
        elif grace_seconds is not None:
            limit = trio.current_time() + grace_seconds
        else:
            from ..runtime._cleanup import cleanup_deadline

            limit = cleanup_deadline()
        with trio.move_on_at(limit, shield=True):
            await pool.aclose()


def _pool(caller: str) -> ModelClients:
    pool = _current.get()
    if pool is None:
        raise RuntimeError(f"{caller}() needs a running orchestration (agentcompass.launch) or open_model_clients()")
    return pool


def _typed(model: ModelSpec, api: str, caller: str) -> Any:
    if model.api != api:
        raise ConfigError(f"model {model.name!r}: api {model.api!r} has no {caller}() (it needs api {api!r})")
    return _pool(caller).client(model)


def chat_client(model: ModelSpec) -> ChatClient:
    """The :class:`ChatClient` for ``model`` on its endpoint's shared HTTP client.

    Call it from a component running under ``agentcompass.launch`` (or
    inside ``open_model_clients``); the client is the orchestration's, so do
    not close it. Raises :class:`ConfigError` for a ModelSpec that has no
    chat API (``api`` other than ``openai-chat``, no ``base_url``) and
    ``RuntimeError`` outside an orchestration.
    """
    client: ChatClient = _typed(model, "openai-chat", "chat_client")
    return client


def responses_client(model: ModelSpec) -> ResponsesClient:
    """The :class:`ResponsesClient` for a ``model`` with ``api:
    openai-responses``, shared as :func:`chat_client`'s is (same errors)."""
    client: ResponsesClient = _typed(model, "openai-responses", "responses_client")
    return client


def messages_client(model: ModelSpec) -> MessagesClient:
    """The :class:`MessagesClient` for a ``model`` with ``api:
    anthropic-messages``, shared as :func:`chat_client`'s is (same errors)."""
    client: MessagesClient = _typed(model, "anthropic-messages", "messages_client")
    return client


def gemini_client(model: ModelSpec) -> GeminiClient:
    """The :class:`GeminiClient` for a ``model`` with ``api:
    google-generate-content``, shared as :func:`chat_client`'s is (same errors)."""
    client: GeminiClient = _typed(model, "google-generate-content", "gemini_client")
    return client


def model_client(model: ModelSpec) -> ChatClient | ResponsesClient | MessagesClient | GeminiClient:
    """The client of ``model``'s own API: a :class:`ChatClient`,
    :class:`ResponsesClient`, :class:`MessagesClient` or :class:`GeminiClient` (``api: none`` or no
    ``base_url``: :class:`ConfigError`). The model gateway forwards through it."""
    client: Any = _pool("model_client").client(model)
    return client


_CLIENTS: dict[str, type[EndpointClient]] = {
    "openai-chat": ChatClient,
    "openai-responses": ResponsesClient,
    "anthropic-messages": MessagesClient,
    "google-generate-content": GeminiClient,
}
