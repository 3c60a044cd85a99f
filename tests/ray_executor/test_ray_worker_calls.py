"""The worker actor answers the driver's calls while its long poll waits (SPEC 11).

Every grant and acknowledgement the driver sends is a ``deliver`` call on
the worker's actor, made while the driver's ``poll`` of that actor waits
for messages. Ray runs an actor with any ``async def`` method on an asyncio
loop, one sync method at a time: each delivery would then wait out the
poll, and every round trip of a try (permit, token, journal line,
discarded try) would take the poll's wait.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

from _ray_support import RayCluster

import agentcompass
from agentcompass._ray._worker import Worker

REPO = Path(agentcompass.__file__).resolve().parents[1]

# In the cluster's namespace: a worker actor as the executor starts it; a
# poll that would wait 60 s; a call made meanwhile must not wait for it.
CALL_DURING_POLL = """
import sys, time
import ray
from agentcompass._ray import _start_workers
from agentcompass._ray._settings import RaySettings
from agentcompass.runtime import Orchestration

ray.init(address=sys.argv[1], _node_ip_address="127.0.0.1", logging_level="ERROR", log_to_driver=False)
[(actor, pid)] = _start_workers(ray, Orchestration([]), RaySettings(workers=1), None)
polling = actor.poll.remote(60.0)
started = time.monotonic()
assert ray.get(actor.pid.remote(), timeout=30) == pid
actor.deliver.remote(0, [])
ready, _ = ray.wait([polling], timeout=0)
print("answered during the poll" if not ready else "the poll ended first", round(time.monotonic() - started, 3))
ray.kill(actor)
"""


def test_the_actor_has_no_async_method_that_would_make_ray_serialize_its_calls() -> None:
    assert [name for name, member in inspect.getmembers(Worker) if inspect.iscoroutinefunction(member)] == []


def test_a_call_to_a_worker_is_answered_while_the_drivers_poll_waits(ray_cluster: RayCluster) -> None:
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    done = subprocess.run(
        [*ray_cluster.prefix, sys.executable, "-c", CALL_DURING_POLL, ray_cluster.address],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "answered during the poll" in done.stdout, done.stdout
