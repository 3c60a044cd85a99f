"""``python -m bench.view [--tasks N] [--steps N] [--smoke]``: the viewer at scale.

Writes a synthetic run of ``--tasks`` tasks (10,000) whose first task's
attempt has a trajectory of ``--steps`` agent steps (100,000: an assistant
message with a tool call and its tool result each), writes it with
``--out`` and serves it with ``compass view``'s server, and drives headless
Chromium through it:

- the run page, navigation start to the task table rendered and filterable:
  cold (a fresh server, nothing read yet), warm (the same server again), and
  the static copy opened from disk (warm and static: the median of five
  navigations, alternating); one text filter and one sort;
- the long attempt: its first messages; a scroll from the first message to
  the last and back by the scrollbar (a new position every frame), with the
  longest frame, long tasks, and the renderer's memory after it; a search
  for a message near the end, from the first;
- ``--out``: its files and time; the server's time to answer the run page
  warm and a trajectory chunk.

It reports; it does not gate. Exit status 0 unless the browser cannot run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import trio

from agentcompass._store._index import task_row
from agentcompass._store._layout import SEVERITIES, RunLayout
from agentcompass._store._trajectories import split_trajectories
from agentcompass._view import CHUNK_STEPS, ROW_BUDGET_SECONDS, Site, find_runs, serve, write_site
from agentcompass._view._browser import browser_missing, open_browser

_PAD = "x" * 120  # a typical tool output's length
_WARM_ROUNDS = 5


def write_large_run(root: Path, tasks: int, steps: int, *, split: bool = True) -> Path:
    """A finished run of ``tasks`` tasks in the store's layout; task ``huge``
    (the first) carries the ``steps``-step trajectory, beside its record as
    the store writes it (``split``, with the store's ``index.jsonl``) or
    inline as records of earlier versions (no index)."""
    run_dir = root / "large" / "20260101T000000.000Z-bench"
    layout = RunLayout(run_dir)
    for severity in SEVERITIES:
        os.makedirs(layout.severity_dir(severity), exist_ok=True)
    categories = ["math", "code", "files", "web", "data"]
    index: list[str] = []
    codes = [None, None, None, ("error", "harness_timeout"), ("warning", "reward_missing"), ("fatal", "model_server_error")]
    values = []
    for i in range(tasks):
        task_id = "huge" if i == 0 else f"task-{i:06d}"
        code = codes[i % len(codes)] if i else None
        severity = {"fatal": "fatal", "error": "error"}.get(code[0], "normal") if code else "normal"
        reward = None if severity == "fatal" else float(i % 3 == 0)
        values.append(reward)
        trajectory = _trajectory(steps) if i == 0 else []
        record: dict[str, Any] = {
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
        if split:  # as the store writes a long trajectory: beside the record, 500 messages a file
            for path, messages in split_trajectories(record["attempts"], layout, task_id):
                os.makedirs(os.path.dirname(path), exist_ok=True)
                Path(path).write_text(json.dumps(messages, separators=(",", ":")), encoding="utf-8")
        data = json.dumps(record).encode()
        Path(layout.record(severity, task_id)).write_bytes(data)
        if split:  # and its index line, as the store appends it
            index.append(json.dumps({"bytes": len(data), **task_row(record)}, separators=(",", ":")))
    scored = [v for v in values if v is not None]
    series = {"value": None, "reference_value": sum(scored) / max(1, len(scored)), "evaluated": len(scored),
              "unavailable": 0, "invalidated": tasks - len(scored), "error": tasks // 6, "total": tasks}
    Path(layout.metrics).write_text(json.dumps({"evaluation_failed": True, "series": {"reward": series}, "categories": {}}))
    Path(layout.run_info).write_text(json.dumps({
        "request": {"name": "large", "benchmark": {"id": "terminal", "config": {}}, "harness": {"id": "react", "config": {}},
                    "environment": {"id": "local", "config": {}}, "execution": {"attempts": {"k": 1, "strategy": "avg"}}},
        "status": "failed", "started_at": 1_790_000_000.0, "ended_at": 1_790_003_600.0,
    }))
    if index:
        Path(layout.index).write_text("\n".join(index) + "\n")
    Path(layout.progress_lines).write_text('{"event":"run_started","t":1}\n{"event":"run_finished","t":2}\n')
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

# Drag the scrollbar from the first message to the last and back, one position
# a frame; the frames' lengths, and whether the last message was reached.
_SCROLL = """
const [frames] = arguments;
window.__scroll = null;
const box = document.querySelector('#trajectory-box'), traj = document.querySelector('#trajectory');
const max = box.scrollHeight - box.clientHeight, deltas = [];
let last = performance.now(), k = 0, reached = -1, dom = 0;
function step(t) {
  deltas.push(t - last); last = t;
  dom = Math.max(dom, document.getElementsByTagName('*').length);
  if (k === frames + 1) reached = +traj.dataset.last;
  if (k > 2 * frames) { window.__scroll = { longest: Math.max(...deltas.slice(1)), frames: deltas.length, reached, first: +traj.dataset.first, dom }; return; }
  box.scrollTop = (k <= frames ? k / frames : 2 - k / frames) * max;
  k++;
  requestAnimationFrame(step);
}
requestAnimationFrame(step);
"""

# The same frames on the same page with nothing to do: the host's own floor.
_IDLE = """
const [frames] = arguments;
window.__idle = null;
const deltas = [];
let last = performance.now(), k = 0;
function step(t) {
  deltas.push(t - last); last = t;
  if (k++ > 2 * frames) { window.__idle = Math.max(...deltas.slice(1)); return; }
  requestAnimationFrame(step);
}
requestAnimationFrame(step);
"""

_READY = "document.querySelector('#main[data-view=run][data-ready]') && window.compassReady"


def renderer_mb(profile: Path) -> tuple[float, float]:
    """The largest private memory (what Chrome's task manager calls its
    footprint: private pages, resident or swapped) and resident set among the
    Chromium renderers of the browser using ``profile`` (its pages run in
    them), in MB."""
    procs: dict[int, tuple[int, str]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                cmdline = f.read().decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        procs[int(entry.name)] = (ppid, cmdline)
    roots = {pid for pid, (_, cmd) in procs.items() if f"--user-data-dir={profile}" in cmd}
    largest, largest_rss = 0, 0
    for pid, (ppid, cmd) in procs.items():
        if "--type=renderer" not in cmd:
            continue
        parent, seen = ppid, 0
        while parent not in roots and parent in procs and seen < 10:
            parent, seen = procs[parent][0], seen + 1
        if parent in roots:
            try:
                with open(f"/proc/{pid}/smaps_rollup") as f:
                    fields = {line.split(":")[0]: int(line.split()[1]) for line in f if line.split()[-1:] == ["kB"]}
            except (OSError, ValueError, IndexError):
                continue
            private = fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0) + fields.get("Swap", 0)
            largest, largest_rss = max(largest, private), max(largest_rss, fields.get("Rss", 0))
    return round(largest / 1024, 1), round(largest_rss / 1024, 1)


def _bytes_under(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


async def measure(run_dir: Path, out_dir: Path, profile: Path, steps: int, frames: int) -> dict[str, Any]:
    report: dict[str, Any] = {}
    t0 = time.perf_counter()
    files = await trio.to_thread.run_sync(write_site, Site(find_runs([run_dir]), live=False, static=True), out_dir)
    report["static_out_s"] = round(time.perf_counter() - t0, 2)
    report["static_out_files"] = files
    report["static_out_mb"] = round(await trio.to_thread.run_sync(_bytes_under, out_dir) / 1e6, 1)
    _step("static site written; starting Chromium")
    async with trio.open_nursery() as nursery:
        site = Site(find_runs([run_dir]), live=True, row_budget=ROW_BUDGET_SECONDS)  # as compass view serves
        url = await nursery.start(serve, site, 0)
        async with open_browser(profile, flags=("--js-flags=--expose-gc",)) as browser:
            await browser.goto("about:blank")
            await browser.goto(url + "#/run/0")
            report["run_page_ready_cold_ms"] = round(await browser.wait_for(_READY), 1)  # the server's first read included
            report["cold_pending_rows"] = await browser.execute("return document.querySelector('#live').textContent")
            await browser.wait_for("document.querySelector('#live').textContent === ''")  # every row read
            # Warm (the browser's cache and the server's) against the static
            # copy: alternating, after one of each to warm both, the median.
            ready: dict[str, list[float]] = {"warm": [], "static": []}
            for _ in range(1 + _WARM_ROUNDS):
                for name, page in (("warm", url), ("static", (out_dir / "index.html").as_uri())):
                    await browser.goto("about:blank")
                    await browser.goto(page + "#/run/0")
                    ready[name].append(await browser.wait_for(_READY))
            for name, times in ready.items():
                report[f"run_page_ready_{name}_ms"] = round(statistics.median(times[1:]), 1)
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
            async with httpx.AsyncClient(base_url=url, timeout=600) as client:
                for name, path in (("server_run_data_warm_ms", "data/0/run.js"), ("server_chunk_ms", f"data/0/traj/huge/0-{steps // 5 // CHUNK_STEPS}.js")):
                    t0 = time.perf_counter()
                    response = await client.get(path)
                    response.raise_for_status()
                    report[name] = round((time.perf_counter() - t0) * 1000, 1)
                report["run_data_bytes"] = len((await client.get("data/0/run.js")).content)

            _step("run page done; the long attempt")
            await browser.goto("about:blank")
            await browser.goto(url + "#/run/0/task/huge/0")
            report["trajectory_first_messages_ms"] = round(await browser.wait_for("window.compassFirstMessages"), 1)
            await browser.wait_for("document.querySelector('#trajectory-box') && document.querySelector('#trajectory').dataset.first === '0'")
            await browser.execute(_IDLE, frames)
            report["idle_longest_frame_ms"] = round(await browser.wait_for("window.__idle"), 1)
            await browser.execute(_LONG_TASKS)
            await browser.execute(_SCROLL, frames)
            scroll = await browser.wait_for("window.__scroll")
            report["scroll_frames"] = scroll["frames"]
            report["scroll_longest_frame_ms"] = round(scroll["longest"], 1)
            report["scroll_reached_message"] = scroll["reached"]
            report["scroll_back_at_message"] = scroll["first"]
            report["scroll_max_dom_elements"] = scroll["dom"]
            long_tasks = await browser.execute("return window.__long")
            report["scroll_long_tasks"] = len(long_tasks)
            report["scroll_longest_task_ms"] = round(max(long_tasks, default=0.0), 1)
            report["renderer_private_mb"], report["renderer_rss_mb"] = renderer_mb(profile)
            report["js_heap_mb"] = round(await browser.execute("return performance.memory.usedJSHeapSize") / 1e6, 1)
            report["js_heap_after_gc_mb"] = round(await browser.execute("window.gc(); return performance.memory.usedJSHeapSize") / 1e6, 1)
            # A message near the end, searched for from the first.
            target = 2 + 2 * (steps - 10)
            await browser.execute("""
                const q = document.querySelector('input[name=find]'); q.value = arguments[0];
                q.dispatchEvent(new Event('input')); document.querySelector('#find-next').click();""", f"ls /app/{steps - 10}\"")
            await browser.wait_for(f"document.querySelector('#trajectory').dataset.match === '{target}'")
            report["search_near_end_ms"] = round(await browser.execute("return window.compassFound"), 1)
            report["renderer_private_mb_after_search"] = renderer_mb(profile)[0]
        nursery.cancel_scope.cancel()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.view", description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--frames", type=int, default=300, help="frames of the scroll each way")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: a check that the bench runs")
    parser.add_argument("--inline", action="store_true", help="the long trajectory inside its record, as earlier versions wrote it")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args(argv)
    if args.smoke:
        args.tasks, args.steps, args.frames = 60, 700, 20
    missing = browser_missing()
    if missing:
        print(f"bench.view: {missing}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="bench-view-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        run_dir = write_large_run(root / "runs", args.tasks, args.steps, split=not args.inline)
        _step(f"run written in {time.perf_counter() - t0:.1f} s")
        written = time.perf_counter() - t0
        (root / "profile").mkdir()
        report = trio.run(measure, run_dir, root / "site", root / "profile", args.steps, args.frames)
        report = {"tasks": args.tasks, "steps": args.steps, "fixture_write_s": round(written, 2),
                  "layout": "inline" if args.inline else "split",
                  "huge_task_mb": round(_bytes_under(Path(RunLayout(run_dir).task_dir("huge"))) / 1e6 + os.path.getsize(RunLayout(run_dir).record("normal", "huge")) / 1e6, 1), **report}
    print(f"viewer bench: {args.tasks:,} tasks, a {args.steps:,}-step trajectory")
    for key, value in report.items():
        print(f"  {key:30} {value}")
    checks = [
        ("run page ready cold <= 1000 ms", report["run_page_ready_cold_ms"] <= 1000),
        ("run page ready warm <= 300 ms", report["run_page_ready_warm_ms"] <= 300),
        ("served warm no slower than the static copy", report["run_page_ready_warm_ms"] <= report["run_page_ready_static_ms"]),
        ("no scroll frame over 100 ms", report["scroll_longest_frame_ms"] <= 100),
        ("renderer under 200 MB (private memory)", report["renderer_private_mb"] < 200),
        ("search near the end < 500 ms", report["search_near_end_ms"] < 500),
        ("--out at most a few hundred files", report["static_out_files"] <= 300),
    ]
    for name, met in checks:
        print(f"  {name}: {'met' if met else 'MISSED'}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
