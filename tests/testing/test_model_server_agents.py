"""The scripted model server's support for third-party agents: episodes found
in any user or tool message (text or a list of parts) and counted from there,
a failure after N good replies, and ``--record FILE``."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import trio

from agentcompass.testing.model_server import ModelServer, load_script

SCRIPT = {
    "episodes": [{"match": "the real task", "steps": [{"text": "first"}, {"text": "second"}]}],
    "default": [{"text": "default"}],
}


async def _post(url: str, messages: list) -> httpx.Response:
    async with httpx.AsyncClient() as client:
        return await client.post(url + "/chat/completions", json={"model": "m", "messages": messages})


async def test_an_episode_is_found_after_example_exchanges_and_counted_from_its_message():
    server = ModelServer(load_script(SCRIPT))
    async with trio.open_nursery() as nursery:
        url = await nursery.start(server.serve)
        examples = [{"role": "user", "content": "an example"}, {"role": "assistant", "content": "an example reply"}]
        task = {"role": "user", "content": [{"type": "text", "text": "now "}, {"type": "text", "text": "the real task"}]}
        first = await _post(url, [*examples, task])
        second = await _post(url, [*examples, task, {"role": "assistant", "content": "first"},
                                   {"role": "tool", "tool_call_id": "c", "content": "output"}])  # fmt: skip
        other = await _post(url, [{"role": "user", "content": "something else"}])
        nursery.cancel_scope.cancel()
    contents = [r.json()["choices"][0]["message"]["content"] for r in (first, second, other)]
    assert contents == ["first", "second", "default"]


async def test_fail_after_n_good_replies_answers_the_failure_status():
    server = ModelServer(load_script(SCRIPT), fail_after=2, fail_status=503)
    async with trio.open_nursery() as nursery:
        url = await nursery.start(server.serve)
        statuses = [(await _post(url, [{"role": "user", "content": "x"}])).status_code for _ in range(4)]
        nursery.cancel_scope.cancel()
    assert statuses == [200, 200, 503, 503]


def test_the_command_saves_what_it_recorded(tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps({**SCRIPT, "fail_after": 1}))
    record = tmp_path / "requests.jsonl"
    call = (
        "import json,os,urllib.request,urllib.error\n"
        "u=os.environ['MODEL_BASE_URL']+'/chat/completions'\n"
        "for _ in range(2):\n"
        "  r=urllib.request.Request(u,json.dumps({'messages':[{'role':'user','content':'the real task'}]}).encode(),"
        "{'Content-Type':'application/json','Authorization':'Bearer sk-seen'})\n"
        "  try: print(urllib.request.urlopen(r).status)\n"
        "  except urllib.error.HTTPError as e: print(e.code)\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "agentcompass.testing.model_server", "--script", str(script), "--record", str(record),
         "--", sys.executable, "-c", call],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[1:] == ["200", "500"]
    saved = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(saved) == 2
    assert saved[0]["body"]["messages"][0]["content"] == "the real task"
    assert saved[0]["headers"]["authorization"] == "Bearer sk-seen" and saved[0]["path"] == "/v1/chat/completions"
