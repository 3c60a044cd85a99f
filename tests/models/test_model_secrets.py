"""The API key never reaches a file, a log or the console, even when the model
server echoes the request's ``Authorization`` header into its error body."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import trio
import yaml
from _common import serving
from _model_support import KEY, REPO, SMOKE, details, launch, react_request, retries

from agentcompass import ExecutionSpec
from agentcompass.testing.model_server import echo_headers, episode, text, tool_call

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="bash tasks")

FORBIDDEN = [KEY, f"Bearer {KEY}"]


def leaks(root: Path) -> list[tuple[str, str]]:
    found = []
    for directory, _, files in os.walk(root):
        for name in files:
            data = Path(directory, name).read_bytes()
            found.extend((str(Path(directory, name)), s) for s in FORBIDDEN if s.encode() in data)
    return found


def file_count(root: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(root))


async def test_echoed_authorization_reaches_no_file(tmp_path):
    # Try 1: a tool call, then the echo (FATAL, retried); try 2: the echo again (FATAL, kept).
    script = [tool_call("bash", {"command": "echo hi"}), echo_headers(500), echo_headers(502)]
    execution = ExecutionSpec(max_retries=1, retry_min_delay_seconds=0.01, retry_max_delay_seconds=0.02)
    async with serving(script) as server:
        _, run_dir = await launch(react_request(server, tmp_path, ["hello-file"], execution=execution))
    # The key was really sent and really echoed: the scan is not vacuous.
    assert all(r.headers["authorization"] == f"Bearer {KEY}" for r in server.requests)
    record = details(run_dir)["hello-file"]
    (issue,) = record["attempts"][0]["issues"]
    assert (issue["severity"], issue["code"]) == ("fatal", "model_server_error")
    assert "authorization" in issue["message"] and "**********" in issue["message"]
    (discarded,) = retries(run_dir)
    assert "authorization" in discarded["issues"][0]["message"]
    assert (run_dir / "log.jsonl").exists() and file_count(tmp_path / "runs") > 5
    assert leaks(tmp_path / "runs") == []


async def test_the_cli_run_leaks_the_key_nowhere(tmp_path):
    # The agent prints the key (a session's environment no longer holds the
    # runtime's, so the model's command carries it: the call and its output both
    # reach the trajectory), then the server echoes the Authorization header.
    script = episode([tool_call("bash", {"command": f'echo "key={KEY}"'}), echo_headers(500)])
    async with serving(script) as server:
        config = {
            "orchestration": {"task_concurrency": 2},
            "requests": [
                {
                    "name": "secret-scan",
                    "benchmark": {"id": "terminal", "config": {"path": str(SMOKE)}},
                    "harness": {"id": "react"},
                    "environment": {"id": "local", "config": {"root": str(tmp_path / "sandboxes")}},
                    "model": {"name": "scripted", "base_url": server.base_url, "api_key": "${AC_MODEL_KEY}"},
                    "task_ids": ["hello-file", "word-count"],
                    "output_root": str(tmp_path / "runs"),
                }
            ],
        }
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(config))
        env = {**os.environ, "AC_MODEL_KEY": KEY}
        with trio.fail_after(120):
            done = await trio.run_process(
                [sys.executable, "-m", "agentcompass._cli", "launch", str(path)],
                env=env,
                cwd=REPO,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
    assert done.returncode == 1, done.stderr.decode()[-2000:]  # both tasks ended FATAL
    assert len(server.requests) == 4
    for stream in (done.stdout, done.stderr):
        assert not any(s.encode() in stream for s in FORBIDDEN)
    assert leaks(tmp_path / "runs") == [] and file_count(tmp_path / "runs") > 5
    assert KEY not in path.read_text()
    # Both leaks were really on their way: the echoed header and the tool output, masked.
    (run_dir,) = (tmp_path / "runs" / "secret-scan").iterdir()
    for record in details(run_dir).values():
        (issue,) = record["attempts"][0]["issues"]
        assert "authorization" in issue["message"] and "**********" in issue["message"]
        tool = record["attempts"][0]["run_result"]["trajectory"][3]
        assert tool["role"] == "tool" and tool["content"] == "key=**********\n"


async def test_a_successful_episode_keeps_the_key_out_of_the_plan_and_run_info(tmp_path):
    async with serving(episode([text("done")])) as server:
        _, run_dir = await launch(react_request(server, tmp_path, ["hello-file"]))
    run_info = (run_dir / "run_info.json").read_text()
    assert "scripted-model" in run_info and KEY not in run_info
    assert leaks(tmp_path / "runs") == []
