"""The gateway tests' fixture: a scripted model server, a model for it holding
the test module's ``KEY``, and a ``local`` session to serve the gateway into."""

from __future__ import annotations

import pytest
import trio

from agentcompass import ModelSpec, NetworkPolicy, Secret
from agentcompass.environments.local import LocalEnvironment
from agentcompass.models import open_model_clients
from agentcompass.testing.model_server import ModelServer


@pytest.fixture
async def setup(tmp_path, request):
    async def start(script, api="openai-chat", **server_options):
        server = ModelServer(script, **server_options)
        url = await nursery.start(server.serve)
        model = ModelSpec(name="scripted", api=api, base_url=url, api_key=Secret(request.module.KEY))
        env = await LocalEnvironment({"root": str(tmp_path)}).open(None, NetworkPolicy("full"), "gw-test")
        sessions.append(env)
        return server, model, env

    sessions: list = []
    async with trio.open_nursery() as nursery, open_model_clients(4):
        try:
            yield start
        finally:
            for env in sessions:
                await env.close()
            nursery.cancel_scope.cancel()
