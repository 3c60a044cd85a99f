"""The ``installed`` harness under ``docker``: the real mini-swe-agent, from
the host's agent cache exposed read-only in the container, solves a
``terminal-smoke`` task with run network ``none``, reaching the scripted
model server only through the attempt's gateway (a unix socket exposed in
the container); an image without Python is FATAL ``environment_unsupported``.

The agent installs through the host's agent cache (``make agents`` builds
it; a missing entry is built by the first test, which takes minutes). The
image with Python is built ``FROM`` the base once per machine
(:meth:`~agentcompass_docker.testing.PrivateDaemon.test_image`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.append(str(Path(__file__).resolve().parents[3] / "tests" / "harnesses"))

from _installed_support import KEY, assistant_turns, details, launch, message_texts  # noqa: E402
from agentcompass_docker.base import BASE_IMAGE  # noqa: E402

from agentcompass.testing.model_server import ModelServer, RecordedRequest, Reply, tool_call  # noqa: E402

PYTHON_IMAGE = Path(__file__).parent / "images" / "python3"
SUBMIT = tool_call("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"})


@pytest.fixture(scope="module")
def python_image(docker_daemon: Any) -> str:
    return docker_daemon.test_image("test-python3", PYTHON_IMAGE)


def _docker(daemon: Any, image: str) -> dict[str, Any]:
    return {"host": daemon.host, "default_image": image, "pull": "never"}


def _bash(command: str) -> Reply:
    return tool_call("bash", {"command": command})


async def test_mini_swe_agent_solves_a_task_in_a_container_offline_through_the_gateway_only(
    docker_daemon: Any, python_image: str, tmp_path: Path
) -> None:
    def probe(port: str) -> str:
        return (
            "python3 -c \"import socket,sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=3)\" "
            f"{port} 2>/dev/null && echo DIRECT-REACHED || echo DIRECT-REFUSED; "
            "echo INTERFACES:$(grep -c : /proc/net/dev); "
            # The agent's installation is read-only to it.
            "touch /run/agentcompass/*/installed.json 2>/dev/null && echo CACHE-WRITABLE || echo CACHE-READONLY"
        )

    pattern = f"printf %s%s {KEY[:10]!r} {KEY[10:]!r}"
    scan = (
        f"echo SCAN-HITS:$({pattern} | grep -ls -f - /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | wc -l)"
        f':$({pattern} | grep -rls --exclude-dir=venv -f - "$HOME" /logs /app /run/agentcompass 2>/dev/null | wc -l)'
    )
    steps = [
        lambda: _bash(probe(server.base_url.rsplit(":", 1)[1].split("/")[0])),
        lambda: _bash(scan),
        lambda: _bash("mkdir -p /app && echo 'Hello, world!' > /app/hello.txt && cat /app/hello.txt"),
        lambda: SUBMIT,
    ]

    def script(request: RecordedRequest) -> Reply:
        return steps[min(assistant_turns(request), len(steps) - 1)]()

    server = ModelServer(script)
    result, run_dir = await launch(
        tmp_path,
        server,
        {"agent": "mini-swe-agent"},
        tasks=["hello-file"],
        environment="docker",
        env_config=_docker(docker_daemon, python_image),
    )
    attempt = details(run_dir)["hello-file"]["attempts"][0]
    assert attempt["values"]["reward"] == 1.0, attempt["issues"]
    assert attempt["issues"] == []
    texts = "\n".join(message_texts(server))
    assert "DIRECT-REFUSED" in texts and "DIRECT-REACHED" not in texts
    assert "INTERFACES:1" in texts  # loopback only: the gateway came through the socket
    assert "CACHE-READONLY" in texts
    assert "SCAN-HITS:0:0" in texts
    run_result = attempt["run_result"]
    calls = [e for e in run_result["trajectory"] if e["role"] == "assistant" and "call" in e]
    assert [c["call"] for c in calls] == [1, 2, 3, 4]
    assert run_result["usage"] == {"prompt_tokens": 40, "completion_tokens": 20, "calls": 4, "cost_usd": None}
    assert json.loads((run_dir / "metrics.json").read_text())["usage"]["calls"] == 4
    assert all(r.headers["authorization"] == f"Bearer {KEY}" for r in server.requests)
    (kept,) = run_dir.glob("tasks/*/attempt-0/logs/agent/trajectory.json")
    assert json.loads(kept.read_text())["info"]["exit_status"] == "Submitted"


async def test_an_image_without_python_is_fatal_environment_unsupported_naming_python(
    docker_daemon: Any, tmp_path: Path
) -> None:
    server = ModelServer(lambda request: SUBMIT)
    result, run_dir = await launch(
        tmp_path,
        server,
        {"agent": "mini-swe-agent"},
        tasks=["hello-file"],
        environment="docker",
        env_config=_docker(docker_daemon, BASE_IMAGE),
    )
    record = details(run_dir)["hello-file"]
    issues = record["attempts"][0]["issues"]
    assert [(i["severity"], i["code"]) for i in issues] == [("fatal", "environment_unsupported")]
    assert "Python >= 3.10" in issues[0]["message"] and "its installation was made with" in issues[0]["message"]
    assert server.requests == []


@pytest.mark.parametrize("agent", ["claude-code", "codex"])
async def test_claude_code_and_codex_solve_a_task_in_a_container_offline_through_the_gateway_only(
    docker_daemon: Any, python_image: str, tmp_path: Path, agent: str
) -> None:
    """Their native executables from the host's cache run in the container
    (glibc for Claude Code, static for Codex); the gateway speaks their API."""
    from test_installed_claude_codex import SCAN, SHELL, WRITE, _shell

    from agentcompass.testing.model_server import by_instruction, episode, text

    probe = "echo INTERFACES:$(grep -c : /proc/net/dev)"
    steps = [_shell(agent, f"{probe}; {SCAN}; mkdir -p /app && {WRITE}"), text("Done.")]
    server = ModelServer(by_instruction([("/app/hello.txt", episode(steps))]))
    api = "anthropic-messages" if agent == "claude-code" else "openai-responses"
    result, run_dir = await launch(
        tmp_path,
        server,
        {"agent": agent, "max_model_calls": 10},
        tasks=["hello-file"],
        api=api,
        environment="docker",
        env_config=_docker(docker_daemon, python_image),
    )
    attempt = details(run_dir)["hello-file"]["attempts"][0]
    assert attempt["values"]["reward"] == 1.0, attempt["issues"]
    run_result = attempt["run_result"]
    calls = [c for e in run_result["trajectory"] if e["role"] == "assistant" for c in e.get("tool_calls", [])]
    assert [c["name"] for c in calls] == [SHELL[agent][0]]
    (answer,) = [e for e in run_result["trajectory"] if e["role"] == "tool"]
    assert "INTERFACES:1" in answer["content"] and "SCAN-HITS:0:0" in answer["content"]
    assert run_result["usage"] == {"prompt_tokens": 20, "completion_tokens": 10, "calls": 2, "cost_usd": None}
    key_header = "x-api-key" if agent == "claude-code" else "authorization"
    assert all(KEY in r.headers[key_header] for r in server.requests if r.method == "POST")
