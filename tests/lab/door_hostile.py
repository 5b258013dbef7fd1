"""The door against a hostile client on the fabric, with the lab's real engine behind it (vLLM 0.32's CPU build).

run_hostile_corpus(lab, key, env) is the test's body; it needs the real engine launched and serving through
the door (test_vllm.py's module fixture `vllm`, whose launch a second module could not share without a
second download and launch): tests/door_corpus.py, piped into `python3 -` on worker1 (the node has python3 and
nothing of dsv41), sends its hand-written corpus and its seeded random requests to the head's fabric address,
port 8000, with no key, a wrong key and a key that was valid and is revoked (`doit keys add`, then `doit keys
revoke`): no model answer, no answer outside the allowed ones, and the door's log shows none of the
attacker's requests passed to the engine. The valid key, from the same node, still gets a chat answer: the
attacker's node does reach the door. The keys reach the attacker's process on its stdin, never on a command line."""
import json
import re
import secrets
import time
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "door_corpus.py"
SEED, COUNT = 4141, 300
PORT = 8000


def attack(lab, key, seed=SEED, count=COUNT):
    """door_corpus on worker1 against the head's door with key (None: none) -> its JSON summary."""
    prelude = f"import os\nos.environ['DOOR_KEY'] = {key!r}\n" if key else ""
    r = lab.on("worker1", ["python3", "-", lab.ip["head"], str(PORT), "--seed", str(seed), "--count", str(count)],
               check=False, timeout=180, input=prelude + SOURCE.read_text())
    lines = r.stdout.strip().splitlines()
    assert lines and lines[-1].startswith("{"), f"door_corpus on worker1 exited {r.returncode}: {r.stderr[-2000:]}"
    return json.loads(lines[-1])


def chat_from_worker(lab, key):
    """(status, body) of one chat request from worker1 to the door with key (sent as a header on stdin)."""
    body = json.dumps({"model": "deepseek-v4.1-flash", "messages": [{"role": "user", "content": "Say hi."}],
                       "max_tokens": 4, "temperature": 0})
    r = lab.on("worker1", ["curl", "-sS", "-m", "120", "-H", "@-", "-H", "Content-Type: application/json",
                           "--data-binary", body, "-w", "\n%{http_code}",
                           f"http://{lab.ip['head']}:{PORT}/v1/chat/completions"],
               check=False, timeout=180, input=f"Authorization: Bearer {key}\n" if key else "\n")
    text, _, code = r.stdout.rpartition("\n")
    return int(code or 0), text


def new_key(lab, name, env):
    out = lab.doit(f"keys add {name}", env).stdout.splitlines()
    return out[out.index(next(line for line in out if line.startswith(f"key {name} "))) + 1].strip()


def passed_to_engine(lab, since):
    """The door's log lines since `since` (unix time) of requests from worker1 it passed to the engine (a line
    of HAProxy's httplog starts with the client's address and names the backend/server: engine/r0)."""
    log = lab.on("head", f"journalctl -u dsv41-gateway --no-pager -o cat --since=@{int(since)}", check=False).stdout
    return [line for line in log.splitlines() if line.startswith(lab.ip["worker1"] + ":") and " engine/" in line]


def run_hostile_corpus(lab, key, env=None):
    """No key, a wrong key and a revoked key from worker1: no model answer, nothing passed to the engine;
    `key` (a valid one) still gets a chat answer from there."""
    t0 = time.time()
    code, body = chat_from_worker(lab, key)
    assert code == 200 and json.loads(body)["choices"], (code, body[:300])
    name = f"hostile-{secrets.token_hex(3)}"
    revoked = new_key(lab, name, env)
    assert chat_from_worker(lab, revoked)[0] == 200               # it was a key of the door
    lab.doit(f"keys revoke {name}", env)
    assert chat_from_worker(lab, revoked)[0] == 401
    before = passed_to_engine(lab, t0)
    assert len(before) >= 2, before                               # the log is read: both keyed chats are in it
    t_attack = time.time()
    found = {}
    for label, k in (("no key", None), ("a wrong key", secrets.token_urlsafe(32)), ("a revoked key", revoked)):
        out = attack(lab, k)
        found[label] = out
        print(f"door on the fabric, {label}: {out['sent']} requests ({out['corpus']} hand-written, {out['random']} "
              f"random, seed {out['seed']}) in {out['took_s']} s: {out['statuses']}")
    passed = passed_to_engine(lab, t0)[len(before):]
    print(f"door on the fabric: the hostile corpus took {time.time() - t_attack:.0f} s ({time.time() - t0:.0f} s with "
          "the keys' set-up)")
    for label, out in found.items():
        assert out["model_answers"] == [], (label, out["model_answers"][:10])
        assert out["unexpected"] == [], (label, out["unexpected"][:10])
        assert out["sent"] == out["corpus"] + COUNT
    assert passed == [], passed[:10]
    assert not any(re.search(re.escape(k), json.dumps(found)) for k in (key, revoked))   # no key printed
