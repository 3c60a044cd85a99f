"""A base URL that is wrong (a missing ``/v1``: HTTP 404 on every call) is a
failed run, not a result: FATAL ``model_not_found``, exit 1, no official score."""

from __future__ import annotations

import json
import os
import sys

import trio
from _http_support import Answer, App, Seen, serving
from _model_support import REPO

from agentcompass.testing import hang_guard


async def _routes(seen: Seen) -> Answer:
    if seen.path == "/v1/chat/completions":
        return Answer()
    return Answer(status=404, body=b'{"detail": "Not Found"}')


async def test_compass_launch_with_a_base_url_missing_v1_exits_1_with_no_official_score(tmp_path):
    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps({"id": f"q{i}", "question": "2+2?", "answer": "4"}) + "\n" for i in (1, 2)))
    app = App(_routes)
    async with hang_guard(120), serving(app) as origin:
        config = {
            "requests": [
                {
                    "name": "wrong-url",
                    "benchmark": {"id": "qa", "config": {"path": str(questions)}},
                    "environment": {"id": "local", "config": {"root": str(tmp_path / "sandboxes")}},
                    "model": {"name": "m", "api": "openai-chat", "base_url": origin},  # no /v1
                    "output_root": str(tmp_path / "runs"),
                }
            ]
        }
        (tmp_path / "config.json").write_text(json.dumps(config))
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        done = await trio.run_process(
            [sys.executable, "-m", "agentcompass._cli", "launch", str(tmp_path / "config.json")],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=env,
            cwd=tmp_path,
        )
    output = done.stdout.decode() + done.stderr.decode()
    assert done.returncode == 1, output
    assert "model_not_found" in output and "no official score" in output.lower()
    assert {r.path for r in app.requests} == {"/chat/completions"}
    (metrics_path,) = (tmp_path / "runs").glob("**/metrics.json")
    metrics = json.loads(metrics_path.read_text())
    assert metrics["series"]["correct"]["value"] is None
    records = [json.loads(p.read_text()) for p in metrics_path.parent.glob("details/*/*.json")]
    assert {r["attempts"][0]["issues"][0]["code"] for r in records} == {"model_not_found"}
    assert {p.parent.name for p in metrics_path.parent.glob("details/*/*.json")} == {"fatal"}
