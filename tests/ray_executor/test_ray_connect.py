"""Joining a cluster: what a failure to connect becomes, and the tries
through Ray Client (a fake of Ray's two calls, the seam ``_connect`` takes)."""

from __future__ import annotations

import pytest

from agentcompass import ConfigError
from agentcompass._ray import CLIENT_CONNECT_TRIES, _connect


class FakeRay:
    """``ray.init`` failing with ``failures`` in turn, then connecting."""

    def __init__(self, *failures: BaseException) -> None:
        self.failures = list(failures)
        self.calls: list[str] = []

    def init(self, address: str, **options: object) -> None:
        self.calls.append(f"init {address} {sorted(options)}")
        if self.failures:
            raise self.failures.pop(0)

    def shutdown(self) -> None:
        self.calls.append("shutdown")


def _aborted() -> ConnectionAbortedError:
    return ConnectionAbortedError("Initialization failure from server:\nRuntimeError: Starting Ray client server failed.")


def test_a_connection_ray_client_aborts_is_tried_again() -> None:
    ray = FakeRay(_aborted(), _aborted())
    _connect(ray, "ray://head:10001", pause=0)
    init = "init ray://head:10001 ['configure_logging', 'log_to_driver', 'logging_level']"
    assert ray.calls == [init, "shutdown", init, "shutdown", init]


def test_a_connection_aborted_every_time_is_one_config_line_naming_the_address() -> None:
    ray = FakeRay(*[_aborted() for _ in range(CLIENT_CONNECT_TRIES)])
    with pytest.raises(ConfigError) as caught:
        _connect(ray, "ray://head:10001", pause=0)
    message = str(caught.value)
    assert message == (
        f"orchestration.executor.address: cannot connect to Ray at ray://head:10001 ({CLIENT_CONNECT_TRIES} tries): "
        "Initialization failure from server: RuntimeError: Starting Ray client server failed."
    )
    assert len([c for c in ray.calls if c.startswith("init")]) == CLIENT_CONNECT_TRIES


@pytest.mark.parametrize(
    ("address", "failure"),
    [("ray://head:10001", ConnectionError("ray client connection timeout")),  # a timeout is not tried again
     ("127.0.0.1:6379", _aborted()),  # nor anything but Ray Client
     ("auto", ConnectionError("Could not find any running Ray instance."))],
)  # fmt: skip
def test_other_failures_are_one_try_and_one_config_line(address: str, failure: BaseException) -> None:
    ray = FakeRay(failure)
    with pytest.raises(ConfigError, match=f"^orchestration.executor.address: cannot connect to Ray at {address}: "):
        _connect(ray, address, pause=0)
    assert len(ray.calls) == 1 and "\n" not in str(ray.calls)
