"""Redaction of credentials, and the logging chain that applies it."""

from __future__ import annotations

import json
import json as _json
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from hypothesis import given as _given
from hypothesis import settings as _settings
from hypothesis import strategies as _st

from agentcompass import _logging
from agentcompass._redact import MASK, redact, redact_bytes, redact_json_text, register_secret
from agentcompass.runtime._values import Secret

_GH = "ghp_" + "a1B2c3D4" * 5
_JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.sig-_part"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("key sk-abcdefgh1234 here", f"key {MASK} here"),
        ("sk-ant-api03-AbC_dEf-123", MASK),
        ("sk-short", "sk-short"),
        ("Authorization: Bearer sk-proj-abcdefgh1234", f"Authorization: Bearer {MASK}"),
        ("x-api-key: acgw-0123456789abcdefXYZ_-", f"x-api-key: {MASK}"),
        (f"token {_GH} end", f"token {MASK} end"),
        (f"got 401 for Bearer {_JWT}", f"got 401 for Bearer {MASK}"),
        ("hf_" + "x" * 34, MASK),
        ("AKIAABCDEFGHIJKLMNOP", MASK),
        ("AIza" + "B" * 35, MASK),
        ("xoxb-1234567890-abc", MASK),
        ("https://user:pw@host/x", f"https://user:{MASK}@host/x"),
    ],
)
def test_recognized_credentials_are_masked(text: str, expected: str) -> None:
    assert redact(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "max_tokens=100 total_tokens: 5",
        "the password is wrong",
        "secret_name=foo token_count: 3",
        "ws://host:8080/x",
        "harness_timeout: agent ran out of time after 600s",
        # A value is never masked because of the word before it.
        "task vulnerable-secret: ok",
        "alexgshaw/vulnerable-secret:latest",
        "api_key=${OPENAI_API_KEY} password: hunter2 Authorization: Basic dXNlcjpw",
        "task-1 ask-me desk-lamp-123456789",
        "",
    ],
)
def test_ordinary_text_is_untouched(text: str) -> None:
    assert redact(text) == text


def test_given_secrets_are_masked_as_substrings() -> None:
    assert redact("stdout: xyzzy-value-42 done", ["xyzzy-value-42"]) == f"stdout: {MASK} done"
    assert redact("value abcd", [Secret("abcd")]) == f"value {MASK}"


def test_short_secrets_are_ignored() -> None:
    assert redact("a b abc", ["a", "abc"]) == "a b abc"


def test_longest_secret_wins() -> None:
    assert redact("xx-longer-secret", ["longer", "xx-longer-secret"]) == MASK


def test_registered_secrets_are_masked_by_default() -> None:
    register_secret("registered-5f1c9e")
    register_secret(Secret("registered-secret-obj-77"))
    register_secret("abc")  # too short: ignored, not an error
    text = redact("a registered-5f1c9e b registered-secret-obj-77 abc")
    assert text == f"a {MASK} b {MASK} abc"


def test_regex_metacharacters_in_secrets() -> None:
    assert redact("p=(a+b)*[c] end", ["(a+b)*[c]"]).endswith(f"{MASK} end")


def test_redact_is_idempotent() -> None:
    once = redact("Authorization: Bearer sk-abcdefghijkl https://u:pw@h", ["pw@h"])
    assert redact(once) == once


@pytest.fixture
def logging_configured() -> Iterator[None]:
    saved = structlog.get_config()
    try:
        _logging.configure_logging(console=False)
        yield
    finally:
        for path in list(_logging._json_logs):
            _logging.remove_json_log(path)
        structlog.configure(**saved)


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.usefixtures("logging_configured")
def test_json_log_is_redacted(tmp_path: Path) -> None:
    path = tmp_path / "run" / "log.jsonl"
    _logging.add_json_log(path)
    register_secret("log-secret-6c2d")
    log = _logging.get_logger("test")
    log.info("calling model", headers={"Authorization": "Bearer sk-abcdef123456"}, note="log-secret-6c2d")
    _logging.remove_json_log(path)
    log.info("after detach")
    text = path.read_text()
    assert "abcdef123456" not in text
    assert "log-secret-6c2d" not in text
    [event] = _lines(path)
    assert event["event"] == "calling model"
    assert event["logger"] == "test"
    assert event["level"] == "info"


@pytest.mark.usefixtures("logging_configured")
def test_json_logs_route_by_request(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    _logging.add_json_log(a, request="a")
    _logging.add_json_log(b, request="b")
    log = _logging.get_logger("test")
    log.info("for a", request="a")
    log.bind(request="b").info("for b")
    log.info("for everyone")
    assert [e["event"] for e in _lines(a)] == ["for a", "for everyone"]
    assert [e["event"] for e in _lines(b)] == ["for b", "for everyone"]


@pytest.mark.usefixtures("logging_configured")
def test_exceptions_are_redacted(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    _logging.add_json_log(path)
    log = _logging.get_logger("test")
    register_secret("exc-secret-abc123")
    try:
        raise RuntimeError("connect failed api_key=exc-secret-abc123")
    except RuntimeError:
        log.exception("boom")
    assert "abc123" not in path.read_text()
    assert "RuntimeError" in path.read_text()


def test_console_output_is_redacted(capsys: pytest.CaptureFixture[str]) -> None:
    saved = structlog.get_config()
    try:
        _logging.configure_logging(console=True, level="info")
        _logging.get_logger("test").warning("oops", auth="Authorization: Bearer sk-zzz123456789")
        _logging.get_logger("test").debug("hidden")
    finally:
        structlog.configure(**saved)
    err = capsys.readouterr().err
    assert "oops" in err
    assert "zzz123" not in err
    assert "hidden" not in err


# -- JSON text ---------------------------------------------------------------------


_CREDENTIALISH = _st.sampled_from(
    [
        "sk-abcdefgh12345678",
        "Bearer abc.def",
        "https://u:p@h",
        "Authorization: x y",
        '"token": "t0k"',
        "token",
        "=",
        '"json-\\"quoted\\\\secret"',
    ]
)
_JSON_VALUES = _st.recursive(
    _st.none() | _st.booleans() | _st.integers() | _st.text() | _CREDENTIALISH,
    lambda children: (
        _st.lists(children, max_size=4)
        | _st.dictionaries(
            _st.text(max_size=12) | _st.sampled_from(["token", "api_key", "max_token", "password"]),
            children,
            max_size=4,
        )
    ),
    max_leaves=12,
)


@_settings(max_examples=300, deadline=None)
@_given(_JSON_VALUES, _st.booleans())
def test_redacting_json_text_never_breaks_it(value, pretty):
    text = _json.dumps(value, indent=2 if pretty else None)
    _json.loads(redact_json_text(text))


def test_json_text_loses_every_known_value_and_shape():
    register_secret('json-"quoted\\secret')
    record = {
        "output": "my key is sk-abcdefgh12345678",
        "trajectory": ["curl -H 'Authorization: Bearer acgw-abcdefghijklmnop1234' x", 'echo json-"quoted\\secret'],
        "max_token": 5,
    }
    text = _json.dumps(record)
    masked = _json.loads(redact_json_text(text))
    again = _json.dumps(masked)
    for leaked in ("sk-abcdefgh12345678", "acgw-abcdefghijklmnop1234", "quoted"):
        assert leaked not in again
    assert masked["max_token"] == 5


_PIECES = _st.sampled_from(
    ["sk-abcdefgh12345678", "acgw-abcdefghijklmnopq", "ghp_", "a1B2c3D4" * 4, "eyJabcdefghij.", "xoxb-", "AKIA",
     "Bearer abc.def", "api_key=XYZ123456", "Authorization: x y", "token=t0k", "TOKEN: v",
     "tokens", "token_", "password: pw12", "SECRET=s", "https://u:p@h", "key", "=", ":", " ", "\n", '"',
     "task-", "_", "x", "é", "-", "sk-"]
)  # fmt: skip


@_settings(max_examples=400, deadline=None)
@_given(_st.lists(_PIECES | _st.text(max_size=6), max_size=8))
def test_the_prefilter_never_changes_what_is_masked(parts):
    from agentcompass import _redact

    text = "".join(parts)
    known = _redact._text_pattern  # secrets other tests registered
    expected = known.sub(_redact.MASK, text) if known is not None else text
    assert redact(text) == _redact._SHAPES.sub(_redact._replace_shape, expected)
    assert redact_json_text(text) == _redact._SECRET_FIELDS.sub(lambda m: m.group(1) + MASK, redact(text))


# -- who configures structlog ----------------------------------------------------


def test_importing_the_package_configures_nothing() -> None:
    import subprocess
    import sys

    code = (
        "import structlog, agentcompass, agentcompass.testing, agentcompass.environments.local\n"
        "from agentcompass import _logging, launch\n"
        "_logging.get_logger('x')\n"
        "print(structlog.is_configured())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.fixture
def structlog_config() -> Iterator[None]:
    saved = structlog.get_config()
    structlog.reset_defaults()
    try:
        yield
    finally:
        structlog.configure(**saved)


@pytest.mark.usefixtures("structlog_config")
def test_redaction_holds_under_the_applications_own_chain() -> None:
    # The application's chain has no redaction of its own.
    capture = structlog.testing.LogCapture()
    structlog.configure(processors=[capture])
    register_secret("app-chain-secret-91f3")
    log = _logging.get_logger("test")
    log.bind(proxy="https://user:pw-bound-77@proxy").warning(
        "calling", headers={"Authorization": "Bearer sk-abcdef123456"}, note="app-chain-secret-91f3"
    )
    try:
        raise RuntimeError("connect failed api_key=app-chain-secret-91f3 abc123")
    except RuntimeError:
        log.exception("boom")
    text = repr(capture.entries)
    assert "abcdef123456" not in text and "app-chain-secret-91f3" not in text
    assert "pw-bound-77" not in text
    assert [e["event"] for e in capture.entries] == ["calling", "boom"]
    assert capture.entries[0]["note"] == MASK
    assert "RuntimeError" in capture.entries[1]["exception"]


@pytest.mark.usefixtures("structlog_config")
async def test_launch_configures_logging_only_while_it_runs_and_only_when_nobody_did(
    autojump_clock, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import agentcompass
    from agentcompass import Orchestration
    from agentcompass.testing import fake_request

    def orchestration(name: str) -> Orchestration:
        # A fatal open invalidates the task: the engine warns "task_invalidated".
        env = {"script": {"*": {"open": ["fatal:leaky_open_91c2"]}}}
        return Orchestration([fake_request(name, log=name, environment=env, output_root=tmp_path)], task_concurrency=1)

    assert not structlog.is_configured()
    await agentcompass.launch(orchestration("first"))
    # Redacted warnings reached stderr for an SDK user, and nothing outlives the call.
    assert "warning: first: task t000 invalidated: FATAL leaky_open_91c2" in capsys.readouterr().err
    assert not structlog.is_configured()

    capture = structlog.testing.LogCapture()
    structlog.configure(processors=[capture])
    await agentcompass.launch(orchestration("second"))
    assert structlog.get_config()["processors"] == [capture]
    assert "task_invalidated" in [e["event"] for e in capture.entries]
    assert "invalidated" not in capsys.readouterr().err


def test_an_echoed_x_api_key_header_is_masked_in_json_text():
    # Anthropic's key travels as x-api-key: a server echoing its headers into a body leaks nothing.
    register_secret("registered-anthropic-key-1")
    echoed = json.dumps(
        {"error": {"headers": {"x-api-key": "registered-anthropic-key-1", "accept": "application/json"}}}
    )
    masked = redact_json_text(echoed)
    assert "registered-anthropic-key-1" not in masked
    assert json.loads(masked)["error"]["headers"] == {"x-api-key": MASK, "accept": "application/json"}


def test_bytes_are_redacted_as_text_is():
    register_secret("bytes-secret-7f1e")
    data = b"\x00\xff log bytes-secret-7f1e sk-abcdefgh12345678 task vulnerable-secret: ok"
    assert (
        redact_bytes(data) == b"\x00\xff log " + MASK.encode() + b" " + MASK.encode() + b" task vulnerable-secret: ok"
    )


@_settings(max_examples=300, deadline=None)
@_given(_st.lists(_st.integers(min_value=0, max_value=120), max_size=10), _st.sampled_from(["", "x", "sk-a"]))
def test_a_stream_is_redacted_as_a_whole_wherever_it_is_cut(cuts, glue):
    from agentcompass._gateway._redactor import StreamRedactor

    register_secret("stream-secret-0a1b2c3d")
    text = f'data: {{"echo": "Bearer stream-secret-0a1b2c3d{glue}", "k": "sk-abcdefgh12345678"}}\n\n'.encode() * 2
    pieces, previous = [], 0
    for cut in sorted({min(c, len(text)) for c in cuts}) + [len(text)]:
        pieces.append(text[previous:cut])
        previous = cut
    redactor = StreamRedactor(("local-key-9z9z",))
    out = b"".join(redactor.feed(p) for p in pieces) + redactor.end()
    assert out == redact_bytes(text) and b"stream-secret" not in out and b"sk-abc" not in out
