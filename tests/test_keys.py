"""The gateway's client keys (dsv41.node.gateway's key map, `doit keys`) against a real HAProxy on the rendered
config (tests/test_gateway.py's door, with its engine stand-in), each writer a process of its own as `doit keys`
is: no key is lost or brought back by writers racing, the gateway's answer is checked (one line, non-zero when
it did not take a change), `default` is rotated, never revoked, and a map line that cannot be read is refused."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from test_gateway import KEYS, client, door, status_of  # noqa: F401 (door: the fixture)

from dsv41 import errors, names
from dsv41.head import keys as keys_verb
from dsv41.head.core import gateway
from dsv41.node import gateway as node_gateway

LIB = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib")


def writers(door, state_dir, reqs, at):
    """Each request a process of its own, all set to start at the same instant `at` -> their answers."""
    code = ("import json, sys, time; from dsv41.node import gateway as g; time.sleep(max(0, float(sys.argv[3]) - "
            "time.time())); out = None\ntry:\n    out = g.keys(sys.argv[1], json.loads(sys.argv[2]), sys.argv[4])\n"
            "except g.GatewayError as err:\n    out = {'error': str(err)}\nprint(json.dumps(out))")
    procs = [subprocess.Popen([sys.executable, "-c", code, state_dir, json.dumps(r), str(at), door.sock],
                              env={**os.environ, "PYTHONPATH": LIB}, stdout=subprocess.PIPE, text=True) for r in reqs]
    return [json.loads(p.communicate(timeout=60)[0]) for p in procs]


def works(door, key):
    return status_of(lambda: client(door, key).models.list())[0] == 200


@pytest.fixture
def gw(door):
    return door.start()


def test_six_keys_added_at_once_are_six_working_keys(door, gw):
    new = {f"k{i}": f"key-number-{i}" for i in range(6)}
    for rnd in range(2):                        # two rounds: a lost write shows in one at least, unlocked
        names_ = {f"{n}r{rnd}": k + str(rnd) for n, k in new.items()}
        out = writers(door, gw.state_dir, [{"add": {"name": n, "hash": gateway.key_hash(k)}}
                                           for n, k in names_.items()], time.time() + 0.6)
        assert not [o for o in out if "error" in o], out
        have = {k["name"] for k in node_gateway.read_keys(names.state_path(gw.state_dir, names.GATEWAY_KEYS))}
        assert set(names_) <= have, sorted(set(names_) - have)
        assert all(works(door, k) for k in names_.values())


def test_a_revoke_racing_an_add_stays_revoked_after_a_reload(door, gw):
    for trial in range(5):
        bob, carol = f"bob-key-{trial}", f"carol-key-{trial}"
        node_gateway.keys(gw.state_dir, {"add": {"name": f"bob{trial}", "hash": gateway.key_hash(bob)}}, door.sock)
        writers(door, gw.state_dir, [{"revoke": f"bob{trial}"},
                                     {"add": {"name": f"carol{trial}", "hash": gateway.key_hash(carol)}}],
                time.time() + 0.5)
        text = open(names.state_path(gw.state_dir, names.GATEWAY_KEYS)).read()
        assert gateway.key_hash(bob) not in text and gateway.key_hash(carol) in text, trial
    door.restart(gw)
    assert not any(works(door, f"bob-key-{t}") for t in range(5))
    assert all(works(door, f"carol-key-{t}") for t in range(5)) and works(door, "default")


def test_a_change_the_running_gateway_does_not_take_is_one_line_and_the_map_keeps_it(door, gw):
    """A gateway still running a config that names its key map otherwise (as an earlier version's did, by an
    absolute path) answers "Unknown map identifier": the revoke is refused in one line, the map file holds the
    change, and the next start (the gateway's reload) refuses the key."""
    path = names.state_path(gw.state_dir, names.GATEWAY_CONFIG)
    keys_map = names.state_path(gw.state_dir, names.GATEWAY_KEYS)
    text = open(path).read()
    with open(path, "w") as f:
        f.write(text.replace("map(keys.map)", "map(./keys.map)"))
    door.restart(gw)
    assert works(door, "alice")
    with pytest.raises(node_gateway.GatewayError, match=r"did not take the change \(Unknown map identifier"):
        node_gateway.keys(gw.state_dir, {"revoke": "alice"}, door.sock)
    assert gateway.key_hash(KEYS["alice"]) not in open(keys_map).read()
    with open(path, "w") as f:
        f.write(text)
    door.restart(gw)
    assert not works(door, "alice") and works(door, "default")


def test_a_gateway_still_on_an_earlier_versions_config_takes_keys_and_the_door(door, tmp_path):
    """Until a launch reloads it after an upgrade, the gateway runs the config of the version before, which
    named its maps by absolute path: keys and the door still reach it."""
    cfg = door.start(state=tmp_path / "plain")
    path, sd = names.state_path(cfg.state_dir, names.GATEWAY_CONFIG), cfg.state_dir
    text = open(path).read().replace("default-path config", "")
    for rel in (names.GATEWAY_KEYS, names.GATEWAY_STATE):
        text = text.replace(f"map({names.gateway_map(rel)}", f"map({names.state_path(sd, rel)}")
    with open(path, "w") as f:
        f.write(text)
    door.restart(cfg)
    node_gateway.keys(sd, {"revoke": "alice"}, door.sock)
    assert not works(door, "alice") and works(door, "default")
    node_gateway.set_door(sd, "closed", "release 9 rolling out", 0, door.sock)
    assert status_of(lambda: client(door).models.list())[:2] == (503, "60")


def test_a_gateway_whose_admin_socket_never_answers_is_said_in_one_line(door, gw):
    """HAProxy stopped (SIGSTOP): its socket still takes the connection, and no answer comes."""
    proc = door.procs[-1]
    proc.send_signal(signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        with pytest.raises(node_gateway.GatewayError, match="did not take the change .no answer"):
            node_gateway.keys(gw.state_dir, {"add": {"name": "dave", "hash": gateway.key_hash("dave-key")}}, door.sock)
        assert time.monotonic() - t0 < 10
    finally:
        proc.send_signal(signal.SIGCONT)
    assert "dave" in open(names.state_path(gw.state_dir, names.GATEWAY_KEYS)).read()


def test_default_is_never_revoked_and_rotates_with_its_file(door, gw):
    with pytest.raises(node_gateway.GatewayError, match="doit keys rotate default"):
        node_gateway.keys(gw.state_dir, {"revoke": "default"}, door.sock)
    with pytest.raises(errors.BadInput, match="doit keys rotate default"):
        keys_verb.parse(["revoke", "default"])
    assert works(door, "default")
    node_gateway.ensure(gw.state_dir, {"name": "default", "hash": gateway.key_hash("the-new-default")}, door.sock)
    assert works(door, "the-new-default") and not works(door, "default") and works(door, "alice")
    have = node_gateway.read_keys(names.state_path(gw.state_dir, names.GATEWAY_KEYS))
    assert [k["name"] for k in have].count("default") == 1


def test_a_named_key_rotates_and_the_old_one_is_refused_at_once(door, gw):
    node_gateway.keys(gw.state_dir, {"rotate": {"name": "alice", "hash": gateway.key_hash("alice-2")}}, door.sock)
    assert works(door, "alice-2") and not works(door, "alice")
    door.restart(gw)
    assert works(door, "alice-2") and not works(door, "alice")


def test_a_map_whose_default_was_revoked_by_an_earlier_version_gets_it_back(door, gw):
    path = names.state_path(gw.state_dir, names.GATEWAY_KEYS)
    node_gateway.write_keys(path, [k for k in node_gateway.read_keys(path) if k["name"] != "default"])
    door.restart(gw)
    assert not works(door, "default")
    node_gateway.ensure(gw.state_dir, {"name": "default", "hash": gateway.key_hash(KEYS["default"])}, door.sock)
    assert works(door, "default")


def test_names_are_checked_whole_and_unique_without_regard_to_case(tmp_path):
    for bad in ("bob\n", "", "-x", ".x", "a" * 65, "a b", "é"):
        with pytest.raises(errors.BadInput, match="key name"):
            keys_verb.parse(["add", bad])
        with pytest.raises(node_gateway.GatewayError, match="key name"):
            node_gateway.keys(str(tmp_path), {"add": {"name": bad, "hash": "0" * 64}}, str(tmp_path / "none.sock"))
    assert keys_verb.parse(["add", "a" * 64]) == ("add", "a" * 64)
    node_gateway.keys(str(tmp_path), {"add": {"name": "Alice", "hash": "1" * 64}}, str(tmp_path / "none.sock"))
    with pytest.raises(node_gateway.GatewayError, match="a key named Alice exists"):
        node_gateway.keys(str(tmp_path), {"add": {"name": "alice", "hash": "2" * 64}}, str(tmp_path / "none.sock"))
    for words in (["add"], ["add", "a", "b"], ["remove", "a"]):
        with pytest.raises(errors.BadInput, match="expected `doit keys`"):
            keys_verb.parse(words)


def test_a_map_line_that_cannot_be_read_is_refused_naming_the_file_and_line(tmp_path):
    path = names.state_path(str(tmp_path), names.GATEWAY_KEYS)
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as f:                  # a map of the version before: names of up to 40, any first letter
        f.write(f"# header\n# added _old 5\n{'a' * 64} _old\n\n{'b' * 64} default\ngarbage here and there\n")
    with pytest.raises(node_gateway.GatewayError, match=rf"{path} line 6 cannot be read \('garbage"):
        node_gateway.keys(str(tmp_path), {"add": {"name": "x", "hash": "c" * 64}}, str(tmp_path / "none.sock"))
    assert "garbage" in open(path).read()       # never dropped
    with open(path, "w") as f:
        f.write(f"# added _old 5\n{'a' * 64} _old\n")
    assert node_gateway.read_keys(path) == [{"name": "_old", "hash": "a" * 64, "added": 5}]


def test_a_new_key_that_cannot_be_shown_is_never_stored(monkeypatch):
    stored = []
    monkeypatch.setattr(sys, "stdout", open("/dev/full", "w"))
    with pytest.raises(errors.UserError, match="could not be shown.*nothing was changed"):
        keys_verb.show("key x (shown once):", "secret")
        stored.append("x")
    assert stored == []
