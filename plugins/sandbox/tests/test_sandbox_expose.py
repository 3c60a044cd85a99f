"""``expose_directory`` and ``expose_socket`` on a running sandbox, held to
the conformance kit's exposure checks: the host's directory is readable,
never writable, from inside; a unix socket in it is connectable under
policy ``none``; closing and sweeping detach the binds and never touch the
host's directory."""

from __future__ import annotations

from _sandbox_support import requires_sandbox

from agentcompass.testing import check_exposed_directory, check_exposed_socket, check_sweep_detaches_exposures

pytestmark = requires_sandbox


async def test_an_exposed_directory_is_read_only_inside_and_survives_close(provider, tag, tmp_path):
    await check_exposed_directory(provider, None, tmp_path, tag=tag)


async def test_an_exposed_socket_is_connectable_under_policy_none(provider, tag, tmp_path):
    await check_exposed_socket(provider, {}, tmp_path, tag=tag)


async def test_sweep_after_a_killed_runtime_detaches_the_binds_and_keeps_the_host_directory(provider, tag, tmp_path):
    await check_sweep_detaches_exposures(provider, None, tmp_path, tag=tag)
