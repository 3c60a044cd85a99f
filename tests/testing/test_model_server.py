"""The scripted model server itself: routes, script files, and its command
form, which ``make demo-agent`` uses."""

from __future__ import annotations

import json
import os
import sys

import httpx
import pytest
import trio
from _common import serving
from _model_support import REPO

from agentcompass.testing import hang_guard
from agentcompass.testing.model_server import RecordedRequest, episode, load_script, text


async def test_unknown_routes_are_404_and_the_script_runs_out_with_500():
    async with hang_guard(20), serving([text("only one")]) as server, httpx.AsyncClient() as http:
        missing = await http.get(server.base_url + "/models")
        first = await http.post(server.base_url + "/chat/completions", json={"messages": []})
        second = await http.post(server.base_url + "/chat/completions", json={"messages": []})
    assert missing.status_code == 404
    assert first.json()["choices"][0]["message"]["content"] == "only one"
    assert second.status_code == 500 and "exhausted" in second.text
    assert [r.method for r in server.requests] == ["GET", "POST", "POST"]


def test_a_script_file_picks_the_episode_by_the_first_user_message():
    script = load_script(
        {
            "delay": 0.5,
            "episodes": [
                {"match": "alpha", "steps": [{"text": "a1"}, {"status": 429, "headers": {"Retry-After": "2"}}]}
            ],
            "default": [{"malformed": "{", "delay": 0}],
        }
    )

    def ask(content: str, turns: int):
        messages = [{"role": "user", "content": content}] + [{"role": "assistant", "content": "x"}] * turns
        return script(RecordedRequest("POST", "/v1/chat/completions", {}, json.dumps({"messages": messages}).encode()))

    first, second, third = ask("do alpha", 0), ask("do alpha", 1), ask("beta", 0)
    assert first.body["choices"][0]["message"]["content"] == "a1" and first.delay == 0.5
    assert (second.status, second.headers) == (429, {"Retry-After": "2"})
    assert (third.body, third.delay) == (b"{", 0)
    with pytest.raises(ValueError, match="unknown script step"):
        load_script({"default": [{"bogus": 1}]})


def test_episode_repeats_its_last_step():
    script = episode([text("one"), text("last")])
    bodies = [{"messages": [{"role": "assistant"}] * n} for n in range(4)]
    replies = [script(RecordedRequest("POST", "/", {}, json.dumps(b).encode())) for b in bodies]
    assert [r.body["choices"][0]["message"]["content"] for r in replies] == ["one", "last", "last", "last"]


@pytest.mark.skipif(sys.platform == "win32", reason="bash tasks")
async def test_the_demo_agent_command_runs_react_against_the_scripted_server(tmp_path):
    command = [
        sys.executable, "-m", "agentcompass.testing.model_server", "--script", "examples/demo-agent.json", "--",
        sys.executable, "-m", "agentcompass._cli", "launch", "examples/demo-agent.yaml", "--output-root", str(tmp_path),
    ]  # fmt: skip
    with trio.fail_after(120):
        done = await trio.run_process(
            command, cwd=REPO, capture_stdout=True, capture_stderr=True, check=False, env=dict(os.environ)
        )
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert out.startswith("http://127.0.0.1:")  # the server's URL, first
    (metrics_path,) = tmp_path.glob("*/*/metrics.json")
    metrics = json.loads(metrics_path.read_text())
    assert metrics["series"]["passed"]["value"] == 1.0 and metrics["series"]["passed"]["evaluated"] == 2
    assert metrics["usage"]["calls"] == 7
