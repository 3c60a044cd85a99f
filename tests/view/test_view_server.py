"""The viewer's server, data files and command line, without a browser."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
from pathlib import Path

import httpx
import pytest
import trio
from view_helpers import COMPASS, LEAKY_KEY, agent_trajectory, attempt, run_dir_state, task, write_run, writer_lock

from agentcompass._view import CHUNK_STEPS, Site, find_runs, serve, write_site


def _data(body: bytes) -> object:
    """The value a data file hands to ``COMPASS.put``."""
    text = body.decode()
    match = re.fullmatch(r'COMPASS\.put\("([^"]*)",(.*)\);\n', text, re.S)
    assert match, text[:200]
    return json.loads(match.group(2))


async def _raw(url: str, request: bytes) -> bytes:
    host, port = url.split("/")[2].split(":")
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(request)
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
            if b"\r\n\r\n" in data:
                head, _, body = data.partition(b"\r\n\r\n")
                length = re.search(rb"content-length: (\d+)", head, re.I)
                if length and len(body) >= int(length.group(1)):
                    break
        return data


async def test_serves_pages_and_data_and_nothing_else(agent_run: Path, viewer) -> None:
    with trio.fail_after(30):
        url = await viewer([agent_run])
        assert url.startswith("http://127.0.0.1:")
        async with httpx.AsyncClient(base_url=url) as client:
            index = await client.get("/")
            assert index.status_code == 200 and index.headers["content-type"].startswith("text/html")
            assert "default-src 'none'" in index.headers["content-security-policy"]
            runs = await client.get("/data/runs.js")
            assert [r["name"] for r in _data(runs.content)] == ["terminal-react"]  # type: ignore[index]
            run = _data((await client.get("/data/0/run.js")).content)
            assert sorted(t[0] for t in run["tasks"]) == ["count-lines", "hello"]  # type: ignore[index]
            assert run["issues_by_code"] == {"error:harness_max_iterations": 1}  # type: ignore[index]
            assert (await client.head("/data/runs.js")).content == b""
            assert (await client.post("/data/runs.js", content=b"x")).status_code == 405
            assert (await client.get("/data/9/run.js")).status_code == 404
            assert (await client.get("/data/0/task/nope.js")).status_code == 404
            assert (await client.get("/run_info.json")).status_code == 404
        # Raw requests: a path that climbs, and a Host that is not ours (DNS rebinding).
        port = url.split(":")[2].rstrip("/")
        climb = await _raw(url, f"GET /../run_info.json HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        assert climb.startswith(b"HTTP/1.1 404")
        rebound = await _raw(url, b"GET /data/runs.js HTTP/1.1\r\nHost: evil.example:80\r\n\r\n")
        assert rebound.startswith(b"HTTP/1.1 403") and b"terminal-react" not in rebound


async def test_the_page_names_its_script_and_style_by_content_and_only_those_are_kept(agent_run: Path, viewer) -> None:
    with trio.fail_after(30):
        url = await viewer([agent_run])
        async with httpx.AsyncClient(base_url=url) as client:
            page = await client.get("/")
            refs = dict(re.findall(r'(?:src|href)="(app\.(?:js|css))\?(v=[0-9a-f]+)"', page.text))
            assert set(refs) == {"app.js", "app.css"} and page.headers["cache-control"] == "no-store"
            for name, query in refs.items():
                kept = await client.get(f"/{name}?{query}")
                plain = await client.get(f"/{name}")
                stale = await client.get(f"/{name}?v=0123456789abcdef")
                assert kept.content == plain.content == stale.content and kept.status_code == 200
                assert kept.headers["cache-control"] == "max-age=31536000, immutable"
                assert plain.headers["cache-control"] == stale.headers["cache-control"] == "no-store"
            assert (await client.get("/data/runs.js?v=" + refs["app.js"][2:])).headers["cache-control"] == "no-store"
            assert (await client.get(f"/nope.js?{refs['app.js']}")).headers["cache-control"] == "no-store"
    # The static copy opened from disk names them plainly.
    assert b'src="app.js"' in Site(find_runs([agent_run]), live=False, static=True).get("index.html")[0]  # type: ignore[index]


async def test_a_malformed_record_fails_its_request_not_the_server(tmp_path: Path, viewer) -> None:
    run_dir = write_run(tmp_path / "runs", "r", "20260101T000000.000Z-0001", [task("good", attempt())])
    (run_dir / "details" / "normal" / "bad.json").write_text(json.dumps({"task_id": "bad", "attempts": "oops"}))
    with trio.fail_after(30):
        url = await viewer([run_dir])
        async with httpx.AsyncClient(base_url=url) as client:
            broken = await client.get("/data/0/task/bad.js")
            assert broken.status_code == 500 and broken.text == "cannot read data/0/task/bad.js: ValueError\n"
            run = _data((await client.get("/data/0/run.js")).content)
            assert [t[0] for t in run["tasks"]] == ["good"]  # type: ignore[index]


async def test_trajectories_are_served_in_chunks(tmp_path: Path, viewer) -> None:
    trajectory = agent_trajectory(CHUNK_STEPS + 1)  # 2 + 2 * (CHUNK_STEPS + 1) messages: three chunks
    run_dir = write_run(tmp_path / "runs", "long", "20260101T000000.000Z-0001", [task("long", attempt(trajectory=trajectory))])
    with trio.fail_after(30):
        url = await viewer([run_dir])
        async with httpx.AsyncClient(base_url=url) as client:
            detail = _data((await client.get("/data/0/task/long.js")).content)
            run_result = detail["attempts"][0]["run_result"]  # type: ignore[index]
            assert "trajectory" not in run_result
            assert (run_result["trajectory_steps"], run_result["trajectory_chunks"], run_result["tool_calls"]) == (
                len(trajectory), 3, CHUNK_STEPS + 1)
            chunks = [_data((await client.get(f"/data/0/traj/long/0-{n}.js")).content) for n in range(3)]
            assert [m for c in chunks for m in c] == trajectory  # type: ignore[attr-defined]
            assert (await client.get("/data/0/traj/long/0-3.js")).status_code == 404
            assert (await client.get("/data/0/traj/long/1-0.js")).status_code == 404


def test_no_secret_reaches_any_page(agent_run: Path) -> None:
    info_path = agent_run / "run_info.json"
    info = json.loads(info_path.read_text())
    info["request"]["model"]["api_key"] = "plain-text-oops-1234"  # a writer that failed to redact
    info_path.write_text(json.dumps(info))
    site = Site(find_runs([agent_run]), live=False)
    pages = {path: site.get(path) for path in site.paths()}
    assert "data/0/traj/count-lines/0-0.js" in pages
    static = Site(find_runs([agent_run]), live=False, static=True)
    bundles = {path: static.get(path) for path in static.paths()}
    assert "data/0/tasks/0.js" in bundles  # the trajectory inline, in the bundle
    for path, found in [*pages.items(), *bundles.items()]:
        assert found is not None, path
        body = found[0].decode()
        assert LEAKY_KEY not in body and "plain-text-oops-1234" not in body, path
    for body in (pages["data/0/traj/count-lines/0-0.js"][0], pages["data/0/task/count-lines.js"][0],  # type: ignore[index]
                 bundles["data/0/tasks/0.js"][0]):  # type: ignore[index]
        assert "Bearer **********" in body.decode()


async def test_viewer_never_writes_to_a_run_directory(agent_run: Path, viewer, tmp_path: Path) -> None:
    before = run_dir_state(agent_run)
    site = Site(find_runs([agent_run]), live=True)
    with trio.fail_after(60):
        url = await viewer([agent_run])
        async with httpx.AsyncClient(base_url=url) as client:
            for path in site.paths():
                assert (await client.get("/" + path)).status_code == 200
    assert write_site(Site(find_runs([agent_run]), live=False), tmp_path / "site") > 0
    assert run_dir_state(agent_run) == before
    with trio.fail_after(60):
        inside = await trio.run_process([COMPASS, "view", str(agent_run), "--out", str(agent_run / "site")],
                                        check=False, capture_stdout=True, capture_stderr=True)
    assert inside.returncode == 2 and b"never writes there" in inside.stderr
    assert run_dir_state(agent_run) == before


def test_a_running_run_whose_writer_died_shows_interrupted(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "runs", "r", "20260101T000000.000Z-0001", [task("first", attempt())], status="running",
                        events=[{"event": "run_started", "t": 1.0}, {"event": "task_started", "t": 1.1, "task": "first"},
                                {"event": "task_finished", "t": 1.2, "task": "first"}, {"event": "task_started", "t": 1.3, "task": "second"}])
    site = Site([run_dir], live=True)
    with writer_lock(run_dir):
        alive = _data(site.get("data/0/run.js")[0])  # type: ignore[index]
    dead = _data(site.get("data/0/run.js")[0])  # type: ignore[index]
    assert (alive["header"]["status"], alive["live"]["running"]) == ("running", True)  # type: ignore[index]
    assert (dead["header"]["status"], dead["live"]["running"]) == ("interrupted", False)  # type: ignore[index]
    assert [t[3] for t in alive["tasks"]] == ["normal", "running"]  # type: ignore[index]
    assert [t[3] for t in dead["tasks"]] == ["normal", "unfinished"]  # type: ignore[index]


def test_find_runs_takes_run_request_and_root_directories(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    a1 = write_run(root, "a", "20260101T000000.000Z-0001", [])
    a2 = write_run(root, "a", "20260102T000000.000Z-0002", [])
    b1 = write_run(root, "b", "20260101T000000.000Z-0003", [])
    assert find_runs([root]) == [b1.resolve(), a2.resolve(), a1.resolve()]
    assert find_runs([root / "a"]) == [a2.resolve(), a1.resolve()]
    assert find_runs([a1, root / "a"]) == [a1.resolve(), a2.resolve()]
    assert find_runs([tmp_path / "empty"]) == []


def test_cli_serves_on_a_free_port_until_interrupted(agent_run: Path) -> None:
    process = subprocess.Popen([COMPASS, "view", str(agent_run), "--port", "0"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        match = re.fullmatch(r"serving 1 run\(s\) at (http://127\.0\.0\.1:\d+/) \(Ctrl-C to stop\)\n", line)
        assert match, line
        assert httpx.get(match.group(1) + "data/runs.js").status_code == 200
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
    finally:
        process.kill()
        process.wait()


def test_cli_rejects_a_missing_directory(tmp_path: Path) -> None:
    result = subprocess.run([COMPASS, "view", str(tmp_path / "nope")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: run directory not found: {tmp_path / 'nope'}"
    empty = tmp_path / "empty"
    empty.mkdir()
    result = subprocess.run([COMPASS, "view", str(empty)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "no run directory found" in result.stderr


def test_cli_reports_a_busy_port(agent_run: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run([COMPASS, "view", str(agent_run), "--port", str(port)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: cannot listen on 127.0.0.1:{port}: ") and len(result.stderr.splitlines()) == 1


async def test_the_server_stops_within_the_callers_scope(agent_run: Path) -> None:
    with trio.fail_after(30):
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                url = await nursery.start(serve, Site(find_runs([agent_run]), live=True), 0)
                async with httpx.AsyncClient(base_url=url) as client:
                    assert (await client.get("/data/runs.js")).status_code == 200
                    scope.cancel()  # with the client's keep-alive connection still open
    port = int(url.split(":")[2].rstrip("/"))
    with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
        probe.connect(("127.0.0.1", port))


def test_a_finished_run_page_is_built_once_until_its_files_change(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "runs", "r", "20260101T000000.000Z-0001", [task("a", attempt()), task("b", attempt())])
    site = Site([run_dir], live=True)
    first = site.get("data/0/run.js")
    assert first is not None and site.get("data/0/run.js")[0] is first[0]  # type: ignore[index]  # the cached script
    (run_dir / "details" / "normal" / "c.json").write_text(json.dumps(task("c", attempt(), category=f"leak {LEAKY_KEY}")))
    changed = site.get("data/0/run.js")
    assert changed is not None and changed[0] is not first[0]
    page = _data(changed[0])
    assert [t[0] for t in page["tasks"]] == ["a", "b", "c"]  # type: ignore[index]
    assert LEAKY_KEY not in changed[0].decode() and "leak **********" in changed[0].decode()


def test_a_live_page_gets_what_changed_since_its_version(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "runs", "r", "20260101T000000.000Z-0001", [task("a", attempt()), task("b", attempt())],
                        status="running", events=[{"event": "run_started", "t": 1.0}])
    site = Site([run_dir], live=True)
    with writer_lock(run_dir):
        page = _data(site.get("data/0/run.js")[0])  # type: ignore[index]
        version = page["version"]  # type: ignore[index]
        (run_dir / "details" / "normal" / "b.json").unlink()
        (run_dir / "details" / "error" / "c.json").parent.mkdir(parents=True, exist_ok=True)
        (run_dir / "details" / "error" / "c.json").write_text(json.dumps(task("c", attempt(), category=LEAKY_KEY, severity="error")))
        body = site.get(f"data/0/since/{version}.js")[0]  # type: ignore[index]
        delta = _data(body)
        assert LEAKY_KEY not in body.decode()
        assert delta["delta"] == {"since": version, "removed": ["b"]}  # type: ignore[index]
        assert [t[0] for t in delta["tasks"]] == ["c"] and delta["version"] > version  # type: ignore[index]
        assert delta["issues_by_code"] == {} and delta["header"]["status"] == "running"  # type: ignore[index]
        unchanged = _data(site.get(f"data/0/since/{delta['version']}.js")[0])  # type: ignore[index]
        assert unchanged["tasks"] == [] and unchanged["delta"]["removed"] == []  # type: ignore[index]
        whole = _data(site.get("data/0/since/999.js")[0])  # type: ignore[index]  # a version it never had: all of it
        assert "delta" not in whole and [t[0] for t in whole["tasks"]] == ["a", "c"]  # type: ignore[index]


def test_search_names_the_chunks_that_hold_a_text(tmp_path: Path) -> None:
    trajectory = agent_trajectory(2 * CHUNK_STEPS)
    trajectory[-1]["content"] = 'the "needle" here, ünïcode'
    run_dir = write_run(tmp_path / "runs", "r", "20260101T000000.000Z-0001", [task("long", attempt(trajectory=trajectory))])
    site = Site([run_dir], live=True)

    def find(query: str) -> object:
        return _data(site.get(f"data/0/find/long/0/{query.encode().hex()}.js")[0])  # type: ignore[index]

    assert find('"NEEDLE" here') == {"query": '"NEEDLE" here', "chunks": [4]}
    assert find("ÜNÏCODE") == {"query": "ÜNÏCODE", "chunks": [4]}
    assert find("data-0.txt") == {"query": "data-0.txt", "chunks": [0]}
    assert find("absent") == {"query": "absent", "chunks": []}
    assert site.get("data/0/find/long/0/zz.js") is None and site.get("data/0/find/long/9/61.js") is None


async def test_a_large_run_page_is_sent_gzipped_to_a_client_that_takes_it(viewer, tmp_path: Path) -> None:
    tasks = [task(f"task-{i:04d}", attempt(), category="c") for i in range(1500)]
    run_dir = write_run(tmp_path / "runs", "r", "20260101T000000.000Z-0001", tasks)
    with trio.fail_after(60):
        url = await viewer([run_dir])
        async with httpx.AsyncClient(base_url=url) as client:
            zipped = await client.get("/data/0/run.js", headers={"accept-encoding": "gzip"})
            plain = await client.get("/data/0/run.js", headers={"accept-encoding": "identity"})
    assert zipped.headers["content-encoding"] == "gzip" and int(zipped.headers["content-length"]) < len(plain.content) / 4
    assert "content-encoding" not in plain.headers and len(plain.content) >= 64 * 1024
    assert zipped.content == plain.content  # httpx decodes it
    assert len(_data(plain.content)["tasks"]) == 1500  # type: ignore[index]
