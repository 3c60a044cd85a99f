"""A terminal task's evaluation: run ``test.sh``, then read the reward and the logs it left as hostile input."""

from __future__ import annotations

import json
import math
import posixpath
from typing import Literal

from agentcompass import EnvironmentSession, Evaluation, FileRefusedError, Issue, IssueError, PreparedTask, RunResult
from agentcompass.runtime import command_output

from ._terminal_files import APP, TESTS, Tree, run_checked, starting_files, test_files, upload

__all__ = ["MAX_LOG_BYTES", "read_logs", "run_verifier"]

_RUN_TESTS = 'bash "${TESTS_DIR:-/tests}/test.sh"'
_RUN_TB_TESTS = 'bash "${TESTS_DIR:-/tests}/run-tests.sh"'
# Tried in this order (as Harbor does); read as regular files of at most 1 MiB.
_REWARD_FILES = ("reward.txt", "reward.json")
_MAX_REWARD_BYTES = 1024 * 1024
# What is kept of /logs/verifier and /logs/agent per attempt, at most (SPEC 10).
MAX_LOG_BYTES = 16 * 1024 * 1024
# What a session made that makes a reward file unreadable: scored, not FATAL.
_SESSION_MADE = (FileRefusedError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)
_RESET_VERIFIER = """set -e
t="${TESTS_DIR:-/tests}"; v="${LOGS_DIR:-/logs}/verifier"
mkdir -p "$t" "$v"
find "$t" "$v" -mindepth 1 -delete
"""
# Prints the name of the reward file test.sh left, reward.txt first, whatever
# it is (a FIFO or a link is found, then refused by read_file).
_FIND_REWARD = """v="${LOGS_DIR:-/logs}/verifier"
for f in reward.txt reward.json; do { [ -e "$v/$f" ] || [ -L "$v/$f" ]; } && { echo "$f"; exit 0; }; done
exit 0
"""
# Lists the regular files under a /logs directory, "SIZE PATH" NUL-separated,
# bounded (what a session made there is hostile: read_file checks each again).
_LIST_LOGS = """d="${LOGS_DIR:-/logs}/%s"
[ -d "$d" ] && cd "$d" && find . -type f -printf '%%s %%P\\0' 2>/dev/null | head -c 262144
exit 0
"""


async def run_verifier(prepared: PreparedTask, run_result: RunResult, env: EnvironmentSession | None) -> Evaluation:
    """Run the task's verifier in ``env`` and read its reward and logs (see the module docstring of ``terminal``)."""
    if env is None:
        raise IssueError(
            "error",
            "scoring_failed",
            "benchmark 'terminal' runs tests/test.sh in an Environment; eval_mode 'none' cannot score it (use 'reuse')",
        )
    task = prepared.task
    own = env.handle == prepared.metadata.get("prepared_in")
    if not own and not prepared.metadata.get("in_image"):
        # A fresh evaluation sandbox on the host's userland: give it the task's starting files.
        await upload(env, await starting_files(task), APP)
    tests = await test_files(task)
    older = task.data.get("layout") == "terminal-bench"
    command = _RUN_TB_TESTS if older else _RUN_TESTS
    verifier_env = dict(task.data.get("verifier_env") or {})
    if older:
        verifier_env.setdefault("TEST_DIR", "/tests")
    used = sum(len(content) for content in _log_bytes(run_result).values())
    try:
        # Where the provider can, test.sh is read and its reward written where
        # nothing the agent left running can reach; else in the shared directories.
        result, private = await env.exec_private(
            command,
            env=verifier_env or None,
            directory="/logs/verifier",
            max_bytes=MAX_LOG_BYTES,
            inputs=_inputs(tests),
        )
    except NotImplementedError:
        try:
            await run_checked(env, _RESET_VERIFIER, "reset the verifier directories")
            await upload(env, tests, TESTS)
        except IssueError as exc:
            if not own or exc.code != "environment_failed":
                raise
            # In the session the agent ran in, a setup command that fails is its doing.
            return _zero("verifier_setup_failed", exc.message, "error")
        result, private = await env.exec(command, env=verifier_env or None), None
    # Kept with the attempt (the run result's artifacts are the attempt's), so a zero can be explained.
    run_result.artifacts["verifier"] = command_output(result)
    kept = private if private is not None else await read_logs(env, "verifier", MAX_LOG_BYTES - used, prefix="")
    _keep_logs(run_result, {f"verifier/{rel}": content for rel, content in kept.items()}, MAX_LOG_BYTES - used)
    if older:
        reward = 1.0 if result.exit_code == 0 and not result.timed_out else 0.0
        return Evaluation(values={"reward": reward, "passed": reward >= 1})
    if private is not None:
        found = next((name for name in _REWARD_FILES if name in private), None)
        if found is None:
            return _zero("reward_missing", f"tests/test.sh wrote no reward file (exit code {result.exit_code})")
        raw = private[found]
        if len(raw) > _MAX_REWARD_BYTES:
            return _zero("reward_unparseable", f"{found}: larger than {_MAX_REWARD_BYTES} bytes")
    else:
        found = (await env.exec(_FIND_REWARD)).stdout.strip()
        if found not in _REWARD_FILES:
            return _zero("reward_missing", f"tests/test.sh wrote no reward file (exit code {result.exit_code})")
        try:
            raw = await env.read_file(f"/logs/verifier/{found}", max_bytes=_MAX_REWARD_BYTES)
        except Exception as exc:
            made = _made_by_session(exc)
            if made is None:
                raise
            if isinstance(made, FileNotFoundError):
                return _zero("reward_unparseable", f"{found} vanished before it was read")
            return _zero("reward_unparseable", f"{found}: {made}")
    try:
        values = _parse_reward(found, raw)
    except ValueError as exc:
        return _zero("reward_unparseable", f"{found}: {exc}")
    return Evaluation(values={**values, "passed": values["reward"] >= 1})


def _log_bytes(run_result: RunResult) -> dict[str, bytes]:
    logs = run_result.artifacts.get("logs")
    return logs if isinstance(logs, dict) else {}


def _keep_logs(run_result: RunResult, files: dict[str, bytes], budget: int) -> None:
    """Add ``files`` to the run result's kept logs, within ``budget`` bytes
    (the runtime writes them to the attempt's ``logs/`` directory)."""
    logs = dict(_log_bytes(run_result))
    for rel, content in sorted(files.items()):
        if len(content) > budget:
            continue
        logs[rel] = content
        budget -= len(content)
    if logs:
        run_result.artifacts["logs"] = logs


async def read_logs(env: EnvironmentSession, sub: str, budget: int, prefix: str | None = None) -> dict[str, bytes]:
    """The regular files under ``/logs/<sub>``, at most ``budget`` bytes in
    all (``<sub>/path`` -> bytes, or ``path`` with ``prefix=""``). A file
    the session swapped for a link or a FIFO is left out, never followed."""
    prefix = f"{sub}/" if prefix is None else prefix
    listing = (await env.exec(_LIST_LOGS % sub)).stdout
    files: dict[str, bytes] = {}
    for entry in listing.split("\0"):
        size_text, _, rel = entry.partition(" ")
        if not rel or not size_text.isdigit() or ".." in rel.split("/"):
            continue
        size = int(size_text)
        if size > budget:
            continue
        try:
            content = await env.read_file(f"/logs/{sub}/{rel}", max_bytes=budget)
        except Exception as exc:
            if _made_by_session(exc) is None:
                raise
            continue
        files[prefix + rel] = content
        budget -= len(content)
    return files


def _made_by_session(exc: BaseException) -> OSError | None:
    """The file error in ``exc`` that what the session holds explains (a link,
    a FIFO, a file too large or gone), else None. The runtime passes
    :class:`FileRefusedError` through and tags the provider's other errors as
    Environment failures, keeping the provider's error as the cause."""
    for candidate in (exc, exc.__cause__):
        if isinstance(candidate, _SESSION_MADE):
            return candidate
    return None


def _zero(code: str, message: str, severity: Literal["warning", "error"] = "warning") -> Evaluation:
    return Evaluation(
        values={"reward": 0.0, "passed": False},
        issues=[Issue(severity, "evaluate", code, message)],
    )


def _inputs(tree: Tree) -> dict[str, bytes]:
    """The verifier's files for ``exec_private``: those of ``tests/``, links
    inside it taken as the files they name."""
    files = {rel: content for rel, content, _ in tree.files}
    for rel, target in tree.links:
        named = posixpath.normpath(posixpath.join(posixpath.dirname(rel), target))
        if named in files:
            files[rel] = files[named]
    return {f"{TESTS[0]}/{rel}": content for rel, content in files.items()}


def _parse_reward(name: str, raw: bytes) -> dict[str, float]:
    """The values in ``reward.txt`` (one number: ``reward``) or
    ``reward.json`` (each numeric entry a value of its own; ``reward`` its
    ``"reward"`` entry, else the mean of the entries); ValueError if malformed."""
    text = raw.decode("utf-8", errors="replace").strip()
    if name == "reward.txt":
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"not a number: {text[:60]!r}") from None
        values = {"reward": value}
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            raise ValueError("not valid JSON") from None
        if not isinstance(data, dict) or not data:
            raise ValueError("expected a non-empty JSON object of numbers")
        values = {str(k): v for k, v in data.items() if k != "passed"}
        if not values or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values.values()):
            raise ValueError("expected numbers as values")
        values = {k: float(v) for k, v in values.items()}
        if "reward" not in values:
            values["reward"] = sum(values.values()) / len(values)
    for key, value in values.items():
        if not math.isfinite(value):
            raise ValueError(f"{key} is not a finite number: {value}")
    return values
