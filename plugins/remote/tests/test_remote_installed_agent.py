"""The ``installed`` harness through ``remote``: mini-swe-agent solves a
``terminal-smoke`` task in a ``sandbox`` session on a ``compass sandbox
serve`` server, run network ``none``, reaching the scripted model server
only through the attempt's gateway, whose socket the session reaches as a
relay over the session's connection; the agent's installation is the
server's own cache entry (here the host's: client and server share it)."""

from __future__ import annotations

import json
from pathlib import Path

import trio
from _remote_support import TOKEN, requires_sandbox
from agentcompass_remote import SandboxServer, serve_sandboxes

import agentcompass
from agentcompass import (
    AttemptsSpec,
    ComponentRef,
    ExecutionSpec,
    ModelSpec,
    NetworkOverrides,
    NetworkPolicy,
    Orchestration,
    RunRequest,
    Secret,
)
from agentcompass.testing import hang_guard
from agentcompass.testing.model_server import ModelServer, RecordedRequest, Reply, tool_call

pytestmark = requires_sandbox

SMOKE = Path(__file__).resolve().parents[3] / "benchmarks_data" / "terminal-smoke"
KEY = "sk-fake-REMOTE-KEY-0cc175b9c0f1b6a831c3"


def _turns(request: RecordedRequest) -> int:
    return sum(1 for m in (request.json or {}).get("messages", []) if m.get("role") == "assistant")


def _texts(server: ModelServer) -> str:
    texts = []
    for request in server.requests:
        for message in (request.json or {}).get("messages", []):
            content = message.get("content")
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            texts.append(content or "")
    return "\n".join(texts)


async def test_mini_swe_agent_solves_a_task_in_a_remote_sandbox_through_the_gateway_only(
    nursery: trio.Nursery, tmp_path: Path
):
    sandbox_server = SandboxServer("sandbox", TOKEN, grace=5.0)
    port = await nursery.start(serve_sandboxes, sandbox_server, "127.0.0.1", 0)
    probe = (
        "python3 -c \"import socket,sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=3)\" "
        "{port} 2>/dev/null && echo DIRECT-REACHED || echo DIRECT-REFUSED"
    )
    steps = [
        lambda: tool_call(
            "bash", {"command": probe.format(port=model_server.base_url.rsplit(":", 1)[1].split("/")[0])}
        ),
        lambda: tool_call("bash", {"command": "echo 'Hello, world!' > /app/hello.txt && cat /app/hello.txt"}),
        lambda: tool_call("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}),
    ]

    def script(request: RecordedRequest) -> Reply:
        return steps[min(_turns(request), len(steps) - 1)]()

    model_server = ModelServer(script)
    url = await nursery.start(model_server.serve)
    request = RunRequest(
        name="remote-installed",
        benchmark=ComponentRef("terminal", {"path": str(SMOKE)}),
        harness=ComponentRef("installed", {"agent": "mini-swe-agent"}),
        environment=ComponentRef("remote", {"url": f"ws://127.0.0.1:{port}", "token": TOKEN, "provider": "sandbox"}),
        model=ModelSpec(name="scripted", base_url=url, api_key=Secret(KEY)),
        execution=ExecutionSpec(attempts=AttemptsSpec(k=1), network=NetworkOverrides(run=NetworkPolicy("none"))),
        task_ids=["hello-file"],
        output_root=tmp_path / "runs",
    )
    with hang_guard(300):
        result = await agentcompass.launch(Orchestration([request]))
    run_dir = Path(result.requests[0].run_dir)
    [record] = [json.loads(p.read_text()) for p in (run_dir / "details").glob("*/*.json")]
    attempt = record["attempts"][0]
    assert attempt["values"]["reward"] == 1.0, attempt["issues"]
    assert attempt["issues"] == []
    texts = _texts(model_server)
    # Inside, the model server's port is the session's own loopback: nothing there.
    assert "DIRECT-REFUSED" in texts and "DIRECT-REACHED" not in texts
    run_result = attempt["run_result"]
    assert run_result["usage"]["calls"] == 3 and len(model_server.requests) == 3
    assert run_result["artifacts"]["agent"]["id"] == "mini-swe-agent"
    assert all(r.headers["authorization"] == f"Bearer {KEY}" for r in model_server.requests)
    (kept,) = run_dir.glob("tasks/*/attempt-0/logs/agent/trajectory.json")
    assert json.loads(kept.read_text())["info"]["exit_status"] == "Submitted"
    # The session went through the server, and is gone with its relays.
    assert sandbox_server.opened_total == 1 and sandbox_server.sessions == {}
