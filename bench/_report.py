"""Turn scenario results into target rows and a Markdown table."""

from __future__ import annotations

import math
import statistics
from typing import Any

from ._agent import agent_rows
from ._ray import ray_rows

__all__ = ["render_table", "targets"]


def _row(scenario: str, metric: str, measured: Any, target: str, ok: bool | None, fmt: str = "{:.2f}") -> dict[str, Any]:
    shown = "n/a" if measured is None or (isinstance(measured, float) and math.isnan(measured)) else fmt.format(measured)
    return {
        "scenario": scenario,
        "metric": metric,
        "measured": measured,
        "shown": shown,
        "target": target,
        "ok": ok,
    }


#: The latency-bound scenario's context rows: (result key, metric, scale, format).
_LATENCY_CONTEXT = (
    ("bare_trio_wall_over_ideal", "bare Trio loop wall / ideal", 1, "{:.3f}"),
    ("trio_thread_us_per_attempt", "Trio-thread CPU us/attempt", 1, "{:.0f}"),
    ("bare_trio_cpu_budget_us", "CPU us/attempt a bare loop may spend for 1.10", 1, "{:.0f}"),
    ("before_first_attempt_s", "ms from launch to the first attempt", 1e3, "{:.0f}"),
    ("after_last_record_s", "ms from the last record durable to return", 1e3, "{:.0f}"),
    ("engine_only_wall_over_ideal", "attempt engine alone (no scheduler, no store) wall / ideal", 1, "{:.3f}"),
    ("engine_only_us_per_attempt", "attempt engine alone, CPU us/attempt", 1, "{:.0f}"),
    ("yielding_env_wall_over_ideal", "wall / ideal, environment open yields once", 1, "{:.3f}"),
    ("split_wall_over_ideal", "split over {split_processes} processes (tasks and concurrency shared) wall / ideal", 1, "{:.3f}"),
)


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per target of the performance issue (and a few context rows, ``ok`` None)."""
    rows: list[dict[str, Any]] = []
    r = results.get("overhead")
    if r and "error" not in r:
        rows.append(_row("overhead-bound", "attempts/s", r["attempts_per_s"], ">= 2000", r["attempts_per_s"] >= 2000, "{:.0f}"))
        cpu = r["cpu_us_per_attempt"]
        rows.append(_row("overhead-bound", "CPU us/attempt, persistence included", cpu, "<= 500", cpu <= 500, "{:.0f}"))
    r = results.get("overhead_k3")
    if r and "error" not in r:
        rows.append(_row(f"overhead-bound, k = {r['k']}", "attempts/s", r["attempts_per_s"], "(context)", None, "{:.0f}"))
    i = results.get("inspect")
    if i and i.get("ratio_overhead") is not None:
        ratio = i["ratio_overhead"]
        rows.append(_row("overhead-bound", "x Inspect AI samples/s", ratio, ">= 40", ratio >= 40, "{:.1f}"))
    elif i:
        rows.append(_row("overhead-bound", "x Inspect AI samples/s", None, ">= 40", None))
    r = results.get("latency")
    if r and "error" not in r:
        ratio = r["wall_over_ideal"]
        rows.append(_row("latency-bound", "wall / ideal", ratio, "<= 1.10", ratio <= 1.10, "{:.3f}"))
        for key, metric, scale, fmt in _LATENCY_CONTEXT:
            if r.get(key) is not None:
                rows.append(_row("latency-bound", metric.format_map(r), r[key] * scale, "(context)", None, fmt))
    if i and i.get("ratio_latency") is not None:
        rows.append(_row("latency-bound", "Inspect AI wall / ideal", i["inspect_latency_wall_over_ideal"], "(context)", None, "{:.3f}"))
    r = results.get("memory")
    if r and "error" not in r:
        kb = r["rss_bytes_per_pending_task"] / 1024
        rows.append(_row("memory", "KB RSS per pending task", kb, "<= 4", kb <= 4, "{:.2f}"))
    r = results.get("shutdown")
    if r and "error" not in r:
        ok = r["shutdown_s"] <= r["target_s"] and bool(r["all_closed"])
        rows.append(_row("shutdown", "s deadline -> exit, all closed", r["shutdown_s"], f"<= {r['target_s']:.1f} (grace + 0.5)", ok, "{:.2f}"))
        rows.append(_row("shutdown", "sessions left open", r["open_at_exit"] + r["journal_unclosed"], "0", r["all_closed"], "{:.0f}"))
    r = results.get("reuse")
    if r and "error" not in r:
        rows.append(_row("reuse", "s to first new attempt", r["first_attempt_s"], "<= 3", r["first_attempt_s"] <= 3, "{:.2f}"))
    r = results.get("open_rate")
    if r and "error" not in r:
        dev = r["deviation"]
        rows.append(_row("open rate", "achieved / configured - 1", dev * 100, "within +-2 %", abs(dev) <= 0.02, "{:+.2f} %"))
    r = results.get("remote_exec")
    if r and "error" not in r:
        rows.append(_row("remote", "ms exec('true') round trip, loopback (median)", r["median_ms"], "<= 5", r["median_ms"] <= 5, "{:.2f}"))
    r = results.get("remote_sessions")
    if r and "error" not in r:
        metric = f"{r['sessions']} sessions across {r['servers']} servers: driver CPU us/session"
        rows.append(_row("remote", metric, r["driver_cpu_us_per_session"], "(reported)", r["failed"] == 0, "{:.0f}"))
        rows.append(_row("remote", "wall s for those sessions (open, exec, close)", r["wall_s"], "(context)", None, "{:.1f}"))
    r = results.get("remote_stream")
    if r and "error" not in r:
        rows.append(_row("remote", f"MiB/s of {r['mib']} MiB out of one exec", r["mib_per_s"], ">= 100", r["mib_per_s"] >= 100, "{:.0f}"))
        if r.get("server_cpu_s") is not None:
            rows.append(_row("remote", "CPU s for that stream: driver + server process (its start and the command included)", r["driver_cpu_s"] + r["server_cpu_s"], "(context)", None, "{:.2f}"))
    rows.extend(agent_rows(results, _row))
    r = results.get("gateway")
    if r and "error" not in r:
        name = f"gateway: installed noop-agent vs react, {r['calls_per_attempt']} model calls per attempt"
        rows.append(_row(name, "runtime CPU ms per attempt, installed (gateway)", r["installed_cpu_ms_per_attempt"], "(context)", None, "{:.1f}"))
        rows.append(_row(name, "runtime CPU ms per attempt, react", r["react_cpu_ms_per_attempt"], "(context)", None, "{:.1f}"))
        rows.append(_row(name, "children CPU ms per attempt, installed / react", r["installed_children_cpu_ms_per_attempt"], "(context)", None, "{:.1f}"))
        rows.append(_row(name, "wall ms per attempt, installed / react", r["installed_wall_ms_per_attempt"] / r["react_wall_ms_per_attempt"], "(context)", None, "{:.2f}"))
    rows.extend(ray_rows(results, _row))
    r = results.get("sandbox")
    if r and "error" not in r:
        name = f"sandbox open + close ({r['sessions']} at concurrency {r['concurrency']})"
        for policy in ("none", "full"):
            median, p95 = r.get(f"{policy}_median_ms"), r.get(f"{policy}_p95_ms")
            if median is not None:
                rows.append(_row(name, f"median ms, policy {policy}", median, "<= 60", median <= 60, "{:.1f}"))
                rows.append(_row(name, f"p95 ms, policy {policy}", p95, "<= 150", p95 <= 150, "{:.1f}"))
            if r.get(f"{policy}_cpu_ms_per_session") is not None:
                rows.append(_row(name, f"CPU ms per open + close, all processes, policy {policy}", r[f"{policy}_cpu_ms_per_session"], "(context)", None, "{:.1f}"))
        if r.get("none_serial_median_ms") is not None:
            rows.append(_row("sandbox open + close, one at a time", "median ms, policy none", r["none_serial_median_ms"], "(context)", None, "{:.1f}"))
        ok = r["held_errors"] == 0 and r["held_alive"] == r["held"]
        rows.append(_row("sandbox held at once", "sessions each running a process, errors", r["held_errors"], f"0 of {r['held']}", ok, "{:.0f}"))
        rows.append(_row("sandbox", "resources left after the run", r["leftover"], "0", r["leftover"] == 0, "{:.0f}"))
    r = results.get("docker")
    if r and "error" not in r:
        name = f"docker open + close, built image ({r['sessions']} at concurrency {r['concurrency']})"
        rows.append(_row(name, "median ms, policy full", r["open_close_median_ms"], "<= 600", r["open_close_median_ms"] <= 600, "{:.0f}"))
        rows.append(_row(name, "p95 ms, policy full", r["open_close_p95_ms"], "(context)", None, "{:.0f}"))
        rows.append(_row("docker exec('true')", f"median ms of {r['execs']} round trips", r["exec_median_ms"], "<= 30", r["exec_median_ms"] <= 30, "{:.1f}"))
        if r.get("cli_exec_median_ms") is not None:
            rows.append(_row("docker exec CLI (same container)", "median ms of `docker exec C true`", r["cli_exec_median_ms"], "(context)", None, "{:.0f}"))
        rows.append(_row("docker image", "builds: first run / second run", f"{r['first_run_builds']} / {r['second_run_builds']}", "1 / 0", (r["first_run_builds"], r["second_run_builds"]) == (1, 0), "{}"))
        rows.append(_row("docker", "containers and networks left after the run", r["leftover"], "0", r["leftover"] == 0, "{:.0f}"))
    r = results.get("images")
    if r and "error" not in r:
        name = f"sandbox with images vs docker, one image ({r['sessions']} at concurrency {r['concurrency']})"
        d, s = r["docker"], r["sandbox"]
        rows.append(_row(name, "open + close median ms, sandbox / docker", f"{s['open_close_median_ms']:.0f} / {d['open_close_median_ms']:.0f}", "(context)", None, "{}"))
        rows.append(_row(name, "open + close speedup (docker median / sandbox median)", r["open_close_speedup"], ">= 10", r["open_close_speedup"] >= 10, "{:.1f}"))
        rows.append(_row(name, f"exec('true') median ms of {r['execs']}, sandbox / docker", f"{s['exec_median_ms']:.1f} / {d['exec_median_ms']:.1f}", "(context)", None, "{}"))
        rows.append(_row(name, "exec speedup (docker median / sandbox median)", r["exec_speedup"], ">= 5", r["exec_speedup"] >= 5, "{:.1f}"))
        rows.append(_row("sandbox image root", "unpacks: first run / second run (builds 0)", f"{r['first_run_unpacks']} / {r['second_run_unpacks']}", "1 / 0", (r["first_run_unpacks"], r["second_run_unpacks"], r["second_run_builds"]) == (1, 0, 0), "{}"))
        rows.append(_row("sandbox with images", "overlays and containers left after the run", r["leftover"], "0", r["leftover"] == 0, "{:.0f}"))
    probes = results.get("host", {}).get("cpu_probe_ms")
    if probes:
        rows.append(_row("host", "ms of CPU for a fixed Python loop, before each run (median)", statistics.median(probes), "(context)", None, "{:.1f}"))
        rows.append(_row("host", "slowest / fastest of those", max(probes) / min(probes), "(context)", None, "{:.2f}"))
    r = results.get("disk")
    if r:
        rows.append(_row("disk", "us to create a file, before the scenarios", r["file_create_us"], "(context)", None, "{:.0f}"))
    return rows


def render_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| scenario | metric | measured | target | met |",
        "|---|---|---:|---|:---:|",
    ]
    for row in rows:
        met = {True: "yes", False: "**no**", None: ""}[row["ok"]]
        lines.append(f"| {row['scenario']} | {row['metric']} | {row['shown']} | {row['target']} | {met} |")
    return "\n".join(lines)
