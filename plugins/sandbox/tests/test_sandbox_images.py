"""``sandbox`` with images (SPEC 12 "Sandbox images"): tasks built in the
private daemon run over their unpacked root, as root inside mapped to an
unprivileged host range, with ``storage_mb`` enforced, a private verifier
run nothing of the agent's can touch, the conformance kit passing, and a
later provider reusing the root with no daemon at all."""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from _common import read_json
from _sandbox_support import census, new_tag, requires_sandbox
from agentcompass_docker.base import BASE_IMAGE
from agentcompass_sandbox import SandboxEnvironment, _images

import agentcompass
from agentcompass import ComponentError, ExecutionPlan, IssueError, NetworkPolicy, SandboxSpec
from agentcompass.testing import EnvironmentConformance, hang_guard

REPO = Path(agentcompass.__file__).resolve().parents[1]
IMAGES = REPO / "benchmarks_data" / "terminal-images"
IMAGE_TASKS = sorted(d.name for d in IMAGES.iterdir() if d.is_dir())
COMPASS = str(Path(sys.executable).with_name("compass"))
NONE = NetworkPolicy("none")

pytestmark = requires_sandbox


@pytest.fixture(scope="session")
def image_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One image cache for the test session: each image is unpacked once in it."""
    return str(tmp_path_factory.mktemp("images") / "cache")


def config(daemon: Any, cache: str, **extra: Any) -> dict[str, Any]:
    return {"docker_host": daemon.host, "pull": "never", "image_cache": cache, **extra}


#: The docker tests' image with python3 in it.
PYTHON_IMAGE = Path(__file__).resolve().parents[3] / "plugins" / "docker" / "tests" / "images" / "python3"


def plan(**sandbox: Any) -> ExecutionPlan:
    spec = SandboxSpec(**{"image": BASE_IMAGE, **sandbox})
    return ExecutionPlan("images", 0, agentcompass.ComponentRef("sandbox"), sandbox=spec)


def overlays(cache: str) -> int:
    """Overlay mounts over a root of ``cache``: the sessions open over its images."""
    with open("/proc/self/mounts") as mounts:
        return sum(1 for line in mounts if line.split()[2] == "overlay" and f"lowerdir={cache}/" in line)


async def test_a_session_runs_as_root_in_its_image_mapped_to_unprivileged_ids(
    docker_daemon: Any, image_cache: str
) -> None:
    env = SandboxEnvironment(config(docker_daemon, image_cache))
    with hang_guard(300):
        session = await env.open(env.build_config(plan(env={"TASK": "1"})), NONE, name=new_tag())
        try:
            done = await session.exec("id -u; cat /proc/self/uid_map; . /etc/os-release; echo $ID; echo $TASK; pwd")
            uid, mapping, distro, task, cwd = done.stdout.split("\n")[:5]
            assert (uid, distro, task, cwd) == ("0", "debian", "1", "/")
            assert mapping.split() == ["0", str(_images.UID_BASE), "65536"]
            # Root inside owns nothing of the host: the network namespace is the host's root's.
            assert (await session.exec("ip link set lo down 2>&1 || echo refused")).stdout.strip().endswith("refused")
            await session.exec("echo agent > /etc/written-inside")
            assert await session.read_file("/etc/written-inside") == b"agent\n"
            await session.write_file("/app/from-host", b"runtime")
            assert (await session.exec("stat -c %u:%g /app/from-host")).stdout == "0:0\n"
            # The image's root is never written: the session's writes are its upper layer's.
            root = session.image
            assert root is not None
            assert not Path(root.rootfs, "etc/written-inside").exists()
            assert Path(root.rootfs).stat().st_uid == _images.UID_BASE
        finally:
            await session.close()
        assert overlays(image_cache) == 0
        assert await census(session.name) == []


async def test_storage_mb_stops_a_two_gib_write(docker_daemon: Any, image_cache: str) -> None:
    env = SandboxEnvironment(config(docker_daemon, image_cache))
    with hang_guard(300):
        session = await env.open(env.build_config(plan(storage_mb=64)), NONE, name=new_tag())
        try:
            done = await session.exec("dd if=/dev/zero of=/big bs=1M count=2048 2>&1; du -sm /big", timeout=120)
            assert "No space left on device" in done.stdout, done
            assert int(done.stdout.split()[-2]) <= 64
            done = await session.exec("dd if=/dev/zero of=/tmp/more bs=1M count=16 2>&1", timeout=60)
            assert done.exit_code != 0  # the whole session's writes share the bound, /tmp included
        finally:
            await session.close()


async def test_a_daemon_planted_reward_scores_nothing_in_the_private_run(docker_daemon: Any, image_cache: str) -> None:
    env = SandboxEnvironment(config(docker_daemon, image_cache))
    with hang_guard(300):
        session = await env.open(env.build_config(plan()), NONE, name=new_tag())
        try:
            # The agent's daemon, root in the session, writes a reward where the verifier will.
            planter = "while :; do mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt; sleep 0.01; done"
            await session.exec(f"setsid nohup sh -c '{planter}' >/dev/null 2>&1 < /dev/null &")
            result, files = await session.exec_private(
                "cat /tests/test.sh; sh /tests/test.sh; sleep 0.3; id -u",
                directory="/logs/verifier",
                max_bytes=1 << 20,
                inputs={"/tests/test.sh": b"echo 0 > /logs/verifier/reward.txt\n"},
            )
            assert result.exit_code == 0, result
            assert result.stdout.endswith("0\n")  # root, as in the image
            assert files == {"reward.txt": b"0\n"}
            assert (await session.read_file("/logs/verifier/reward.txt")) == b"1\n"  # the daemon wrote its own
        finally:
            await session.close()


@pytest.mark.parametrize("check", EnvironmentConformance.CHECKS)
async def test_sandbox_with_images_conforms(docker_daemon: Any, image_cache: str, check: str) -> None:
    env = SandboxEnvironment(config(docker_daemon, image_cache))
    # The gateway checks' in-session client (and the gateway's forwarder) need python3.
    image = docker_daemon.test_image("test-python3", PYTHON_IMAGE) if check.startswith("gateway_") else BASE_IMAGE
    kit = EnvironmentConformance(
        env,
        plan=plan(image=image),
        # An image the daemon lacks, with pull "never": open fails before making anything.
        failing_config=attrs.evolve(env.build_config(plan()), image="agentcompass/absent:1"),
        count_sandboxes=lambda: overlays(image_cache),
        host_address=lambda session: session.addresses[0],
        isolated=True,
        kill_init="kill -9 -1",
        tag=new_tag(),
        policies=[NetworkPolicy("none"), NetworkPolicy("allowlist", ("127.0.0.1:9",)), NetworkPolicy("full")],
    )
    if check not in kit.checks():
        pytest.skip(f"{check} does not apply")
    with hang_guard(300):
        await kit.run(check)


async def test_a_later_provider_reuses_the_root_without_a_daemon(docker_daemon: Any, tmp_path: Path) -> None:
    cache = str(tmp_path / "cache")
    task = tmp_path / "task"
    task.mkdir()
    (task / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nRUN echo built > /built\nWORKDIR /srv\nENV WHO=image\n")
    first = SandboxEnvironment(config(docker_daemon, cache))
    with hang_guard(300):
        spec = plan(image=None, build_context=task)
        session = await first.open(first.build_config(spec), NONE, name=new_tag())
        try:
            done = await session.exec("cat /built; pwd; echo $WHO")
            assert done.stdout == "built\n/srv\nimage\n"
        finally:
            await session.close()
        assert (first.images.builds, first.images.cache.unpacks) == (1, 1)
        # A later run: no daemon answers, and none is needed.
        later = SandboxEnvironment(config(docker_daemon, cache, docker_host=f"unix://{tmp_path}/gone.sock"))
        session = await later.open(later.build_config(spec), NONE, name=new_tag())
        try:
            assert (await session.exec("cat /built")).stdout == "built\n"
        finally:
            await session.close()
        assert (later.images.builds, later.images.cache.unpacks) == (0, 0)


#: A registry nothing listens on: the pull fails at once, as behind a firewall.
UNREACHABLE = "127.0.0.1:9/none/x:1"


async def test_image_source_builds_the_context_of_an_image_that_cannot_be_had(
    docker_daemon: Any, image_cache: str, tmp_path: Path
) -> None:
    """SPEC 12 "Image source", as under docker: ``build`` and
    ``prebuilt_else_build`` (one WARNING per provider) run over the build,
    ``prebuilt`` is FATAL ``image_build_failed`` naming the image."""
    context = tmp_path / "environment"
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nRUN echo context > /opt/from-context\n")
    spec = plan(image=UNREACHABLE, build_context=context)

    async def opened(env: SandboxEnvironment) -> tuple[str, list[tuple[str, str, str]]]:
        session = await env.open(env.build_config(spec), NONE, name=new_tag())
        try:
            issues = [(i.severity, i.code, i.message) for i in session.open_issues]
            return (await session.exec("cat /opt/from-context")).stdout, issues
        finally:
            await session.close()

    with hang_guard(300):
        built = SandboxEnvironment(config(docker_daemon, image_cache, pull="missing", image_source="build"))
        assert await opened(built) == ("context\n", [])
        fallback = SandboxEnvironment(
            config(docker_daemon, image_cache, pull="missing", image_source="prebuilt_else_build")
        )
        output, issues = await opened(fallback)
        assert output == "context\n"
        [(severity, code, message)] = issues
        assert (severity, code) == ("warning", "image_built_instead") and UNREACHABLE in message
        assert await opened(fallback) == ("context\n", [])  # once per provider, that is per request
        prebuilt = SandboxEnvironment(config(docker_daemon, image_cache, pull="missing"))
        with pytest.raises(IssueError) as caught:
            await prebuilt.open(prebuilt.build_config(spec), NONE, name=new_tag())
        assert (caught.value.severity, caught.value.code) == ("fatal", "image_build_failed")
        assert UNREACHABLE in caught.value.message
    with pytest.raises(ComponentError, match=r"^environment 'sandbox': 'image_source' must be in .*'sometimes'"):
        SandboxEnvironment({"image_source": "sometimes"})


def _launch(config_path: Path, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], Path]:
    done = subprocess.run(
        [COMPASS, "launch", str(config_path), "--output-root", str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=900,
    )
    runs = sorted((tmp_path / "runs").glob("*/*/run_info.json"), key=lambda p: p.stat().st_mtime)
    return done, runs[-1].parent


def _request(tmp_path: Path, name: str, tasks: Path, environment: dict[str, Any]) -> Path:
    request = {
        "orchestration": {"task_concurrency": 4},
        "requests": [
            {
                "name": name,
                "benchmark": {"id": "terminal", "config": {"path": str(tasks)}},
                "harness": {"id": "oracle"},
                "environment": environment,
            }
        ],
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps(request))
    return path


def test_the_image_tasks_pass_with_oracle_under_sandbox(docker_daemon: Any, image_cache: str, tmp_path: Path) -> None:
    environment = {"id": "sandbox", "config": config(docker_daemon, image_cache)}
    done, run = _launch(_request(tmp_path, "images", IMAGES, environment), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    records = {r["task_id"]: r for r in (read_json(p) for p in run.glob("details/*/*.json"))}
    assert sorted(records) == IMAGE_TASKS
    for task, record in records.items():
        [attempt] = record["attempts"]
        assert attempt["values"]["passed"] is True, (task, attempt["issues"])
        assert attempt["issues"] == [], (task, attempt["issues"])
    assert records["offline"]["attempts"][0]["plan"]["run_network_policy"]["mode"] == "none"


def _local_repository(directory: Path) -> None:
    """A flat apt repository of ``hello`` in ``directory`` (``Packages`` made
    here from the .deb's control fields): apt-get installs from it offline."""
    debs = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "agentcompass" / "debs"
    found = sorted(debs.glob("hello_*.deb")) or sorted(Path("/var/cache/apt/archives").glob("hello_*.deb"))
    if not found:
        debs.mkdir(parents=True, exist_ok=True)
        subprocess.run(["apt-get", "download", "hello"], cwd=debs, capture_output=True, timeout=120, check=False)
        found = sorted(debs.glob("hello_*.deb"))
    if not found or shutil.which("dpkg-deb") is None:
        pytest.skip("no hello .deb here and none downloadable (apt-get download hello)")
    deb = found[-1]
    directory.mkdir(parents=True)
    shutil.copy(deb, directory / deb.name)
    control = subprocess.run(["dpkg-deb", "-f", str(deb)], capture_output=True, text=True, check=True).stdout
    data = deb.read_bytes()
    control = control.rstrip("\n") + f"\nFilename: ./{deb.name}\nSize: {len(data)}\n"
    control += f"SHA256: {hashlib.sha256(data).hexdigest()}\n\n"
    (directory / "Packages").write_text(control)


def test_a_task_that_apt_get_installs_a_package_passes_with_oracle(
    docker_daemon: Any, image_cache: str, tmp_path: Path
) -> None:
    tasks = tmp_path / "tasks"
    task = tasks / "install-hello"
    _local_repository(task / "environment" / "repo")
    (task / "environment" / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\nCOPY repo /opt/repo\n"
        'RUN echo "deb [trusted=yes] file:/opt/repo ./" > /etc/apt/sources.list && rm -rf /etc/apt/sources.list.d/*\n'
        "WORKDIR /app\n"
    )
    (task / "instruction.md").write_text("Install the hello package with apt-get.\n")
    (task / "task.toml").write_text("[environment]\nallow_internet = false\n[verifier]\ntimeout_sec = 120\n")
    (task / "solution").mkdir()
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\nset -e\napt-get update\napt-get install -y hello\n")
    (task / "tests").mkdir()
    (task / "tests" / "test.sh").write_text(
        "#!/bin/bash\nif [ \"$(hello)\" = 'Hello, world!' ] && dpkg -s hello >/dev/null; then r=1; else r=0; fi\n"
        "echo $r > /logs/verifier/reward.txt\n"
    )
    environment = {"id": "sandbox", "config": config(docker_daemon, image_cache)}
    done, run = _launch(_request(tmp_path, "apt", tasks, environment), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    [record] = [read_json(p) for p in run.glob("details/*/*.json")]
    [attempt] = record["attempts"]
    assert attempt["values"]["passed"] is True, (attempt["issues"], attempt["run_result"])


def test_unpacking_is_shared_by_concurrent_attempts(tmp_path: Path) -> None:
    """Two processes asking for one archive's root: one unpacks, both get it."""
    archive = tmp_path / "image.tar"
    layer = tmp_path / "layer.tar"
    with tarfile.open(layer, "w") as tar:
        info = tarfile.TarInfo("hello")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    config_bytes = b'{"config": {}}'
    digest = hashlib.sha256(config_bytes).hexdigest()
    with tarfile.open(archive, "w") as tar:
        tar.add(layer, "l/layer.tar")
        (tmp_path / "c.json").write_bytes(config_bytes)
        tar.add(tmp_path / "c.json", f"{digest}.json")
        (tmp_path / "m.json").write_text(json.dumps([{"Config": f"{digest}.json", "Layers": ["l/layer.tar"]}]))
        tar.add(tmp_path / "m.json", "manifest.json")
    script = (
        "import sys, trio; from agentcompass_sandbox import _images\n"
        "m = _images.ImageMaker(_images.RootCache(sys.argv[1]), 'unix:///none')\n"
        "r = trio.run(m.root, 't', 'docker-archive:' + sys.argv[2], None)\n"
        "print(m.cache.unpacks, r.digest)\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(tmp_path / "cache"), str(archive)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    outputs = [p.communicate(timeout=120)[0].split() for p in procs]
    assert sorted(int(o[0]) for o in outputs) == [0, 0, 1]
    assert {o[1] for o in outputs} == {f"sha256:{digest}"}


async def test_the_first_open_waits_for_the_image_and_others_share_it(docker_daemon: Any, tmp_path: Path) -> None:
    env = SandboxEnvironment(config(docker_daemon, str(tmp_path / "cache")))
    sessions: list[Any] = []

    async def open_one() -> None:
        sessions.append(await env.open(env.build_config(plan()), NONE, name=new_tag()))

    with hang_guard(300):
        try:
            async with trio.open_nursery() as nursery:
                for _ in range(4):
                    nursery.start_soon(open_one)
            assert env.images.cache.unpacks == 1
            assert len({s.image.digest for s in sessions}) == 1
        finally:
            for session in sessions:
                await session.close()


def _image_processes() -> list[str]:
    """Processes running as an id of the images' range (an image session's, on this host)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                status = Path(f"/proc/{entry}/status").read_text()
            except OSError:
                continue
            uid = int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[2])
            if _images.UID_BASE <= uid < _images.UID_BASE + 65536:
                found.append(entry)
    return found


@pytest.mark.serial  # it counts every process of the images' id range on the host
def test_sigkill_at_random_instants_then_reap_leaves_no_mount_directory_or_namespace(
    docker_daemon: Any, image_cache: str, tmp_path: Path
) -> None:
    rng = random.Random(20261207)
    tasks = tmp_path / "tasks"
    for index in range(3):
        task = tasks / f"hold-{index}"
        (task / "environment").mkdir(parents=True)
        (task / "environment" / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nWORKDIR /app\n")
        (task / "instruction.md").write_text("Write done.\n")
        (task / "task.toml").write_text('version = "1.0"\n')
        (task / "solution").mkdir()
        (task / "solution" / "solve.sh").write_text("#!/bin/bash\nsetsid sleep 600 >/dev/null 2>&1 &\nsleep 0.3\n")
        (task / "tests").mkdir()
        (task / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    request = {
        "orchestration": {"task_concurrency": 3, "cleanup_grace_seconds": 10},
        "requests": [
            {
                "name": "killed",
                "benchmark": {"id": "terminal", "config": {"path": str(tasks)}},
                "harness": {"id": "oracle"},
                "environment": {"id": "sandbox", "config": config(docker_daemon, image_cache)},
                "execution": {"attempts": {"k": 4}},
            }
        ],
    }
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(request))
    output_root = tmp_path / "out"
    for _ in range(4):
        before = set(output_root.glob("killed/*"))
        proc = subprocess.Popen(
            [COMPASS, "launch", str(path), "--output-root", str(output_root)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            # Kill while the image is made, sessions open, solutions run or sessions close.
            deadline = time.monotonic() + 60
            while not set(output_root.glob("killed/*/sessions.jsonl")) - {p / "sessions.jsonl" for p in before}:
                assert time.monotonic() < deadline and proc.poll() is None, "no session was opened"
                time.sleep(0.01)
            time.sleep(rng.uniform(0, 2.5))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
        for run_dir in set(output_root.glob("killed/*")) - before:
            done = subprocess.run([COMPASS, "reap", str(run_dir)], capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, done.stderr[-2000:]
            names = {
                json.loads(line)["handle"]["name"]
                for line in (run_dir / "sessions.jsonl").read_text().splitlines()
                if line.strip() and "handle" in json.loads(line)
            }
            for name in names:
                assert trio.run(census, name) == [], name
        assert overlays(image_cache) == 0
        assert _image_processes() == []


def _pip_repository(directory: Path, wheels: Path) -> None:
    """A flat apt repository of ``python3-pip`` and what it needs beyond the
    base image, and a wheel of ``six``: downloaded once per machine (Debian's
    mirror and PyPI), so that the session installs both offline."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "agentcompass" / "debs" / "pip"
    if not (cache / "Packages").exists() or not list((cache / "wheels").glob("six-*.whl")):
        work = cache.with_name("pip.part")
        shutil.rmtree(work, ignore_errors=True)
        (work / "debs").mkdir(parents=True)
        (work / "empty" / "partial").mkdir(parents=True)
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "agentcompass" / "docker-base"
        status = subprocess.run(
            ["tar", "-xOf", str(base / "bookworm-minbase.tar"), "./var/lib/dpkg/status"], capture_output=True
        ).stdout
        (work / "status").write_bytes(status)
        uris = subprocess.run(
            ["apt-get", "-qq", "-o", f"Dir::State::status={work}/status", "-o", f"Dir::Cache::archives={work}/empty",
             "-o", "Debug::NoLocking=1", "install", "--print-uris", "--no-install-recommends", "python3-pip"],
            capture_output=True, text=True, timeout=120,
        ).stdout  # fmt: skip
        names = [line.split()[1].split("_")[0] for line in uris.splitlines() if line.strip()]
        got = subprocess.run(["apt-get", "download", *names], cwd=work / "debs", capture_output=True, timeout=300)
        wheel = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(work / "wheels"), "six"],
            capture_output=True,
            timeout=300,
        )
        if not names or not status or got.returncode or wheel.returncode or shutil.which("dpkg-scanpackages") is None:
            pytest.skip("python3-pip's packages or a six wheel could not be downloaded here")
        index = subprocess.run(["dpkg-scanpackages", "debs", "/dev/null"], cwd=work, capture_output=True, check=True)
        (work / "Packages").write_bytes(index.stdout)
        shutil.rmtree(cache, ignore_errors=True)
        work.rename(cache)
    shutil.copytree(cache / "debs", directory / "debs")
    shutil.copy(cache / "Packages", directory / "Packages")
    shutil.copytree(cache / "wheels", wheels)


async def test_apt_get_and_pip_install_work_as_root_in_a_session(
    docker_daemon: Any, image_cache: str, tmp_path: Path
) -> None:
    context = tmp_path / "context"
    await trio.to_thread.run_sync(_pip_repository, context / "repo", context / "wheels")
    (context / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\nCOPY repo /opt/repo\nCOPY wheels /opt/wheels\n"
        'RUN echo "deb [trusted=yes] file:/opt/repo ./" > /etc/apt/sources.list && rm -rf /etc/apt/sources.list.d/*\n'
    )
    env = SandboxEnvironment(config(docker_daemon, image_cache))
    with hang_guard(600):
        spec = plan(image=None, build_context=context, storage_mb=2048)
        session = await env.open(env.build_config(spec), NONE, name=new_tag())
        try:
            done = await session.exec(
                "apt-get update -qq && apt-get install -y -qq --no-install-recommends python3-pip >/dev/null "
                "&& pip install --no-index --break-system-packages /opt/wheels/six-*.whl "
                "&& python3 -c 'import six; print(six.__version__)' && stat -c %U /usr/lib/python3/dist-packages",
                timeout=500,
            )
            assert done.exit_code == 0, done
            version, owner = done.stdout.split()[-2:]
            assert version.count(".") == 2 and owner == "root"
        finally:
            await session.close()


def _tamper(path: Path) -> None:
    with open(path, "r+b") as blob:
        blob.seek(1000)
        blob.write(b"tampered")


async def test_a_named_image_is_pulled_from_a_registry_without_any_daemon(
    docker_daemon: Any, image_cache: str, tmp_path: Path
) -> None:
    """A registry of our own on loopback (``docker-registry``), the base image
    pushed there by the private daemon; the provider then pulls it with no
    daemon reachable."""
    pytest.importorskip("oras.provider", reason="the registry client (pip install oras)")
    if shutil.which("docker-registry") is None:
        pytest.skip("no docker-registry to serve a registry on loopback (apt-get install docker-registry)")
    import socket

    import httpx

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (tmp_path / "registry.yml").write_text(
        f"version: 0.1\nstorage: {{filesystem: {{rootdirectory: {tmp_path}/data}}}}\nhttp: {{addr: 127.0.0.1:{port}}}\n"
    )
    registry = await trio.lowlevel.open_process(
        ["docker-registry", "serve", str(tmp_path / "registry.yml")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with hang_guard(600):
            transport = httpx.AsyncHTTPTransport(uds=docker_daemon.host[len("unix://") :])
            async with httpx.AsyncClient(transport=transport, base_url="http://docker/v1.41", timeout=300) as client:
                name = f"127.0.0.1:{port}/base"
                tagged = await client.post(f"/images/{BASE_IMAGE}/tag", params={"repo": name, "tag": "1"})
                assert tagged.status_code == 201, tagged.text
                for _ in range(100):  # the registry answers once it listens
                    pushed = await client.post(
                        f"/images/{name}/push", params={"tag": "1"}, headers={"X-Registry-Auth": "e30="}
                    )
                    if b'"error"' not in pushed.content:
                        break
                    await trio.sleep(0.1)
                assert b'"error"' not in pushed.content, pushed.text
            gone = f"unix://{tmp_path}/gone.sock"
            env = SandboxEnvironment(
                config(docker_daemon, str(tmp_path / "cache"), docker_host=gone, pull="missing", pull_from="registry")
            )
            session = await env.open(env.build_config(plan(image=f"{name}:1")), NONE, name=new_tag())
            try:
                assert (await session.exec(". /etc/os-release; echo $ID")).stdout == "debian\n"
            finally:
                await session.close()
            assert env.images.cache.unpacks == 1 and env.images.builds == 0
            # A registry serving a layer that is not what the manifest names: refused, nothing unpacked.
            layers = sorted((tmp_path / "data").rglob("blobs/sha256/*/*/data"), key=lambda p: p.stat().st_size)
            await trio.to_thread.run_sync(_tamper, layers[-1])
            other = SandboxEnvironment({**env.config, "image_cache": str(tmp_path / "other")})
            with pytest.raises(agentcompass.IssueError, match="does not match its digest") as caught:
                await other.open(other.build_config(plan(image=f"{name}:1")), NONE, name=new_tag())
            assert caught.value.code == "image_build_failed"
            assert other.images.cache.unpacks == 0
    finally:
        registry.kill()
        await registry.wait()
