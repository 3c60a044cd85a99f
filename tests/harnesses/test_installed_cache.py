"""The ``installed`` harness with ``noop-agent`` (a wheel made on the spot) under
``local``: the agent cache is built once, shared by concurrent attempts and
reused by a later run, with the timings to show it; and the outcomes that do
not need a real agent (a crash before any model call, a failed call)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys

import pytest
import trio
from _installed_support import KEY, SMOKE, details, launch

from agentcompass.testing import noop_agent  # noqa: F401  (registers noop-agent)
from agentcompass.testing.model_server import ModelServer, episode, text


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory):
    return tmp_path_factory.mktemp("agent-cache")


@pytest.fixture
def cache(cache_root, monkeypatch):
    """One cache for the module: tests that need a fresh build name a fresh version."""
    monkeypatch.setenv("AGENTCOMPASS_AGENT_CACHE", str(cache_root))
    return cache_root


#: The version the tests that do not care about building share (built once).
SHARED = f"1.0.{secrets.randbelow(10**9)}"


def _version() -> str:
    return f"1.0.{secrets.randbelow(10**9)}"


def _attempt(record):
    return record["attempts"][0]


async def test_concurrent_attempts_share_one_build_and_a_second_run_installs_nothing(tmp_path, cache):
    version = _version()
    harness = {"agent": "noop-agent", "version": version, "args": ["2"]}
    server = ModelServer(episode([text("ok")]))
    result, run_dir = await launch(
        tmp_path, server, harness, tasks=["hello-file", "word-count"], environment="local", run_network=None
    )
    first = [_attempt(r) for r in details(run_dir).values()]
    assert len(first) == 2
    caches = sorted(a["run_result"]["artifacts"]["agent"]["cache"] for a in first)
    assert caches == ["built", "hit"]  # one built it, the other waited for that build
    built = next(a for a in first if a["run_result"]["artifacts"]["agent"]["cache"] == "built")
    hit = next(a for a in first if a["run_result"]["artifacts"]["agent"]["cache"] == "hit")
    assert built["run_result"]["timings"]["agent_install"] > 0
    assert hit["run_result"]["timings"]["agent_install"] == 0
    entry = cache / f"noop-agent-{version}"
    marker = (entry / "installed.json").stat()

    result, run_dir = await launch(
        tmp_path, server, harness, tasks=["hello-file", "word-count"], environment="local", run_network=None
    )
    second = [_attempt(r) for r in details(run_dir).values()]
    assert [a["run_result"]["artifacts"]["agent"]["cache"] for a in second] == ["hit", "hit"]
    assert all(a["run_result"]["timings"]["agent_install"] == 0 for a in second)
    assert (entry / "installed.json").stat().st_mtime_ns == marker.st_mtime_ns
    # Each attempt's calls went through its gateway: usage counted, key never sent to the agent.
    for attempt in first + second:
        assert attempt["run_result"]["usage"]["calls"] == 2
    assert all(r.headers["authorization"] == f"Bearer {KEY}" for r in server.requests)
    assert KEY not in json.dumps([_attempt(r) for r in details(run_dir).values()])


async def test_an_agent_that_fails_before_any_model_call_is_fatal_harness_crashed(tmp_path, cache):
    server = ModelServer(episode([text("never")]))
    harness = {"agent": "noop-agent", "version": SHARED, "args": ["not-a-number"]}
    result, run_dir = await launch(tmp_path, server, harness, tasks=["hello-file"], environment="local", run_network=None)
    (record,) = details(run_dir).values()
    issues = _attempt(record)["issues"]
    assert [(i["severity"], i["code"]) for i in issues] == [("fatal", "harness_crashed")]
    assert "before any model call" in issues[0]["message"] and "ValueError" in issues[0]["message"]
    assert server.requests == []


async def test_a_model_failure_is_classified_from_the_gateways_record(tmp_path, cache):
    server = ModelServer(episode([text("fine")]), fail_after=1, fail_status=503)
    harness = {"agent": "noop-agent", "version": SHARED, "args": ["3"]}
    result, run_dir = await launch(tmp_path, server, harness, tasks=["hello-file"], environment="local", run_network=None)
    (record,) = details(run_dir).values()
    attempt = _attempt(record)
    assert [(i["severity"], i["code"]) for i in attempt["issues"]] == [("fatal", "model_server_error")]
    assert attempt["run_result"]["usage"]["calls"] == 1
    assert len(server.requests) == 2


async def test_a_session_without_the_agents_python_is_fatal_environment_unsupported(tmp_path, cache, monkeypatch):
    try:
        from agentcompass_sandbox import host_problem
    except ImportError:
        pytest.skip("the sandbox plugin is not installed")
    if host_problem() is not None:
        pytest.skip(host_problem())
    # An interpreter only the host sees (the sandbox has a /tmp of its own): the
    # entry builds, and its venv's python is missing inside the session.
    private = tmp_path / "host-only"
    private.mkdir()
    os.symlink(os.path.realpath("/usr/bin/python3") if os.path.exists("/usr/bin/python3") else sys.executable,
               private / "python3")  # fmt: skip
    monkeypatch.setenv("AGENTCOMPASS_AGENT_PYTHON", str(private / "python3"))
    server = ModelServer(episode([text("never")]))
    harness = {"agent": "noop-agent", "version": _version()}
    result, run_dir = await launch(tmp_path, server, harness, tasks=["hello-file"])
    (record,) = details(run_dir).values()
    issues = _attempt(record)["issues"]
    assert [(i["severity"], i["code"], i["phase"]) for i in issues] == [("fatal", "environment_unsupported", "setup")]
    assert "needs Python >= 3.10" in issues[0]["message"]
    assert server.requests == []


async def test_a_version_that_is_a_path_is_refused_at_load_and_touches_nothing_outside_the_cache(tmp_path, cache):
    import agentcompass
    from agentcompass import IssueError
    from agentcompass.harnesses._agent_cache import ensure_installed

    # cache is <tmp>/agent-cacheN: "1.0/../../victim" would name <tmp>/victim, and its lock beside it.
    victim = cache.parent / "victim"
    victim.mkdir(exist_ok=True)
    (victim / "keep").write_text("mine")
    before = sorted(p.name for p in cache.parent.iterdir())
    bad = "1.0/../../victim"
    config = tmp_path / "bad.yaml"
    config.write_text(
        "requests:\n  - name: bad\n"
        f"    benchmark: {{id: terminal, config: {{path: {SMOKE}}}}}\n"
        f'    harness: {{id: installed, config: {{agent: noop-agent, version: "{bad}"}}}}\n'
        "    environment: {id: local}\n"
        '    model: {name: m, base_url: "http://127.0.0.1:9/v1", api_key: k}\n'
        "plugins: [agentcompass.testing.noop_agent]\n"
    )
    compass = os.path.join(os.path.dirname(sys.executable), "compass")
    done = await trio.run_process([compass, "validate", str(config)], capture_stdout=True, capture_stderr=True,
                                  check=False)  # fmt: skip
    assert done.returncode == 2, done
    (line,) = done.stderr.decode().strip().splitlines()
    assert "version '1.0/../../victim'" in line
    # Through the SDK: refused before anything runs, and the cache itself refuses such a key.
    server = ModelServer(episode([text("never")]))
    refused: list[str] = []
    try:
        await launch(tmp_path, server, {"agent": "noop-agent", "version": bad}, tasks=["hello-file"],
                     environment="local", run_network=None)  # fmt: skip
    except* agentcompass.CompassError as group:
        refused = [str(e) for e in group.exceptions]
    assert len(refused) == 1 and "must be a plain name" in refused[0] and server.requests == []
    with pytest.raises(IssueError, match="not a plain name"):
        await ensure_installed(f"noop-agent-{bad}", [], root=cache)
    assert (victim / "keep").read_text() == "mine"
    assert sorted(p.name for p in cache.parent.iterdir()) == before


async def test_a_killed_gateway_using_launch_leaves_nothing_in_the_temp_directory_after_reap(tmp_path, cache):
    import shutil
    import signal
    import tempfile

    temp = tempfile.mkdtemp(prefix="acgw-")  # short: a unix socket's path has a length limit
    config = tmp_path / "run.yaml"
    server = ModelServer(episode([text("slow").after(600)]))
    env = {**os.environ, "TMPDIR": temp, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    compass = os.path.join(os.path.dirname(sys.executable), "compass")
    stderr = tmp_path / "stderr.txt"

    def gateways(prefix: str = "agentcompass-gateway-") -> list[str]:
        return [name for name in os.listdir(temp) if name.startswith(prefix)]

    try:
        async with trio.open_nursery() as nursery:
            url = await nursery.start(server.serve)
            config.write_text(
                "plugins: [agentcompass.testing.noop_agent]\nrequests:\n  - name: killed\n"
                f"    benchmark: {{id: terminal, config: {{path: {SMOKE}}}}}\n"
                f'    harness: {{id: installed, config: {{agent: noop-agent, version: "{SHARED}", args: ["2"]}}}}\n'
                f"    environment: {{id: local, config: {{root: {tmp_path / 'sandboxes'}}}}}\n"
                f'    model: {{name: scripted, base_url: "{url}", api_key: "{KEY}"}}\n'
                "    task_ids: [hello-file]\n"
                f"    output_root: {tmp_path / 'runs'}\n"
            )
            (tmp_path / "sandboxes").mkdir()
            err = await trio.to_thread.run_sync(open, stderr, "wb")
            with err:
                proc = await trio.lowlevel.open_process([compass, "launch", str(config)], env=env,
                                                        stdout=subprocess.DEVNULL, stderr=err)  # fmt: skip
            try:
                # A call in flight through the gateway, or the launch ended (a failure, shown below).
                async with trio.open_nursery() as waiting:

                    async def ended() -> None:
                        await proc.wait()
                        waiting.cancel_scope.cancel()

                    waiting.start_soon(ended)
                    await server.wait_until(lambda s: len(s.requests) >= 1)
                    waiting.cancel_scope.cancel()
                assert proc.returncode is None, stderr.read_text()
                assert gateways("agentcompass-gateway-ac")
            finally:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGKILL)
                await proc.wait()
            (run_dir,) = (tmp_path / "runs" / "killed").iterdir()
            tag = json.loads((run_dir / "run_info.json").read_text())["tag"]
            assert gateways(f"agentcompass-gateway-{tag}-")  # what the kill left
            reap = await trio.run_process([compass, "reap", str(run_dir)], env=env, capture_stdout=True,
                                          capture_stderr=True, check=False)  # fmt: skip
            nursery.cancel_scope.cancel()
        assert reap.returncode == 0, reap.stderr
        assert gateways() == []
        assert list((tmp_path / "sandboxes").iterdir()) == []
    finally:
        shutil.rmtree(temp, ignore_errors=True)


async def test_an_upstream_echoing_the_key_in_a_200_reply_leaks_it_neither_to_the_agent_nor_the_run_directory(
    tmp_path, cache
):
    from agentcompass.testing.model_server import echo_headers

    server = ModelServer(episode([echo_headers(200), echo_headers(200)]))
    harness = {"agent": "noop-agent", "version": SHARED, "args": ["2"]}
    result, run_dir = await launch(tmp_path, server, harness, tasks=["hello-file"], environment="local", run_network=None)
    assert [r.headers["authorization"] for r in server.requests] == [f"Bearer {KEY}"] * 2  # echoed back, twice
    got = json.loads(next(run_dir.glob("tasks/*/attempt-0/logs/agent/noop.json")).read_text())
    assert "authorization" in json.dumps(got) and "**********" in json.dumps(got)  # what the agent read, masked
    grep = await trio.run_process(["grep", "-r", "-l", "-F", KEY[3:], str(run_dir)], capture_stdout=True, check=False)
    assert grep.returncode == 1 and grep.stdout == b"", grep.stdout  # nowhere in the run directory
