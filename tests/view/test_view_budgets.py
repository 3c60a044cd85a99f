"""The viewer shows cost, the limits an attempt hit and the headline beside
the score, and opens an ATIF file given by path (``compass view FILE``), in
a real headless Chromium, on a run the runtime made against the scripted model."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import trio
from view_helpers import COMPASS, ROOT, wait_ready

import agentcompass
from agentcompass import ComponentRef, ExecutionSpec, Limits, ModelSpec, Orchestration, Pricing, RunRequest
from agentcompass._view import Site, find_runs, serve
from agentcompass._view._browser import Browser
from agentcompass.testing.model_server import ModelServer, tool_call

HANG_GUARD = 120
RFC_EXAMPLE = ROOT / "tests" / "atif" / "rfc_0001_example.json"


async def _limited_run(tmp_path: Path) -> Path:
    """A react run on two tasks, priced, whose attempts stop at limits.model_calls=2."""
    server = ModelServer(lambda request: tool_call("bash", {"command": "echo 'Hello, world!' > hello.txt"}))
    async with trio.open_nursery() as nursery:
        url = await nursery.start(server.serve)
        request = RunRequest(
            name="priced",
            benchmark=ComponentRef("terminal", {"path": str(ROOT / "benchmarks_data" / "terminal-smoke")}),
            harness=ComponentRef("react"),
            environment=ComponentRef("local", {"root": str(tmp_path / "sandboxes")}),
            model=ModelSpec("scripted", base_url=url, pricing=Pricing(input=1.0, output=2.0)),
            execution=ExecutionSpec(limits=Limits(model_calls=2)),
            task_ids=["hello-file", "word-count"],
            output_root=tmp_path / "runs",
        )
        result = await agentcompass.launch(Orchestration([request]))
        nursery.cancel_scope.cancel()
    return Path(result.requests[0].run_dir)


async def test_cost_limits_and_an_atif_file_by_path(tmp_path: Path, nursery: trio.Nursery, browser: Browser) -> None:
    with trio.fail_after(HANG_GUARD):
        run_dir = await _limited_run(tmp_path)
        # An ATIF file from anywhere: one the run wrote, copied out of its run directory.
        (written,) = run_dir.glob("tasks/hello-file*/attempt-0/agent/trajectory.json")
        elsewhere = tmp_path / "elsewhere" / "episode.json"
        elsewhere.parent.mkdir()
        shutil.copy(written, elsewhere)
        broken = tmp_path / "elsewhere" / "broken.json"
        broken.write_text(json.dumps({"schema_version": "ATIF-v1.7", "agent": {"name": "x"}, "steps": []}))
        site = Site(find_runs([run_dir]), live=True, atif_files=[elsewhere, RFC_EXAMPLE, broken])
        url = await nursery.start(serve, site, 0)

        await browser.goto(url + "#/run/0")
        await wait_ready(browser, "run")
        cost = await browser.text("#cost")
        assert "$0.000080" in cost  # 4 calls of 10 prompt + 5 completion tokens at 1 and 2 USD per million: 2e-05 each
        headline = await browser.text("#headline")
        assert "limits hit" in headline and "2" in headline and "of 2 attempts" in headline
        await browser.screenshot(tmp_path / "run-cost.png")

        await browser.execute("location.hash = arguments[0]", "#/run/0/task/hello-file/0")
        await wait_ready(browser, "attempt")
        assert "$0.000040" in await browser.text("#attempt-cost")
        assert "harness_limit_reached" in await browser.text("#issues")
        assert "limits.model_calls=2" in await browser.text("#issues")

        await browser.goto(url + "atif/0.html")
        await browser.wait_for("document.querySelector('#atif')")
        assert await browser.text("#atif-valid")
        assert "$0.000040" in await browser.text("#atif-cost")
        sources = await browser.execute(
            "return [...document.querySelectorAll('.atif-step')].map(s => s.dataset.source)"
        )
        assert sources == ["system", "user", "agent", "agent"]
        assert "echo 'Hello, world!'" in await browser.text(".tool-call")
        await browser.screenshot(tmp_path / "atif.png")

        await browser.goto(url + "atif/1.html")  # the RFC's own example
        await browser.wait_for("document.querySelector('#atif')")
        assert await browser.text("#atif-valid") and "gemini-2.5-flash" in await browser.text("#atif-model")
        assert "$0.000780" in await browser.text("#atif-cost")

        await browser.goto(url + "atif/2.html")
        await browser.wait_for("document.querySelector('#atif')")
        assert "'version' is a required property" in await browser.text("#atif-problems")


def test_compass_view_of_a_file_writes_its_page(tmp_path: Path) -> None:
    out = tmp_path / "site"
    done = subprocess.run(
        [COMPASS, "view", str(RFC_EXAMPLE), "--out", str(out)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    page = (out / "atif" / "0.html").read_text()
    assert "Valid against the shipped ATIF v1.7 schema" in page and "financial_search" in page
    missing = subprocess.run([COMPASS, "view", str(tmp_path / "nope.json")], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "not found" in missing.stderr
