"""The viewer's pages driven in a real headless Chromium: a demo run, an agent
run, a comparison, static files opened from disk, large runs and a live run.
Each test saves screenshots of the pages it saw under its temp directory."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import trio
from view_helpers import (
    COMPASS,
    LEAKY_KEY,
    agent_trajectory,
    append_events,
    attempt,
    metrics_for,
    task,
    wait_ready,
    write_json,
    write_run,
    writer_lock,
)

from agentcompass._view import Site, find_runs, serve
from agentcompass._view._browser import Browser

HANG_GUARD = 120


async def test_demo_run_filter_to_failing_task_and_see_its_verifier_output(
    demo_run: Path, viewer, browser: Browser, tmp_path: Path
) -> None:
    record = json.loads((demo_run / "details" / "normal" / "reverse-lines.json").read_text())
    artifacts = record["attempts"][0]["run_result"]["artifacts"]
    verifier, harness = artifacts["verifier"], artifacts["harness_command"]

    with trio.fail_after(HANG_GUARD):
        url = await viewer([demo_run])
        await browser.goto(url + "#/run/0")
        await wait_ready(browser, "run")
        assert await browser.text("#task-count") == "12 of 12 tasks"
        assert "0.8333" in await browser.text("#score")
        await browser.screenshot(tmp_path / "demo-run.png")

        await browser.click("select[name=outcome] option[value=fail]")
        assert await browser.text("#task-count") == "2 of 12 tasks"  # reverse-lines, and make-dirs scored 0
        await browser.type("input[name=text]", "reverse")
        assert await browser.text("#task-count") == "1 of 12 tasks"
        await browser.screenshot(tmp_path / "demo-run-filtered.png")
        links = await browser.execute("return [...document.querySelectorAll('#task-table a.task-link')].map(a => a.textContent)")
        assert links == ["reverse-lines"]

        await browser.click("#task-table a.task-link")
        await wait_ready(browser, "attempt")
        assert "reverse-lines" in await browser.text("h1")
        panel = await browser.text("#verifier")
        assert panel.startswith(f"exit code {verifier['exit_code']}\nstdout\n")
        for stream in ("stdout", "stderr"):
            assert (verifier[stream].strip().splitlines() or ["(empty)"])[-1] in panel
        assert (await browser.text("#harness-command")).startswith(f"exit code {harness['exit_code']}")
        await browser.screenshot(tmp_path / "demo-attempt.png")


async def test_agent_demo_run_shows_the_agents_tool_calls(
    agent_demo_run: Path, viewer, browser: Browser, tmp_path: Path
) -> None:
    (path,) = agent_demo_run.glob("details/*/hello-file.json")  # "normal" unless a slow host timed the agent out
    record = json.loads(path.read_text())
    trajectory = record["attempts"][0]["run_result"]["trajectory"]
    expected = [(c["name"], json.loads(c["arguments"])) for m in trajectory for c in m.get("tool_calls") or []]
    assert len(expected) >= 2
    with trio.fail_after(HANG_GUARD):
        url = await viewer([agent_demo_run])
        await browser.goto(url + "#/run/0")
        await wait_ready(browser, "run")
        await browser.type("input[name=text]", "hello")
        await browser.click("#task-table a.task-link")
        await wait_ready(browser, "attempt")
        await browser.wait_for(f"document.querySelector('#trajectory').dataset.shown === '{len(trajectory)}'")
        calls = await browser.execute(
            "return [...document.querySelectorAll('.tool-call')].map(c => [c.querySelector('.name').textContent, c.querySelector('pre').textContent])")
        assert [(name, json.loads(args)) for name, args in calls] == expected
        results = await browser.execute("return [...document.querySelectorAll('.msg.tool pre')].map(p => p.textContent)")
        assert results == [m["content"] for m in trajectory if m["role"] == "tool"]
        await browser.screenshot(tmp_path / "agent-demo-attempt.png")


async def test_agent_run_shows_tool_calls_results_and_usage(
    agent_run: Path, viewer, browser: Browser, tmp_path: Path
) -> None:
    with trio.fail_after(HANG_GUARD):
        url = await viewer([agent_run])
        await browser.goto(url + "#/run/0")
        await wait_ready(browser, "run")
        await browser.click("select[name=code] option[value='error:harness_max_iterations']")
        assert await browser.text("#task-count") == "1 of 2 tasks"
        await browser.click("#task-table a.task-link")
        await wait_ready(browser, "attempt")
        await browser.wait_for("document.querySelector('#trajectory').dataset.shown === '9'")

        calls = await browser.execute(
            "return [...document.querySelectorAll('.tool-call')].map(c => c.querySelector('.name').textContent + ' ' + c.querySelector('pre').textContent)")
        assert len(calls) == 3
        assert calls[0].startswith("bash ") and '"command": "wc -l /app/data-0.txt"' in calls[0]
        roles = await browser.execute("return [...document.querySelectorAll('.msg')].map(m => m.dataset.role)")
        assert roles == ["system", "user"] + ["assistant", "tool"] * 3 + ["assistant"]
        usage = await browser.execute("return [...document.querySelectorAll('.msg .usage')].map(u => u.textContent)")
        assert usage[0] == "100 prompt · 20 completion tokens"
        tool = await browser.text(".msg.tool .exit")
        assert tool == "exit 0"

        # The 400-line tool output is folded, and unfolds on request.
        first_tool = ".msg.tool .folded"
        assert "line 399" not in await browser.text(first_tool + " pre")
        await browser.click(first_tool + " button.fold")
        assert "line 399" in await browser.text(first_tool + " pre")

        assert "HTTP 503" in await browser.text("#discarded")
        assert "harness_max_iterations" in await browser.text("#issues")
        assert "FAILED test_count" in await browser.text("#verifier")
        # Data is text, never markup: the model's "HTML" shows as written and runs nothing.
        assert '<img src=x onerror="window.pwned=1">' in await browser.text(".msg:last-child pre")
        assert await browser.execute("return window.pwned === undefined && !document.querySelector('#trajectory img')")
        html = await browser.execute("return document.documentElement.outerHTML")
        assert LEAKY_KEY not in html and "**********" in html
        await browser.screenshot(tmp_path / "agent-attempt.png")


async def test_compare_two_runs_per_task_and_category(viewer, browser: Browser, tmp_path: Path) -> None:
    cats = {"a": "math", "b": "math", "c": "code", "d": "code"}
    before = {"a": 1.0, "b": 0.0, "c": 1.0, "d": 0.0}
    after = {"a": 1.0, "b": 1.0, "c": 0.0, "d": 1.0}
    dirs = []
    for run_id, values in (("20260101T000000.000Z-0001", before), ("20260102T000000.000Z-0002", after)):
        tasks = [task(t, attempt(values={"reward": v}), category=cats[t]) for t, v in values.items()]
        dirs.append(write_run(tmp_path / "runs", "bench", run_id, tasks, metrics=metrics_for(values, cats)))
    with trio.fail_after(HANG_GUARD):
        url = await viewer([tmp_path / "runs"])
        await browser.goto(url + "#/")
        await wait_ready(browser, "index")
        await browser.click("input[data-run='0']")
        await browser.click("input[data-run='1']")
        await browser.click("#compare-btn")
        await wait_ready(browser, "compare")
        assert await browser.text("#compare-count") == "3 of 4 tasks"  # changed outcome only
        rows = await browser.execute(
            "return [...document.querySelectorAll('#compare-tasks .vt-row')].map(r => [...r.children].map(c => c.textContent))")
        by_task = {r[0]: r for r in rows}
        assert set(by_task) == {"b", "c", "d"}
        # Oldest run first, whatever the order they were picked or listed in.
        assert [by_task[t][-1] for t in "bcd"] == ["better", "worse", "better"]
        assert by_task["c"][2].startswith("1") and by_task["c"][3].startswith("0")
        categories = await browser.text("#compare-categories")
        assert "math" in categories and "code" in categories
        assert "+0.25" in await browser.text("#compare-series")
        await browser.screenshot(tmp_path / "compare.png")
        await browser.click("input[name=changed]")
        assert await browser.text("#compare-count") == "4 of 4 tasks"


async def test_static_pages_open_from_disk(agent_run: Path, browser: Browser, tmp_path: Path) -> None:
    out = tmp_path / "site"
    with trio.fail_after(60):
        await trio.run_process([COMPASS, "view", str(agent_run), "--out", str(out)], capture_stdout=True, capture_stderr=True)
    with trio.fail_after(HANG_GUARD):
        await browser.goto((out / "index.html").as_uri() + "#/run/0")
        await wait_ready(browser, "run")
        assert await browser.text("#task-count") == "2 of 2 tasks"
        await browser.type("input[name=text]", "hello")
        await browser.click("#task-table a.task-link")
        await wait_ready(browser, "attempt")
        await browser.wait_for("document.querySelector('#trajectory').dataset.shown === '4'")
        assert len(await browser.find_all(".tool-call")) == 1
        await browser.screenshot(tmp_path / "static-attempt.png")


async def test_large_task_table_renders_only_visible_rows(viewer, browser: Browser, tmp_path: Path) -> None:
    n = 3000
    tasks = [task(f"task-{i:05d}", attempt(values={"reward": float(i % 3 == 0)})) for i in range(n)]
    run_dir = write_run(tmp_path / "runs", "big", "20260101T000000.000Z-0001", tasks)
    with trio.fail_after(HANG_GUARD):
        url = await viewer([run_dir])
        await browser.goto(url + "#/run/0")
        await wait_ready(browser, "run")
        assert await browser.text("#task-count") == f"{n:,} of {n:,} tasks"
        assert len(await browser.find_all("#task-table .vt-row")) < 100
        await browser.execute("document.querySelector('#task-table .vt-body').scrollTop = 1e9")
        await browser.wait_for("[...document.querySelectorAll('#task-table .vt-row a')].some(a => a.textContent === 'task-02999')")
        await browser.type("input[name=text]", "task-0299")
        assert await browser.text("#task-count") == f"10 of {n:,} tasks"


class _SlowRunList(Site):
    """The viewer's site, answering ``data/runs.js`` (which the page loads with
    its script) only after a pause."""

    def get(self, path: str) -> tuple[bytes, str] | None:
        if path == "data/runs.js":
            time.sleep(0.3)  # in the server's worker thread, as a slow read would be
        return super().get(path)


async def test_a_served_run_page_asks_for_its_data_early_once_and_keeps_its_script(
    nursery: trio.Nursery, browser: Browser, tmp_path: Path
) -> None:
    tasks = [task(f"task-{i:05d}", attempt()) for i in range(50)]
    run_dir = write_run(tmp_path / "runs", "r", "20260101T000000.000Z-0001", tasks)
    loads = """const nav = performance.getEntriesByType('navigation')[0];
      return [nav.domContentLoadedEventStart, performance.getEntriesByType('resource')
        .map(r => [new URL(r.name).pathname + new URL(r.name).search, r.startTime, r.transferSize])];"""
    with trio.fail_after(HANG_GUARD):
        url = await nursery.start(serve, _SlowRunList(find_runs([run_dir]), live=True), 0)
        for visit in range(2):
            await browser.goto("about:blank")
            await browser.goto(url + "#/run/0")
            await wait_ready(browser, "run")
            assert await browser.text("#task-count") == "50 of 50 tasks"
            loaded, resources = await browser.execute(loads)
            run = [(start, size) for path, start, size in resources if path == "/data/0/run.js"]
            # One request, begun while the page's own files were still loading
            # (the list of runs takes 0.3 s, and the page starts after it).
            assert len(run) == 1 and run[0][0] < loaded - 200 and run[0][1] > 0, (loaded, resources)
            assets = {path.split("?")[0]: (path, size) for path, _, size in resources if path.split("?")[0] in ("/app.js", "/app.css")}
            assert set(assets) == {"/app.js", "/app.css"} and all("?v=" in path for path, _ in assets.values())
            if visit:  # named by content, so kept: the second visit fetches neither
                assert all(size == 0 for _, size in assets.values()), assets


async def test_long_trajectory_is_virtual_searchable_and_jumpable(viewer, browser: Browser, tmp_path: Path) -> None:
    steps = 3000  # 6,002 messages over 13 chunks: what a 100,000-step one shows, smaller
    tasks = [task("long", attempt(trajectory=agent_trajectory(steps)))]
    run_dir = write_run(tmp_path / "runs", "long", "20260101T000000.000Z-0001", tasks)
    total = 2 + 2 * steps
    state = "document.querySelector('#trajectory').dataset"
    with trio.fail_after(HANG_GUARD):
        url = await viewer([run_dir])
        await browser.goto(url + "#/run/0/task/long/0")
        await wait_ready(browser, "attempt")
        await browser.wait_for(f"{state}.first === '0' && !document.querySelector('#trajectory .msg.loading')")
        # The scrollbar spans every message; only those on screen are in the DOM.
        box = await browser.execute("const b = document.querySelector('#trajectory-box');"
                                    " return [b.scrollHeight, b.clientHeight]")
        assert box[0] - box[1] >= (total - 1) * 90
        positions = [k / 12 for k in range(13)]
        for fraction in positions + positions[::-1]:  # first to last and back
            await browser.execute("const b = document.querySelector('#trajectory-box');"
                                  " b.scrollTop = arguments[0] * (b.scrollHeight - b.clientHeight)", fraction)
            expected = min(total - 1, round(fraction * (total - 1)))
            await browser.wait_for(f"Math.abs(+{state}.first - arguments[0]) <= 12 && !document.querySelector('#trajectory .msg.loading')",
                                   expected)
            shown = await browser.execute("return [...document.querySelectorAll('#trajectory .msg')].map(m => +m.dataset.index)")
            assert len(shown) < 40 and shown == list(range(shown[0], shown[0] + len(shown))), shown
            if fraction == 1:
                assert shown[-1] == total - 1 and await browser.execute(f"return {state}.last") == str(total - 1)
        assert await browser.execute(f"return {state}.first") == "0"
        await browser.screenshot(tmp_path / "long-trajectory.png")

        # Search by text: the right message, then the next and the previous match.
        await browser.type("input[name=find]", "data-2990.txt\n")
        assert_at = 2 + 2 * 2990  # the assistant's call; its result follows
        await browser.wait_for(f"{state}.match === '{assert_at}' && {state}.first === '{assert_at}'")
        assert await browser.execute(f"return document.querySelector('.msg[data-index=\"{assert_at}\"]').classList.contains('hit')")
        await browser.click("#find-next")
        await browser.wait_for(f"{state}.match === '{assert_at + 1}'")
        answers = await browser.text(f".msg[data-index='{assert_at + 1}'] .answers")
        assert answers == f"answers bash call_2990 (#{assert_at})"  # which call this result answers
        await browser.click("#find-prev")
        await browser.wait_for(f"{state}.match === '{assert_at}'")
        await browser.screenshot(tmp_path / "long-trajectory-found.png")
        # ... by tool name, backwards from the top: the last message named bash.
        await browser.click("#jump-start")
        await browser.execute("const q = document.querySelector('input[name=find]'); q.value = 'BASH';"
                              " q.dispatchEvent(new Event('input'))")
        await browser.click("#find-prev")
        await browser.wait_for(f"{state}.match === '{total - 1}'")
        assert await browser.execute(f"return {state}.last") == str(total - 1)

        # Jump to a message, and back up from it: the ones before it are there.
        await browser.type("input[name=jump]", "777")
        await browser.click("#jump-go")
        await browser.wait_for(f"{state}.first === '777'")
        assert (await browser.text(".msg .meta .index")) == "#777"
        await browser.execute("document.querySelector('#trajectory-box').scrollTop -= 150")
        await browser.wait_for(f"+{state}.first < 777 && !document.querySelector('#trajectory .msg.loading')")
        assert await browser.execute("return document.querySelector('.msg[data-index=\"776\"]') !== null")


async def test_a_short_trajectory_renders_whole_and_searches(viewer, browser: Browser, tmp_path: Path) -> None:
    trajectory = agent_trajectory(3)
    trajectory[5]["exit_code"] = 1
    run_dir = write_run(tmp_path / "runs", "short", "20260101T000000.000Z-0001", [task("short", attempt(trajectory=trajectory))])
    with trio.fail_after(HANG_GUARD):
        url = await viewer([run_dir])
        await browser.goto(url + "#/run/0/task/short/0")
        await wait_ready(browser, "attempt")
        await browser.wait_for("document.querySelector('#trajectory').dataset.shown === '8'")
        exits = await browser.execute("return [...document.querySelectorAll('.msg.tool .exit')].map(e => [e.textContent, e.className])")
        assert [e[0] for e in exits] == ["exit 0", "exit 1", "exit 0"]
        assert "b-bad" in exits[1][1] and "b-ok" in exits[0][1]  # a failed command looks failed
        await browser.type("input[name=find]", "data-2\n")
        await browser.wait_for("document.querySelector('#trajectory').dataset.match === '6'")


async def test_live_run_page_refreshes_from_progress(viewer, browser: Browser, tmp_path: Path) -> None:
    done = task("first", attempt())
    run_dir = write_run(tmp_path / "runs", "live", "20260101T000000.000Z-0001", [done], status="running", events=[
        {"event": "run_started", "t": 1.0},
        {"event": "task_started", "t": 1.1, "task": "first"}, {"event": "task_finished", "t": 1.2, "task": "first"},
        {"event": "task_started", "t": 1.3, "task": "second"},
    ])
    with trio.fail_after(HANG_GUARD), writer_lock(run_dir):
        url = await viewer([run_dir])
        await browser.goto(url + "#/run/0")
        await wait_ready(browser, "run")
        assert await browser.text("#task-count") == "2 of 2 tasks"
        await browser.click("select[name=severity] option[value=running]")
        assert await browser.text("#task-count") == "1 of 2 tasks"
        assert await browser.text("#live") == "live"
        await browser.screenshot(tmp_path / "live-before.png")

        # The run goes on: the second task finishes with an error and a third starts.
        write_json(run_dir / "details" / "error" / "second.json",
                   task("second", attempt(values={"reward": 0.0}, status="run_error",
                                          issues=[{"severity": "error", "phase": "run", "code": "harness_timeout", "message": "x"}]),
                        severity="error"))
        append_events(run_dir, [{"event": "task_finished", "t": 2.0, "task": "second"},
                                {"event": "task_started", "t": 2.1, "task": "third"}])
        await browser.wait_for("document.querySelector('#task-count').textContent === '1 of 3 tasks'")
        rows = await browser.execute("return [...document.querySelectorAll('#task-table .vt-row > div:first-child')].map(c => c.textContent)")
        assert rows == ["third"]
        assert "harness_timeout" in await browser.text("#issue-codes")
        await browser.screenshot(tmp_path / "live-after.png")


async def test_typing_in_the_filter_during_a_live_run_keeps_focus_and_every_character(
    viewer, browser: Browser, tmp_path: Path
) -> None:
    run_dir = write_run(tmp_path / "runs", "live", "20260101T000000.000Z-0001", [task("task-000", attempt())], status="running",
                        events=[{"event": "run_started", "t": 1.0}, {"event": "task_started", "t": 1.1, "task": "task-000"},
                                {"event": "task_finished", "t": 1.2, "task": "task-000"}])
    typed = "k-00"
    with trio.fail_after(HANG_GUARD), writer_lock(run_dir):
        url = await viewer([run_dir])
        await browser.goto(url + "#/run/0")
        await wait_ready(browser, "run")
        assert await browser.text("#live") == "live"
        await browser.click("input[name=text]")
        await browser.execute("window.filterInput = document.activeElement")
        for n, key in enumerate(typed, 1):
            # A task finishes, then a key is pressed: the refresh lands while the person types.
            write_json(run_dir / "details" / "normal" / f"task-00{n}.json", task(f"task-00{n}", attempt(), category=f"c{n}"))
            append_events(run_dir, [{"event": "task_finished", "t": 2.0 + n, "task": f"task-00{n}"}])
            await browser.keys(key)
            await browser.wait_for(f"document.querySelector('#task-count').textContent.endsWith(' of {n + 1} tasks')")
            assert await browser.execute("return document.activeElement === window.filterInput && window.filterInput.isConnected")
        assert await browser.execute("return window.filterInput.value") == typed
        assert await browser.text("#task-count") == f"{len(typed) + 1} of {len(typed) + 1} tasks"

        # A dropdown someone has open (focused) is left alone by the refresh; its new options come after.
        await browser.click("select[name=category]")
        await browser.execute("window.categorySelect = document.activeElement")
        before = await browser.execute("return [...window.categorySelect.options].map(o => o.value)")
        write_json(run_dir / "details" / "normal" / "task-009.json", task("task-009", attempt(), category="new-category"))
        append_events(run_dir, [{"event": "task_finished", "t": 9.0, "task": "task-009"}])
        await browser.wait_for(f"document.querySelector('#task-count').textContent.endsWith(' of {len(typed) + 2} tasks')")
        assert await browser.execute("return document.activeElement === window.categorySelect && window.categorySelect.isConnected")
        assert await browser.execute("return [...window.categorySelect.options].map(o => o.value)") == before
        await browser.execute("window.categorySelect.blur()")
        await browser.wait_for("[...window.categorySelect.options].some(o => o.value === 'new-category')")
        await browser.screenshot(tmp_path / "live-typing.png")


async def test_run_page_task_table_above_the_fold_with_every_attempt_and_sort_arrows(
    viewer, browser: Browser, tmp_path: Path
) -> None:
    statuses = ["completed", "run_error", "completed", "timed_out", "eval_error"]
    attempts = [attempt(n, status=s, values={"reward": float(s == "completed")}) for n, s in enumerate(statuses)]
    for a in attempts:
        a["timings"] = {"setup": 0.0001, "run": 0.0002, "collect": 0.0, "evaluate": 0.0001}  # 0.4 ms in all
    tasks = [task(f"t{i}", *attempts, category="c") for i in range(3)]
    run_dir = write_run(tmp_path / "runs", "k5", "20260101T000000.000Z-0001", tasks, metrics=metrics_for({f"t{i}": 0.4 for i in range(3)}))
    with trio.fail_after(HANG_GUARD):
        url = await viewer([run_dir])
        await browser.goto(url + "#/run/0")
        await wait_ready(browser, "run")
        assert await browser.execute("return document.querySelector('#task-table .vt-row').getBoundingClientRect().bottom <= innerHeight")
        # k = 5: five badges, each inside its cell.
        fits = await browser.execute("""
            const cell = document.querySelector('#task-table .vt-row > div:nth-child(4)'); const box = cell.getBoundingClientRect();
            return [...cell.querySelectorAll('.badge')].map(b => { const r = b.getBoundingClientRect();
              return [b.title, r.left >= box.left && r.right <= box.right]; });""")
        assert fits == [[f"attempt {n}: {s}", True] for n, s in enumerate(statuses)]
        time_cell = await browser.text("#task-table .vt-row > div:nth-child(8)")
        assert time_cell == "2.00 ms"  # five attempts of 0.4 ms, not "0 ms"
        heads = "return [...document.querySelectorAll('#task-table .vt-head div')].map(d => d.textContent)"
        assert not any(h.endswith(("▲", "▼")) for h in await browser.execute(heads))
        await browser.click("#task-table .vt-head div:nth-child(1)")
        assert (await browser.execute(heads))[0] == "task ▲"
        await browser.click("#task-table .vt-head div:nth-child(1)")
        assert (await browser.execute(heads))[0] == "task ▼"
        assert await browser.text("#task-table .vt-row > div:first-child") == "t2"
        await browser.screenshot(tmp_path / "k5-run.png")


class _GatedSite(Site):
    """A site whose background pass waits for the test, so the first page
    surely gets placeholders."""

    def __init__(self, run_dirs: list[Path], gate: threading.Event) -> None:
        super().__init__(run_dirs, live=True, row_budget=0)
        self.gate = gate

    def warm(self, check: Callable[[], None] = lambda: None) -> None:
        while not self.gate.wait(0.05):
            check()
        super().warm(check)


async def test_run_page_shows_the_listing_first_and_fills_rows_in(nursery: trio.Nursery, browser: Browser, tmp_path: Path) -> None:
    tasks = [task(f"t{i}", attempt(values={"reward": float(i % 2)}), category=f"cat{i}") for i in range(3)]
    run_dir = write_run(tmp_path / "runs", "lazy", "20260101T000000.000Z-0001", tasks)
    gate = threading.Event()
    with trio.fail_after(HANG_GUARD):
        url = await nursery.start(serve, _GatedSite(find_runs([run_dir]), gate), 0)
        await browser.goto(url + "#/run/0")
        await wait_ready(browser, "run")
        assert await browser.text("#live") == "reading 3 more task(s)…"
        assert await browser.text("#task-count") == "3 of 3 tasks"
        await browser.type("input[name=text]", "t1")
        assert await browser.text("#task-count") == "1 of 3 tasks"  # filterable before every record is read
        assert "loading" in await browser.text("#task-table .vt-row")
        await browser.screenshot(tmp_path / "run-pending.png")
        gate.set()
        await browser.wait_for("document.querySelector('#live').textContent === ''"
                               " && document.querySelector('#task-table .vt-row').textContent.includes('cat1')")
        assert await browser.text("#task-count") == "1 of 3 tasks"
        await browser.screenshot(tmp_path / "run-filled.png")


async def test_an_unfinished_task_opens_from_its_checkpoint(viewer, browser: Browser, tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "runs", "live", "20260101T000000.000Z-0001", [], status="running", events=[
        {"event": "run_started", "t": 1.0}, {"event": "task_started", "t": 1.1, "task": "slow"}])
    write_json(run_dir / "tasks" / "slow" / "attempt-0" / "checkpoint.json",
               attempt(0, status="completed", values={"reward": 0.0}, trajectory=agent_trajectory(2)))
    with trio.fail_after(HANG_GUARD), writer_lock(run_dir):
        url = await viewer([run_dir])
        await browser.goto(url + "#/run/0")
        await wait_ready(browser, "run")
        await browser.click("#task-table a.task-link")
        await wait_ready(browser, "attempt")
        assert "Not finished" in await browser.text("#checkpointed")
        await browser.wait_for("document.querySelectorAll('.msg').length === 6")
        assert "wc -l /app/data-1.txt" in await browser.text("#trajectory")
        await browser.screenshot(tmp_path / "checkpointed-attempt.png")
