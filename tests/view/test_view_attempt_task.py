"""The attempt page shows what the task asked (SPEC 10): the prepared task's
input and the benchmark's expected answer, and the logs kept under
``tasks/<key>/attempt-<n>/logs/``; the run page shows each mean with its
standard error. Real runs through the CLI, driven in headless Chromium,
served and as static files opened from disk."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import trio
from view_helpers import COMPASS, ROOT, wait_ready

from agentcompass._view import find_runs
from agentcompass._view._browser import Browser

HANG_GUARD = 120

QA_CONFIG = """
requests:
  - name: qa-demo
    benchmark: {{id: qa, config: {{path: {path}}}}}
    harness: {{id: none}}
    environment: {{id: local}}
    model: {{name: scripted, base_url: "${{MODEL_BASE_URL}}"}}
    task_ids: [capital-france, capital-japan]
"""


def _qa_run(tmp_path: Path) -> Path:
    """A real ``qa`` run against the scripted model server, which answers
    "Paris" to everything: one question right, one wrong."""
    (tmp_path / "script.json").write_text(json.dumps({"delay": 0, "default": [{"text": "Paris"}]}))
    (tmp_path / "qa.yaml").write_text(QA_CONFIG.format(path=ROOT / "benchmarks_data" / "qa" / "questions.jsonl"))
    subprocess.run([sys.executable, "-m", "agentcompass.testing.model_server", "--script", str(tmp_path / "script.json"),
                    "--", COMPASS, "launch", str(tmp_path / "qa.yaml"), "--output-root", str(tmp_path / "runs")],
                   check=True, cwd=tmp_path, capture_output=True, timeout=120)
    (run_dir,) = find_runs([tmp_path / "runs"])
    return run_dir


async def test_attempt_page_shows_the_question_the_expected_answer_and_the_kept_logs(
    viewer, browser: Browser, tmp_path: Path
) -> None:
    run_dir = _qa_run(tmp_path)
    (record_path,) = run_dir.glob("details/*/capital-japan.json")
    prepared = json.loads(record_path.read_text())["attempts"][0]["prepared"]
    assert prepared["input"] == {"question": "What is the capital of Japan?"}
    assert prepared["expected"] == "Tokyo"  # recorded by the store, from the benchmark
    # Logs as the store keeps them (the qa benchmark leaves none of its own).
    logs = run_dir / "tasks" / "capital-japan" / "attempt-0" / "logs"
    (logs / "verifier").mkdir(parents=True)
    (logs / "verifier" / "test-output.txt").write_text("checked: Paris != Tokyo\n")
    (logs / "agent").mkdir()
    (logs / "agent" / "trace.log").write_text("".join(f"line {n}\n" for n in range(3000)))
    (logs / "agent" / "elsewhere").symlink_to("/etc/passwd")  # an agent's link: never followed

    with trio.fail_after(HANG_GUARD):
        url = await viewer([run_dir])
        await browser.goto(url + "#/run/0")
        await wait_ready(browser, "run")
        # Each mean with its standard error: (1 + 0) / 2 = 0.5, stderr 0.5.
        assert await browser.text("#score") == "0.5"
        assert await browser.text("#score-stderr") == "± 0.5"
        metrics_row = await browser.execute("return [...document.querySelectorAll('#metrics tr')][1].textContent")
        assert metrics_row.startswith("correct0.5 ± 0.50.5")

        await browser.type("input[name=text]", "japan")
        await browser.click("#task-table a.task-link")
        await wait_ready(browser, "attempt")
        task_input = await browser.text("#task-input")
        assert task_input == "input · question\nWhat is the capital of Japan?"
        assert await browser.text("#task-expected") == "expected\nTokyo"
        output = await browser.execute("return [...document.querySelectorAll('.panel')].find(p => p.querySelector('h2').textContent === 'Output').textContent")
        assert "Paris" in output

        paths = await browser.execute("return [...document.querySelectorAll('#logs details.log')].map(d => d.dataset.path)")
        assert paths == ["agent/trace.log", "verifier/test-output.txt"]
        await browser.click("#logs details.log[data-path='verifier/test-output.txt'] summary")
        await browser.wait_for("document.querySelector(\"#logs details.log[data-path='verifier/test-output.txt'] .log-text[data-ready]\")")
        assert "checked: Paris != Tokyo" in await browser.text("#logs details.log[data-path='verifier/test-output.txt'] .log-text")
        await browser.click("#logs details.log[data-path='agent/trace.log'] summary")
        trace = "#logs details.log[data-path='agent/trace.log'] .log-text"
        await browser.wait_for(f"document.querySelector(\"{trace}[data-ready]\")")
        assert "line 0" in await browser.text(trace + " pre")  # folded: its head first
        await browser.click(trace + " button.fold")
        assert "line 2999" in await browser.text(trace + " pre")
        await browser.screenshot(tmp_path / "qa-attempt.png")

        # The other question was answered right: its expected answer is shown the same way.
        await browser.goto(url + "#/run/0/task/capital-france/0")
        await wait_ready(browser, "attempt")
        assert await browser.text("#task-expected") == "expected\nParis"
        assert await browser.text("#logs") == "No logs kept."


async def test_terminal_attempt_shows_its_instruction_and_logs_from_static_files(
    demo_run: Path, browser: Browser, tmp_path: Path
) -> None:
    instruction = (ROOT / "benchmarks_data" / "terminal-smoke" / "reverse-lines" / "instruction.md").read_text()
    # The run kept what the verifier left in /logs/verifier.
    logs = demo_run / "tasks" / "reverse-lines" / "attempt-0" / "logs" / "verifier"
    assert (logs / "reward.txt").read_text() == "0\n"
    out = tmp_path / "site"
    with trio.fail_after(60):
        await trio.run_process([COMPASS, "view", str(demo_run), "--out", str(out)], capture_stdout=True, capture_stderr=True)
    assert (out / "data" / "0" / "log" / "reverse-lines" / "0-0.js").is_file()
    with trio.fail_after(HANG_GUARD):
        await browser.goto((out / "index.html").as_uri() + "#/run/0")
        await wait_ready(browser, "run")
        assert (await browser.text("#score-stderr")).startswith("± 0.1124")  # 10 of 12 passed
        await browser.goto((out / "index.html").as_uri() + "#/run/0/task/reverse-lines/0")
        await wait_ready(browser, "attempt")
        assert await browser.text("#task-input") == "input · instruction\n" + instruction.strip()
        assert await browser.text("#task-expected") == "expected\nNone recorded (the benchmark's own check decides)."
        await browser.click("#logs details.log summary")
        await browser.wait_for("document.querySelector('#logs .log-text[data-ready]')")
        assert await browser.text("#logs .log-text pre") == "0"
        await browser.screenshot(tmp_path / "terminal-attempt.png")
