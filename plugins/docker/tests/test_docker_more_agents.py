"""OpenCode (an npm agent run as its native executable) under ``docker``:
from the host's agent cache exposed read-only in the container, it solves a
``terminal-smoke`` task with run network ``none``, reaching the scripted
model server only through the attempt's gateway."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.append(str(Path(__file__).resolve().parents[3] / "tests" / "harnesses"))

from _installed_support import KEY, details, launch  # noqa: E402

from agentcompass.testing.model_server import ModelServer, by_instruction, episode, text  # noqa: E402

PYTHON_IMAGE = Path(__file__).parent / "images" / "python3"


@pytest.fixture(scope="module")
def python_image(docker_daemon: Any) -> str:
    return docker_daemon.test_image("test-python3", PYTHON_IMAGE)


async def test_opencode_solves_a_task_in_a_container_offline_through_the_gateway_only(
    docker_daemon: Any, python_image: str, tmp_path: Path
) -> None:
    from test_installed_claude_codex import WRITE
    from test_installed_more_agents import SCAN, shell

    probe = "grep -c : /proc/net/dev | sed s/^/INTERFACES:/"
    steps = [shell("opencode", f"{probe}; {SCAN}; mkdir -p /app && {WRITE}"), text("Done.")]
    server = ModelServer(by_instruction([("/app/hello.txt", episode(steps))]))
    result, run_dir = await launch(
        tmp_path,
        server,
        {"agent": "opencode", "max_model_calls": 10},
        tasks=["hello-file"],
        environment="docker",
        env_config={"host": docker_daemon.host, "default_image": python_image, "pull": "never"},
    )
    attempt = details(run_dir)["hello-file"]["attempts"][0]
    assert attempt["values"]["reward"] == 1.0, attempt["issues"]
    run_result = attempt["run_result"]
    calls = [c for e in run_result["trajectory"] if e["role"] == "assistant" for c in e.get("tool_calls", [])]
    assert [c["name"] for c in calls] == ["bash"]
    (answer,) = [e for e in run_result["trajectory"] if e["role"] == "tool"]
    assert "INTERFACES:1" in answer["content"]  # loopback only: the gateway came through the socket
    assert "SCAN-PROC:0" in answer["content"] and "SCAN-FILES:0" in answer["content"]
    posts = [r for r in server.requests if r.method == "POST"]
    assert run_result["usage"]["calls"] == len(posts) >= 2
    assert all(KEY in r.headers["authorization"] for r in posts)
