"""The optional streaming hook of ``EnvironmentSession`` and the shared tail rule."""

from __future__ import annotations

from typing import Any

import pytest

from agentcompass.runtime import EnvironmentSession, ExecResult, NetworkPolicy, OutputTail, command_output


class ExecOnly(EnvironmentSession):
    """A provider session that implements ``exec`` alone."""

    def __init__(self, result: ExecResult):
        self.result = result
        self.calls: list[tuple[Any, ...]] = []

    async def exec(self, cmd, timeout=None, cwd=None, env=None):  # type: ignore[no-untyped-def]
        self.calls.append((cmd, timeout, cwd, env))
        return self.result

    async def set_network_policy(self, policy: NetworkPolicy) -> None:
        pass


async def test_the_default_exec_stream_hands_over_the_result_text_once_exec_returns():
    session = ExecOnly(ExecResult(exit_code=3, stdout="out \u20ac\udcff", stderr="err", timed_out=True))
    chunks: list[tuple[str, bytes]] = []

    async def on_output(stream: str, chunk: bytes) -> None:
        chunks.append((stream, chunk))

    result = await session.exec_stream(["a", "b"], 5, "app", {"K": "v"}, on_output=on_output)
    assert session.calls == [(["a", "b"], 5, "app", {"K": "v"})]
    # Lone surrogates (bytes that were not UTF-8) go back to the bytes they were.
    assert chunks == [("stdout", "out \u20ac".encode() + b"\xff"), ("stderr", b"err")]
    assert result == ExecResult(exit_code=3, stdout="", stderr="", timed_out=True)


async def test_the_default_exec_stream_skips_empty_streams():
    session = ExecOnly(ExecResult(exit_code=0))
    chunks: list[tuple[str, bytes]] = []

    async def on_output(stream: str, chunk: bytes) -> None:
        chunks.append((stream, chunk))

    assert await session.exec_stream("true", on_output=on_output) == ExecResult(exit_code=0)
    assert chunks == []


def test_output_tail_keeps_the_end_within_the_limit_with_a_marker():
    tail = OutputTail(40)
    for i in range(100):
        tail.append(f"{i:03d}\n".encode())
    text = tail.text()
    assert text == "[... 360 earlier bytes dropped ...]\n099\n"
    assert len(text.encode()) == 40
    short = OutputTail(40)
    short.append(b"abc")
    short.append(b"\xe2\x82")  # cut mid-character
    assert short.text() == "abc\ufffd"
    with pytest.raises(ValueError):
        OutputTail(0)


def test_command_output_keeps_the_last_16_kib_of_each_stream_on_a_character_boundary():
    # What the terminal verifier and the oracle harness keep of a finished command.
    assert command_output(ExecResult(3, "short", "")) == {"exit_code": 3, "stdout": "short", "stderr": ""}
    kept = command_output(ExecResult(0, "é" * 16 * 1024, "x" + "é" * 8 * 1024))
    assert kept["stdout"] == "é" * 8 * 1024  # two bytes each
    assert kept["stderr"] == "é" * 8 * 1024 and len(kept["stderr"].encode()) == 16 * 1024
    assert command_output(ExecResult(-9, "partial", timed_out=True))["exit_code"] is None
