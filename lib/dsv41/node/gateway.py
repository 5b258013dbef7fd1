"""Node side, on the head: dsv41-gateway's two maps and its runtime API (stdlib only).

`python3 -m dsv41.node.gateway '<json request>'` with {"op": ..., "state_dir": ...} prints one JSON answer:
    door    {"door": "open"|"closed", "reason", "ready_at"}: the door's state written to gateway/state.map,
            then told to the running gateway (the file first: a gateway started later reads it)
    drain   {"timeout_s"}: wait until no request is in flight at the engine, or timeout_s; progress on stderr
    ensure  {"default": {name, hash}}: the key map holding that key when there is none, the door's map
            (open) when there is none: HAProxy reads both when it parses its config
    keys    {"add": {name, hash}} / {"revoke": name}: the file first, then the running gateway; always
            answers the keys with their use (requests, errors, 503s, 429s, seconds since last used)
    state   the door's state and the requests in flight
The maps hold no key: a client key is known only by its sha256 (hex). The runtime API is HAProxy's admin
socket (names.GATEWAY_SOCKET); a gateway that is not running is only written to."""
import json
import os
import socket
import sys
import time

from dsv41 import names
from dsv41.files import write_atomic

TABLE = "per_key"                  # the stick table of units/dsv41-gateway.cfg.j2
ENGINE_SERVER = "engine/r0"        # its backend and server: rank 0
TABLE_EXPIRE_S = 24 * 86400        # its `expire` (HAProxy's timer limit is 24.8 days)
STATE_KEYS = ("door", "reason", "ready_at")
KEYS_HEADER = ("# dsv41-gateway's client keys: the sha256 of each key, then its name (`doit keys`); never the key.\n"
               "# `# added NAME UNIXTIME` lines say when each was added.\n")


class GatewayError(Exception):
    pass


def admin(command, sock_path=names.GATEWAY_SOCKET, timeout=5):
    """One command on the runtime API -> its answer; None when no gateway is listening there."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(sock_path)
    except (FileNotFoundError, ConnectionRefusedError, PermissionError):
        s.close()
        return None
    with s:
        s.sendall((command + "\n").encode())
        out = b""
        while True:
            data = s.recv(65536)
            if not data:
                return out.decode(errors="replace")
            out += data


def cli_word(text):
    """A word of the runtime API's command line: spaces and backslashes escaped, no line breaks."""
    return " ".join(str(text).split()).replace("\\", "\\\\").replace(" ", "\\ ")


def set_entry(map_path, key, value, sock_path=names.GATEWAY_SOCKET):
    """The running gateway's map entry key set to value (added when missing); False when none runs.
    map_path: the map as the config names it (names.gateway_map)."""
    out = admin(f"set map {map_path} {key} {cli_word(value)}", sock_path)
    if out is None:
        return False
    if "not found" in out.lower():
        out = admin(f"add map {map_path} {key} {cli_word(value)}", sock_path)
    if out and out.strip():
        raise GatewayError(f"the gateway refused to set {key} in {map_path}: {out.strip()}")
    return True


# ---- the door ----------------------------------------------------------------------------------------

def read_state(path):
    """The door's state map: {"door", "reason", "ready_at"} (open, nothing expected, when there is no file)."""
    state = {"door": "open", "reason": "", "ready_at": 0}
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return state
    for line in lines:
        key, _, value = line.partition(" ")
        if key in STATE_KEYS:
            state[key] = int(value) if key == "ready_at" and value.strip().isdigit() else value.strip()
    return state


def state_text(door, reason, ready_at):
    return (f"# dsv41-gateway's door (written by dsv41: launch, rollback, stop, the watchdog)\n"
            f"door {door}\nreason {' '.join(str(reason).split()) or '-'}\nready_at {int(ready_at)}\n")


def set_door(state_dir, door, reason, ready_at, sock_path=names.GATEWAY_SOCKET):
    """The door's state in its file, then in the running gateway. Opened when the engine was just seen
    ready: its server is marked up at once, not at the health check's next look (2 s)."""
    path = names.state_path(state_dir, names.GATEWAY_STATE)
    write_atomic(path, state_text(door, reason, ready_at).encode())
    told = False
    for key, value in (("reason", reason or "-"), ("ready_at", int(ready_at)), ("door", door)):
        told = set_entry(names.gateway_map(names.GATEWAY_STATE), key, value, sock_path)   # the door last: its reason is there when it closes
    if told and door == "open":
        admin(f"set server {ENGINE_SERVER} health up", sock_path)
    return {"door": door, "told": told}


def in_flight(sock_path=names.GATEWAY_SOCKET):
    """Requests at the engine now (its backend's current and queued sessions); None without a gateway."""
    out = admin("show stat", sock_path)
    if out is None:
        return None
    header = out.splitlines()[0].lstrip("# ").split(",") if out else []
    for line in out.splitlines()[1:]:
        row = dict(zip(header, line.split(",")))
        if row.get("pxname") == "engine" and row.get("svname") == "BACKEND":
            return int(row.get("scur") or 0) + int(row.get("qcur") or 0)
    return None


def drain(timeout_s, sock_path=names.GATEWAY_SOCKET, clock=time.monotonic, sleep=time.sleep, log=None):
    """Wait until nothing is in flight at the engine, or timeout_s passed -> {"left", "waited_s"}."""
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    t0 = said = clock()
    left = in_flight(sock_path)
    while left and clock() - t0 < timeout_s:
        if clock() - said >= 5:
            log(f"draining: {left} request(s) in flight, {timeout_s - (clock() - t0):.0f} s left (DRAIN_S)")
            said = clock()
        sleep(0.5)
        left = in_flight(sock_path)
    return {"left": left or 0, "waited_s": round(clock() - t0, 1)}


# ---- the keys ----------------------------------------------------------------------------------------

def read_keys(path):
    """[{"name", "hash", "added"}] of the key map, in its order ([] when there is none)."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    added, out = {}, []
    for line in lines:
        words = line.split()
        if len(words) == 4 and words[:2] == ["#", "added"] and words[3].isdigit():
            added[words[2]] = int(words[3])
        elif len(words) == 2 and not line.startswith("#"):
            out.append({"hash": words[0], "name": words[1]})
    return [{**k, "added": added.get(k["name"])} for k in out]


def keys_text(keys):
    return KEYS_HEADER + "".join(f"# added {k['name']} {k['added'] or 0}\n{k['hash']} {k['name']}\n" for k in keys)


def write_keys(path, keys):
    write_atomic(path, keys_text(keys).encode(), mode=0o600)


def usage(sock_path=names.GATEWAY_SOCKET):
    """{name: {"requests", "errors", "unavailable", "limited", "idle_s"}} from the stick table (empty when
    no gateway runs); idle_s: seconds since the key was last used (its entry's expiry counts down from
    TABLE_EXPIRE_S at each use)."""
    out = admin(f"show table {TABLE}", sock_path)
    table = {}
    for line in (out or "").splitlines():
        fields = dict(w.split("=", 1) for w in line.split()[1:] if "=" in w)
        if "key" not in fields:
            continue
        num = lambda k: int(fields.get(k, "0") or 0)                           # noqa: E731
        table[fields["key"]] = {"requests": num("http_req_cnt"), "errors": num("http_err_cnt") + num("http_fail_cnt"),
                                "unavailable": num("gpc0"), "limited": num("gpc1"),
                                "idle_s": max(0, TABLE_EXPIRE_S - num("exp") // 1000)}
    return table


def keys(state_dir, req, sock_path=names.GATEWAY_SOCKET):
    path = names.state_path(state_dir, names.GATEWAY_KEYS)
    have = read_keys(path)
    if "add" in req:
        new = req["add"]
        if any(k["name"] == new["name"] for k in have):
            raise GatewayError(f"a key named {new['name']} exists: revoke it first, or choose another name")
        have.append({**new, "added": int(time.time())})
        write_keys(path, have)
        admin(f"add map {path} {new['hash']} {new['name']}", sock_path)   # none runs: it reads the file at start
    if "revoke" in req:
        gone = [k for k in have if k["name"] == req["revoke"]]
        if not gone:
            raise GatewayError(f"no key is named {req['revoke']}: `doit keys list` shows them")
        have = [k for k in have if k["name"] != req["revoke"]]
        write_keys(path, have)          # the file first: a crash here cannot bring the key back
        for k in gone:
            admin(f"del map {path} {k['hash']}", sock_path)
    use = usage(sock_path)
    return {"keys": [{"name": k["name"], "added": k["added"], **use.get(k["name"], {})} for k in have],
            "running": admin("show info", sock_path) is not None}


def ensure(state_dir, default):
    keys_path = names.state_path(state_dir, names.GATEWAY_KEYS)
    if not os.path.exists(keys_path):
        write_keys(keys_path, [{**default, "added": int(time.time())}])
    state_path = names.state_path(state_dir, names.GATEWAY_STATE)
    if not os.path.exists(state_path):
        write_atomic(state_path, state_text("open", "", 0))
    return {}


def main():
    try:
        req = json.loads(sys.argv[1])
        op, state_dir = req["op"], req["state_dir"]
        if op == "door":
            out = set_door(state_dir, req["door"], req.get("reason", ""), req.get("ready_at", 0))
        elif op == "drain":
            out = drain(float(req["timeout_s"]))
        elif op == "keys":
            out = keys(state_dir, req)
        elif op == "ensure":
            out = ensure(state_dir, req["default"])
        elif op == "state":
            out = {**read_state(names.state_path(state_dir, names.GATEWAY_STATE)), "in_flight": in_flight()}
        else:
            raise GatewayError(f"unknown op {op!r}")
    except (GatewayError, OSError, ValueError, KeyError, IndexError) as err:
        print(json.dumps({"error": f"{type(err).__name__}: {err}" if not isinstance(err, GatewayError) else str(err)}))
        sys.exit(1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
