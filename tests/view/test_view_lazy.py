"""Lazy serving: the run index from the listing and a row budget, large
records split once into cached chunks, checkpoint-only attempts, and
``--out`` cleaning up its own stale files."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from view_helpers import COMPASS, agent_trajectory, attempt, run_dir_state, task, write_json, write_run, writer_lock

from agentcompass._store import open_run_store
from agentcompass._store._keys import task_key
from agentcompass._view import CHUNK_STEPS, Site, find_runs, write_site
from agentcompass._view._data import LARGE_RECORD, RunData, read_record
from agentcompass._view._site import STATIC_GROUP, TASKS_PER_BUNDLE
from agentcompass.runtime import AttemptRecord, RunResult, TaskRecord


def _large_task(task_id: str, steps: int) -> dict:
    record = task(task_id, attempt(trajectory=agent_trajectory(steps), values={"reward": 0.0}), category="big")
    assert len(json.dumps(record)) >= LARGE_RECORD
    return record


def test_a_budgeted_run_page_answers_placeholders_that_the_background_pass_fills(tmp_path: Path) -> None:
    small = [task(f"t{i}", attempt(values={"reward": float(i % 2)}), category="c", severity="error" if i == 3 else "normal")
             for i in range(6)]
    run_dir = write_run(tmp_path / "runs", "r", "20260101T000000.000Z-0001", [*small, _large_task("huge", 2000)])
    run = RunData(run_dir)

    page = run.run(budget=0)  # no time to read anything: the listing alone
    assert page["pending"] == 7
    rows = {t[0]: t for t in page["tasks"]}
    assert set(rows) == {"huge", *(f"t{i}" for i in range(6))}
    assert rows["t3"][3] == "error" and rows["t3"][4] == ["loading"]  # severity from the directory
    assert run.records_read == 0

    page = run.run(budget=60)  # small records are read within the budget; a large one is left to the background pass
    assert page["pending"] == 1 and {t[0]: t[4] for t in page["tasks"]}["huge"] == ["loading"]
    assert run.records_read == 0

    run.warm()
    assert run.records_read == 1  # the large record, parsed once and kept for its attempt page
    page = run.run(budget=0)
    assert page["pending"] == 0
    rows = {t[0]: t for t in page["tasks"]}
    assert rows["huge"][2:5] == ["big", "normal", ["completed"]] and rows["t1"][5] == 1.0
    assert page == run.run(budget=None) | {"header": page["header"]}

    detail = run.task("huge")
    assert detail is not None and detail["attempts"][0]["run_result"]["trajectory_steps"] == 2 + 2 * 2000
    assert run.records_read == 1  # the attempt page found the background pass's parse


def test_a_large_record_is_split_once_into_the_same_chunks(tmp_path: Path) -> None:
    trajectory = agent_trajectory(1500)
    trajectory[5]["content"] = 'he wrote "trajectory": [1, 2] and ] and [ in a string'
    record = task("big", attempt(trajectory=trajectory), attempt(1, trajectory=[]))
    record["attempts"][1]["run_result"]["trajectory"] = []
    path = tmp_path / "big.json"
    for text in (json.dumps(record), json.dumps(record, indent=2)):  # compact as the store writes, and spaced
        path.write_text(text)
        value, chars = read_record(str(path))
        assert chars == len(text)
        first, second = (a["run_result"]["trajectory"] for a in value["attempts"])
        assert (first.steps, first.tool_calls, second.steps, second.chunks) == (len(trajectory), 1500, 0, [])
        assert [m for c in first.chunks for m in json.loads(c)] == trajectory
        assert all(len(json.loads(c)) <= CHUNK_STEPS for c in first.chunks)
        assert value["attempts"][0]["plan"] == record["attempts"][0]["plan"]

    record["attempts"][0]["plan"]["trajectory"] = [{"not": "a run result"}]  # the key elsewhere: one plain parse
    path.write_text(json.dumps(record))
    value, _ = read_record(str(path))
    assert value["attempts"][0]["plan"]["trajectory"] == [{"not": "a run result"}]
    assert [m for c in value["attempts"][0]["run_result"]["trajectory"].chunks for m in json.loads(c)] == trajectory


def test_chunks_come_from_one_parse_and_the_cache_is_bounded(tmp_path: Path) -> None:
    records = [_large_task("a", 1200), _large_task("b", 1200)]
    run_dir = write_run(tmp_path / "runs", "r", "20260101T000000.000Z-0001", records)
    size = (run_dir / "details" / "normal" / "a.json").stat().st_size
    run = RunData(run_dir, record_cache_chars=size + size // 2)  # room for one of them
    detail = run.task("a")
    assert detail is not None
    chunks = detail["attempts"][0]["run_result"]["trajectory_chunks"]
    assert chunks == 5
    served = [json.loads(run.trajectory_chunk("a", 0, n) or "null") for n in range(chunks)]
    assert [m for c in served for m in c] == records[0]["attempts"][0]["run_result"]["trajectory"]
    assert run.trajectory_chunk("a", 0, chunks) is None
    assert run.records_read == 1
    assert run.trajectory_chunk("b", 0, 0) is not None and run.records_read == 2  # evicts a
    assert run.trajectory_chunk("b", 0, 1) is not None and run.records_read == 2
    assert run.trajectory_chunk("a", 0, 0) is not None and run.records_read == 3


def test_a_task_with_only_checkpoints_shows_its_attempts(tmp_path: Path) -> None:
    done = task("done", attempt())
    events = [{"event": "run_started", "t": 1.0}, {"event": "task_started", "t": 1.1, "task": "done"},
              {"event": "task_started", "t": 1.2, "task": "Slow Task"}, {"event": "task_finished", "t": 2.0, "task": "done"}]
    run_dir = write_run(tmp_path / "runs", "r", "20260101T000000.000Z-0001", [done], status="running", events=events)
    first = attempt(0, values={"reward": 0.0}, status="completed", trajectory=agent_trajectory(3))
    first["plan"]["task_id"] = "Slow Task"
    key = task_key("Slow Task")  # not the task id: the row must link by the store's key
    assert key != "Slow Task"
    write_json(run_dir / "tasks" / key / "attempt-0" / "checkpoint.json", first)
    before = run_dir_state(run_dir)
    with writer_lock(run_dir):
        site = Site(find_runs([run_dir]), live=True)
        page = site.runs[0].run()
        rows = {t[0]: t for t in page["tasks"]}
        assert rows["Slow Task"][1:5] == [key, None, "running", ["completed"]]
        detail = site.runs[0].task(key)
        assert detail is not None and detail["checkpointed"] and detail["task_id"] == "Slow Task"
        assert [a["attempt"] for a in detail["attempts"]] == [0]
        assert detail["attempts"][0]["run_result"]["trajectory_steps"] == 8
        found = site.get(f"data/0/traj/{key}/0-0.js")
        assert found is not None and b"Count the lines" in found[0]
    assert site.runs[0].task("nothing") is None
    assert run_dir_state(run_dir) == before


def test_out_removes_its_own_stale_files_and_nothing_else(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "runs", "r", "20260101T000000.000Z-0001",
                        [task("keep", attempt()), task("gone", attempt(trajectory=agent_trajectory(2)))])
    out = tmp_path / "site"
    write_site(Site(find_runs([run_dir]), live=False, static=True), out)
    (out / "data/0/traj/gone").mkdir(parents=True)
    (out / "data/0/traj/gone/0-0.js").write_text("an older layout's file")
    (out / "data/0/task").mkdir(parents=True)
    (out / "data/0/task/gone.js").write_text("an older layout's file")
    assert "gone" in (out / "data/0/tasks/0.js").read_text()
    (out / "data/notes.txt").write_text("mine")
    (out / "data/0/task/mine.json").write_text("{}")
    (out / "README").write_text("mine")
    (run_dir / "details" / "normal" / "gone.json").unlink()

    write_site(Site(find_runs([run_dir]), live=False, static=True), out)
    assert not (out / "data/0/task/gone.js").exists() and not (out / "data/0/traj/gone").exists()
    assert "gone" not in (out / "data/0/tasks/0.js").read_text() and (out / "data/0/run.js").is_file()
    assert [(out / p).read_text() for p in ("data/notes.txt", "data/0/task/mine.json", "README")] == ["mine", "{}", "mine"]


def test_out_refuses_a_run_directory_or_one_that_holds_runs(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "runs", "r", "20260101T000000.000Z-0001", [task("a", attempt())])
    other = write_run(tmp_path / "other", "o", "20260101T000000.000Z-0002", [task("b", attempt())])
    before = run_dir_state(tmp_path)
    for out, message in ((tmp_path / "runs", "holds the run directory"), (other, "is a run directory")):
        done = subprocess.run([COMPASS, "view", str(run_dir), "--out", str(out)], capture_output=True, text=True, timeout=60,
                              check=False)
        assert done.returncode == 2 and message in done.stderr, done.stderr
    assert run_dir_state(tmp_path) == before


def test_out_writes_a_few_files_per_thousand_tasks(tmp_path: Path) -> None:
    n = 2000
    tasks = [task(f"task-{i:05d}", attempt(trajectory=agent_trajectory(3))) for i in range(n)]
    tasks.append(task("long", attempt(trajectory=agent_trajectory(4 * STATIC_GROUP * CHUNK_STEPS // 2))))
    run_dir = write_run(tmp_path / "runs", "r", "20260101T000000.000Z-0001", tasks)
    out = tmp_path / "site"
    written = write_site(Site(find_runs([run_dir]), live=False, static=True), out)
    files = [p for p in out.rglob("*") if p.is_file()]
    assert written == len(files)
    # 3 page files, config, runs, the run page, 11 task bundles and the long trajectory's 5 files.
    assert len(files) == 6 + -(-(n + 1) // TASKS_PER_BUNDLE) + 5
    bundle = json.loads((out / "data/0/tasks/0.js").read_text().split(",", 1)[1][:-3])
    assert len(bundle) == TASKS_PER_BUNDLE and bundle["long"]["attempts"][0]["run_result"]["trajectory_chunks"] == 5
    assert len(bundle["task-00000"]["attempts"][0]["run_result"]["trajectory_inline"]) == 8
    last = json.loads((out / "data/0/traj/long/0-4.js").read_text().split(",", 1)[1][:-3])
    assert last[-1]["content"] == f"{4 * STATIC_GROUP * CHUNK_STEPS // 2} /app/data-{4 * STATIC_GROUP * CHUNK_STEPS // 2 - 1}.txt"


async def test_a_trajectory_the_store_wrote_beside_its_record_is_served_from_its_files(tmp_path: Path) -> None:
    trajectory = agent_trajectory(CHUNK_STEPS + 10)  # 1,022 messages: three files
    record = TaskRecord("split", None, [AttemptRecord(attempt=0, status="completed", values={"reward": 1.0},
                                                      run_result=RunResult(output="x", trajectory=trajectory))], "normal")
    async with open_run_store(tmp_path, "r") as store:
        await store.save_task(record)
    files = store.run_dir / "tasks" / "split" / "attempt-0" / "trajectory"
    site = Site([store.run_dir], live=True)
    detail = site.runs[0].task("split")
    assert detail is not None
    rr = detail["attempts"][0]["run_result"]
    assert (rr["trajectory_steps"], rr["trajectory_chunks"], rr["tool_calls"]) == (len(trajectory), 3, CHUNK_STEPS + 10)
    for n in range(3):
        found = site.get(f"data/0/traj/split/0-{n}.js")
        assert found is not None and found[0].decode().endswith(f",{(files / f'{n}.json').read_text()});\n")
    found = site.get(f"data/0/find/split/0/{b'data-509.txt'.hex()}.js")
    assert found is not None and b'"chunks":[2]' in found[0]
    static = Site([store.run_dir], live=False, static=True)
    (chunk,) = [p for p in static.paths() if "/traj/" in p]
    assert json.loads(static.get(chunk)[0].decode().split(",", 1)[1][:-3]) == trajectory  # type: ignore[index]


async def test_a_run_the_store_wrote_pages_from_its_index_without_opening_a_record(tmp_path: Path) -> None:
    ids = ["Task 1/a", "t2", "Task 3/c"]  # two hashed keys: a placeholder would show the key
    async with open_run_store(tmp_path, "req") as store:
        for n, task_id in enumerate(ids):
            values = {"reward": float(n % 2)}
            attempts = [AttemptRecord(k, "completed", values, [], RunResult(usage={"prompt_tokens": 3})) for k in range(2)]
            await store.save_task(TaskRecord(task_id, f"cat{n}", attempts, "error" if n == 2 else "normal"))
    run = RunData(store.run_dir)
    page = run.run(budget=0)  # no time to read a record: every row comes from the index
    assert page["pending"] == 0 and run.records_read == 0
    rows = {t[0]: t for t in page["tasks"]}
    assert set(rows) == set(ids)
    assert [rows[i][2:6] for i in ids] == [["cat0", "normal", ["completed"] * 2, 0.0], ["cat1", "normal", ["completed"] * 2, 1.0],
                                            ["cat2", "error", ["completed"] * 2, 0.0]]
    assert page["usage"] == {"prompt_tokens": 18}

    # The same page as reading every record (the index moved away).
    (store.run_dir / "index.jsonl").rename(tmp_path / "index.jsonl")
    assert RunData(store.run_dir).run(budget=None) | {"header": page["header"]} == page


def test_an_index_line_is_believed_only_for_the_record_file_it_was_written_for(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "runs", "r", "20260101T000000.000Z-0001",
                        [task(t, attempt(values={"reward": 1.0}), category="real") for t in ("t1", "t2", "t3")])
    path = run_dir / "details" / "normal" / "t1.json"
    stale = {"bytes": path.stat().st_size + 1, "task_id": "t1", "category": "stale", "severity": "normal",
             "statuses": ["completed"], "codes": [], "values": [{}], "usage": {}, "timings": {}, "seconds": 0.0,
             "retries": 0, "attempts": 1}
    moved = stale | {"bytes": (run_dir / "details" / "normal" / "t2.json").stat().st_size, "task_id": "t2",
                     "severity": "error"}  # the record is under normal/
    current = moved | {"severity": "normal", "category": "indexed"}
    odd = current | {"task_id": "t3", "values": [1]}  # not a row's shape
    odder = current | {"task_id": "t3", "usage": {"tokens": "many"}}
    lines = [json.dumps(stale), json.dumps(moved), json.dumps(odd), json.dumps(odder), '{"bytes": 1, "task_id": 3',
             json.dumps(current)]
    (run_dir / "index.jsonl").write_text("\n".join(lines) + "\n" + json.dumps(stale | {"task_id": "t3"})[:-5])
    rows = {t[0]: t for t in RunData(run_dir).run(budget=60)["tasks"]}
    assert {t: r[2] for t, r in rows.items()} == {"t1": "real", "t2": "indexed", "t3": "real"}
