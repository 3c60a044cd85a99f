"""``python -m bench.view [--tasks N] [--steps N] [--smoke]``: the viewer at scale.

Writes a synthetic run of ``--tasks`` tasks (10,000) whose first task's
attempt has a trajectory of ``--steps`` agent steps (100,000: an assistant
message with a tool call and its tool result each), serves it with
``compass view``'s server and drives headless Chromium through it:

- run page ready: navigation start to the task table rendered and
  filterable (target < 2 s), then one text filter and one sort;
- the long attempt: navigation start to the first messages on screen, then
  scrolling to the end of what is shown, repeatedly, while a
  ``PerformanceObserver`` records long tasks (main-thread work over 50 ms):
  the page must never freeze;
- the server's time to answer the task table's data and the first
  trajectory chunk, and ``--out``'s time to write the whole site.

It reports; it does not gate. Exit status 0 unless the browser cannot run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import trio

from agentcompass._view import ROW_BUDGET_SECONDS, Site, find_runs, serve, write_site
from agentcompass._view._browser import browser_missing, open_browser

READY_TARGET_MS = 2000.0
_PAD = "x" * 120  # a typical tool output's length


def write_large_run(root: Path, tasks: int, steps: int) -> Path:
    """A finished run of ``tasks`` tasks in the store's layout; task ``huge``
    (the first) carries the ``steps``-step trajectory."""
    run_dir = root / "large" / "20260101T000000.000Z-bench"
    for severity in ("fatal", "error", "normal"):
        (run_dir / "details" / severity).mkdir(parents=True, exist_ok=True)
    categories = ["math", "code", "files", "web", "data"]
    codes = [None, None, None, ("error", "harness_timeout"), ("warning", "reward_missing"), ("fatal", "model_server_error")]
    values = []
    for i in range(tasks):
        task_id = "huge" if i == 0 else f"task-{i:06d}"
        code = codes[i % len(codes)] if i else None
        severity = {"fatal": "fatal", "error": "error"}.get(code[0], "normal") if code else "normal"
        reward = None if severity == "fatal" else float(i % 3 == 0)
        values.append(reward)
        trajectory = _trajectory(steps) if i == 0 else []
        record = {
            "task_id": task_id, "category": categories[i % len(categories)], "severity": severity,
            "attempts": [{
                "attempt": 0, "status": "completed" if severity == "normal" else "run_error",
                "values": {"reward": reward}, "retries": i % 7 == 0,
                "issues": [{"severity": code[0], "phase": "run", "code": code[1], "message": f"{code[1]} on task {i}"}] if code else [],
                "run_result": {"output": "", "trajectory": trajectory, "usage": {"prompt_tokens": 900, "completion_tokens": 80, "calls": 3},
                               "artifacts": {"verifier": {"exit_code": 0, "stdout": "ok\n", "stderr": ""}}, "issues": [], "timings": {}},
                "plan": {"task_id": task_id, "attempt": 0}, "analysis": {},
                "timings": {"setup": 0.2, "run": 3.0 + i % 11, "collect": 0.01, "evaluate": 0.4},
            }],
        }
        (run_dir / "details" / severity / f"{task_id}.json").write_text(json.dumps(record), encoding="utf-8")
    scored = [v for v in values if v is not None]
    series = {"value": None, "reference_value": sum(scored) / max(1, len(scored)), "evaluated": len(scored),
              "unavailable": 0, "invalidated": tasks - len(scored), "error": tasks // 6, "total": tasks}
    (run_dir / "metrics.json").write_text(json.dumps({"evaluation_failed": True, "series": {"reward": series}, "categories": {}}))
    (run_dir / "run_info.json").write_text(json.dumps({
        "request": {"name": "large", "benchmark": {"id": "terminal", "config": {}}, "harness": {"id": "react", "config": {}},
                    "environment": {"id": "local", "config": {}}, "execution": {"attempts": {"k": 1, "strategy": "avg"}}},
        "status": "failed", "started_at": 1_790_000_000.0, "ended_at": 1_790_003_600.0,
    }))
    (run_dir / "progress.jsonl").write_text('{"event":"run_started","t":1}\n{"event":"run_finished","t":2}\n')
    return run_dir


def _step(text: str) -> None:
    print(f"  ... {text}", file=sys.stderr, flush=True)


def _trajectory(steps: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Do it."}]
    for step in range(steps):
        messages.append({"role": "assistant", "content": f"step {step}", "step": step,
                         "tool_calls": [{"id": f"c{step}", "name": "bash", "arguments": json.dumps({"command": f"ls /app/{step}"})}],
                         "usage": {"prompt_tokens": 1000 + step, "completion_tokens": 30}, "duration_seconds": 0.8})
        messages.append({"role": "tool", "tool_call_id": f"c{step}", "name": "bash", "content": f"{step} {_PAD}", "step": step,
                         "exit_code": 0, "timed_out": False, "truncated": False, "duration_seconds": 0.02})
    return messages


_LONG_TASKS = """
window.__long = [];
new PerformanceObserver((list) => { for (const e of list.getEntries()) window.__long.push(e.duration); })
  .observe({ type: "longtask" });
"""


async def measure(run_dir: Path, out_dir: Path, profile: Path, scrolls: int) -> dict[str, Any]:
    report: dict[str, Any] = {}
    site = Site(find_runs([run_dir]), live=False)  # every row read before answering, as --out does
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve, site, 0)
        async with httpx.AsyncClient(base_url=url, timeout=600) as client:
            for name, path in (("server_run_data_all_rows_ms", "data/0/run.js"), ("server_task_ms", "data/0/task/huge.js"),
                               ("server_first_chunk_ms", "data/0/traj/huge/0-0.js"), ("server_next_chunk_ms", "data/0/traj/huge/0-1.js")):
                t0 = time.perf_counter()
                response = await client.get(path, headers={"Host": url.split("/")[2]})
                response.raise_for_status()
                report[name] = round((time.perf_counter() - t0) * 1000, 1)
            report["run_data_bytes"] = len((await client.get("data/0/run.js")).content)
        _step("server timings done; starting Chromium")
        site = Site(find_runs([run_dir]), live=True, row_budget=ROW_BUDGET_SECONDS)  # cold caches, as compass view serves
        url = await nursery.start(serve, site, 0)
        async with open_browser(profile) as browser:
            await browser.goto("about:blank")
            await browser.goto(url + "#/run/0")
            ready = await browser.wait_for("document.querySelector('#main[data-view=run][data-ready]') && window.compassReady")
            report["run_page_ready_cold_ms"] = round(ready, 1)  # includes the server's first read of every record
            await browser.goto("about:blank")
            await browser.goto(url + "#/run/0")
            ready = await browser.wait_for("document.querySelector('#main[data-view=run][data-ready]') && window.compassReady")
            report["run_page_ready_ms"] = round(ready, 1)
            report["rows_in_dom"] = len(await browser.find_all("#task-table .vt-row"))
            report["filter_ms"] = round(await browser.execute("""
                const input = document.querySelector('input[name=text]'); const t0 = performance.now();
                input.value = 'task-00001'; input.dispatchEvent(new Event('input'));
                return performance.now() - t0;"""), 1)
            report["filter_result"] = await browser.text("#task-count")
            report["sort_ms"] = round(await browser.execute("""
                const input = document.querySelector('input[name=text]'); input.value = ''; input.dispatchEvent(new Event('input'));
                const head = document.querySelectorAll('#task-table .vt-head div')[7]; const t0 = performance.now();
                head.click(); return performance.now() - t0;"""), 1)

            _step("run page done; opening the long attempt on a fresh server")
            # A fresh server: nothing cached, its background pass just started.
            cold_site = Site(find_runs([run_dir]), live=True, row_budget=ROW_BUDGET_SECONDS)
            cold_url = await nursery.start(serve, cold_site, 0)
            await browser.goto("about:blank")
            await browser.goto(cold_url + "#/run/0/task/huge/0")
            first = await browser.wait_for("window.compassFirstMessages")
            report["trajectory_first_messages_cold_ms"] = round(first, 1)  # includes reading the 55 MB record
            report["cold_records_read"] = cold_site.runs[0].records_read
            await browser.goto("about:blank")
            await browser.goto(url + "#/run/0/task/huge/0")
            first = await browser.wait_for("window.compassFirstMessages")
            report["trajectory_first_messages_ms"] = round(first, 1)
            await browser.execute(_LONG_TASKS)
            t0 = time.perf_counter()
            _step("first messages shown; scrolling")
            for _ in range(scrolls):
                shown = int(await browser.execute("return +document.querySelector('#trajectory').dataset.shown"))
                await browser.execute("window.scrollTo(0, document.body.scrollHeight)")
                await browser.wait_for(f"+document.querySelector('#trajectory').dataset.shown > {shown}")
            report["scrolls"] = scrolls
            report["scroll_batches_s"] = round(time.perf_counter() - t0, 2)
            report["messages_shown"] = int(await browser.execute("return +document.querySelector('#trajectory').dataset.shown"))
            report["messages_total"] = int(await browser.execute("return document.querySelector('#trajectory-more').textContent.split(' of ')[1]?.split(' ')[0].replace(/,/g, '') || 0"))
            # A frame's delay right now: does the page still respond?
            report["frame_delay_ms"] = round(await browser.execute_async(
                "const done = arguments[0]; const t0 = performance.now(); requestAnimationFrame(() => done(performance.now() - t0));"), 1)
            long_tasks = await browser.execute("return window.__long")
            report["long_tasks"] = len(long_tasks)
            report["longest_task_ms"] = round(max(long_tasks, default=0.0), 1)
        nursery.cancel_scope.cancel()
    _step("browser done; writing the static site")
    t0 = time.perf_counter()
    files = await trio.to_thread.run_sync(write_site, Site(find_runs([run_dir]), live=False), out_dir)
    report["static_out_s"] = round(time.perf_counter() - t0, 2)
    report["static_out_files"] = files
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.view", description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--scrolls", type=int, default=20)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: a check that the bench runs")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args(argv)
    if args.smoke:
        args.tasks, args.steps, args.scrolls = 60, 700, 3
    missing = browser_missing()
    if missing:
        print(f"bench.view: {missing}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="bench-view-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        run_dir = write_large_run(root / "runs", args.tasks, args.steps)
        _step(f"run written in {time.perf_counter() - t0:.1f} s")
        written = time.perf_counter() - t0
        (root / "profile").mkdir()
        report = trio.run(measure, run_dir, root / "site", root / "profile", args.scrolls)
        report = {"tasks": args.tasks, "steps": args.steps, "fixture_write_s": round(written, 2),
                  "huge_record_mb": round(os.path.getsize(run_dir / "details" / "normal" / "huge.json") / 1e6, 1), **report}
    verdict = "met" if report["run_page_ready_ms"] < READY_TARGET_MS else "MISSED"
    print(f"viewer bench: {args.tasks:,} tasks, a {args.steps:,}-step trajectory")
    for key, value in report.items():
        print(f"  {key:30} {value}")
    print(f"  run page ready {report['run_page_ready_ms']} ms vs target {READY_TARGET_MS:.0f} ms: {verdict}"
          f" (first load after the server started: {report['run_page_ready_cold_ms']} ms)")
    print(f"  longest main-thread task while scrolling the trajectory: {report['longest_task_ms']} ms")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
