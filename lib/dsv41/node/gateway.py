"""Node side, on the head: dsv41-gateway's two maps and its runtime API (stdlib only).

`python3 -m dsv41.node.gateway '<json request>'` with {"op": ..., "state_dir": ...} prints one JSON answer:
    door    {"door": "open"|"closed", "reason", "ready_at"}: the door's state written to gateway/state.map,
            then told to the running gateway (the file first: a gateway started later reads it)
    drain   {"timeout_s", "group"}: wait until no request is in flight at the engine (that group's server
            alone with "group"), or timeout_s; progress on stderr
    group   {"group": server, "to": "ready"|"drain"|"maint"}: one serving group's server in the door's backend
            set to that state (drain: no new request, those in flight finish; maint: none at all; ready:
            taking requests again, marked up at once). The running gateway only: one started later has
            every group ready, and its health checks take out the ones that do not answer
    ensure  {"default": {name, hash}}: the key map holding that key as `default` (made, or `default` put back
            to it), the door's map (open) when there is none: HAProxy reads both when it parses its config
    keys    {"add": {name, hash}} / {"revoke": name} / {"rotate": {name, hash}}: under the keys' lock, the
            file first, then the running gateway, its answer checked; always answers the keys with their
            use (requests, errors, 503s, 429s, seconds since last used)
    state   the door's state, the requests in flight and each group's server ({server: {"status",
            "in_flight"}})
The maps hold no key: a client key is known only by its sha256 (hex). The runtime API is HAProxy's admin
socket (names.GATEWAY_SOCKET); a gateway that is not running is only written to."""
import contextlib
import fcntl
import json
import os
import re
import socket
import sys
import time

from dsv41 import names
from dsv41.files import write_atomic

TABLE = "per_key"                  # the stick table of units/dsv41-gateway.cfg.j2
GROUP_STATES = ("ready", "drain", "maint")
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


def map_admin(state_dir, rel, command, sock_path=names.GATEWAY_SOCKET):
    """A command on one of the gateway's maps (its `{map}` filled in) -> the answer; None when no gateway runs.
    The map is named as the config names it (names.gateway_map); a gateway still running an earlier version's
    config, which named it by its absolute path, is asked by that name too (until its next reload)."""
    out = None
    for ref in (names.gateway_map(rel), cli_word(names.state_path(state_dir, rel))):
        out = admin(command.replace("{map}", ref), sock_path)
        if out is None or not out.startswith("Unknown map identifier"):
            return out
    return out


def set_entry(state_dir, rel, key, value, sock_path=names.GATEWAY_SOCKET):
    """The running gateway's map entry key set to value (added when missing); False when none runs."""
    out = map_admin(state_dir, rel, f"set map {{map}} {key} {cli_word(value)}", sock_path)
    if out is None:
        return False
    if "not found" in out.lower():
        out = map_admin(state_dir, rel, f"add map {{map}} {key} {cli_word(value)}", sock_path)
    if out and out.strip():
        raise GatewayError(f"the gateway refused to set {key} in {rel}: {out.strip()}")
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
        told = set_entry(state_dir, names.GATEWAY_STATE, key, value, sock_path)   # the door last: its reason is there when it closes
    if told and door == "open":                 # every group not set aside (drain, maint) is marked up
        for server, row in (groups(sock_path) or {}).items():
            if row["status"] not in ("MAINT", "DRAIN"):
                admin(f"set server {names.DOOR_BACKEND}/{server} health up", sock_path)
    return {"door": door, "told": told}


def _stat_rows(sock_path):
    """The door's backend rows of `show stat` ({svname: row}, BACKEND the whole); None without a gateway."""
    out = admin("show stat", sock_path)
    if out is None:
        return None
    header = out.splitlines()[0].lstrip("# ").split(",") if out else []
    rows = (dict(zip(header, line.split(","))) for line in out.splitlines()[1:])
    return {r["svname"]: r for r in rows if r.get("pxname") == names.DOOR_BACKEND and "svname" in r}


def _busy(row):
    return int(row.get("scur") or 0) + int(row.get("qcur") or 0)


def groups(sock_path=names.GATEWAY_SOCKET, rows=None):
    """{server: {"status", "in_flight"}} of each serving group in the door's backend (status as HAProxy says
    it: UP, DOWN, DRAIN, MAINT, "UP 1/2" while a check is going); None without a gateway. rows: a `show stat`
    already read (_stat_rows)."""
    rows = _stat_rows(sock_path) if rows is None else rows
    if rows is None:
        return None
    return {name: {"status": row.get("status", ""), "in_flight": _busy(row)}
            for name, row in rows.items() if name not in ("FRONTEND", "BACKEND")}


def in_flight(sock_path=names.GATEWAY_SOCKET, group=None, rows=None):
    """Requests at the engine now (its backend's current and queued sessions; one group's server's with
    group); None without a gateway, or when there is no such group. rows: a `show stat` already read."""
    rows = _stat_rows(sock_path) if rows is None else rows
    row = (rows or {}).get(group or "BACKEND")
    return None if row is None else _busy(row)


def set_group(group, to, sock_path=names.GATEWAY_SOCKET):
    """One serving group's server set to ready, drain or maint in the running gateway -> whether one runs."""
    if to not in GROUP_STATES:
        raise GatewayError(f"a group is set to one of {', '.join(GROUP_STATES)}, not {to!r}")
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,32}", str(group)):
        raise GatewayError(f"no such group's server: {group!r}")
    commands = [f"set server {names.DOOR_BACKEND}/{group} state {to}"]
    if to == "ready":
        commands.append(f"set server {names.DOOR_BACKEND}/{group} health up")
    for command in commands:
        out = admin(command, sock_path)
        if out is None:
            return False
        if out.strip():
            raise GatewayError(f"the gateway refused `{command}`: {' '.join(out.split())[:200]}")
    return True


def drain(timeout_s, sock_path=names.GATEWAY_SOCKET, clock=time.monotonic, sleep=time.sleep, log=None, group=None):
    """Wait until nothing is in flight at the engine (at one group's server with group), or timeout_s
    passed -> {"left", "waited_s"}."""
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    where = f" at {group}" if group else ""
    t0 = said = clock()
    left = in_flight(sock_path, group)
    while left and clock() - t0 < timeout_s:
        if clock() - said >= 5:
            log(f"draining: {left} request(s) in flight{where}, {timeout_s - (clock() - t0):.0f} s left (DRAIN_S)")
            said = clock()
        sleep(0.5)
        left = in_flight(sock_path, group)
    return {"left": left or 0, "waited_s": round(clock() - t0, 1)}


# ---- the keys ----------------------------------------------------------------------------------------
# Every writer of the key map holds its lock (names.GATEWAY_KEYS_LOCK, not the run lock: keys change during a
# launch or a recovery); a change is written to the map first, then told to the running gateway, whose answer
# is checked: the map is the truth, and the gateway's next reload reads it.

HASH_RE = re.compile(r"[0-9a-f]{64}")
DEFAULT = names.DEFAULT_KEY


def check_name(name):
    if not isinstance(name, str) or not names.KEY_NAME_RE.fullmatch(name):
        raise GatewayError(f"key name {name!r}: expected 1 to 64 letters, digits, `.`, `_` or `-`, starting with a "
                           "letter or a digit")
    return name


@contextlib.contextmanager
def keys_lock(state_dir):
    path = names.state_path(state_dir, names.GATEWAY_KEYS_LOCK)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def read_keys(path):
    """[{"name", "hash", "added"}] of the key map, in its order ([] when there is none). A line that is not a
    comment, blank or `<sha256 hex> <name>` is refused (GatewayError naming the file and the line): the next
    write would drop it."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    added, out = {}, []
    for n, line in enumerate(lines, 1):
        words = line.split()
        if not words:
            continue
        if words[0].startswith("#"):
            if len(words) == 4 and words[:2] == ["#", "added"] and words[3].isdigit():
                added[words[2]] = int(words[3])
            continue
        if len(words) != 2 or not HASH_RE.fullmatch(words[0]) or not names.KEY_OLD_NAME_RE.fullmatch(words[1]):
            raise GatewayError(f"{path} line {n} cannot be read ({line[:60]!r}): expected `<sha256 in hex> <name>`; "
                               "mend or remove that line")
        out.append({"hash": words[0], "name": words[1]})
    return [{**k, "added": added.get(k["name"])} for k in out]


def keys_text(keys):
    return KEYS_HEADER + "".join(f"# added {k['name']} {k['added'] or 0}\n{k['hash']} {k['name']}\n" for k in keys)


def write_keys(path, keys):
    write_atomic(path, keys_text(keys).encode(), mode=0o600)


def tell(state_dir, commands, sock_path=names.GATEWAY_SOCKET):
    """The key map's change told to the running gateway -> True, or False when none runs. GatewayError when it
    did not take one (its answer, or none within the admin socket's timeout): the map file already holds it."""
    for command in commands:
        try:
            out = map_admin(state_dir, names.GATEWAY_KEYS, command, sock_path)
        except OSError as err:
            out = f"no answer ({err.strerror or err})"
        if out is None:
            return False
        if out.strip() and not (command.startswith("del") and out.strip().startswith("Key not found")):
            raise GatewayError(f"the running gateway did not take the change ({' '.join(out.split())[:200]}): the key "
                               "map holds it, and the gateway's next reload applies it (`systemctl reload dsv41-gateway`)")
    return True


def _find(have, name):
    return [k for k in have if k["name"].lower() == name.lower()]


def change_keys(state_dir, req, sock_path=names.GATEWAY_SOCKET):
    """Under the lock: add {name, hash}, revoke name or rotate {name, hash} written to the map, then told to
    the running gateway -> whether one runs."""
    path = names.state_path(state_dir, names.GATEWAY_KEYS)
    have = read_keys(path)
    if "add" in req:
        new = {**req["add"], "name": check_name(req["add"]["name"])}
        if _find(have, new["name"]):
            raise GatewayError(f"a key named {_find(have, new['name'])[0]['name']} exists (names are unique without "
                               "regard to case): `doit keys rotate` it, revoke it, or choose another name")
        write_keys(path, have + [{**new, "added": int(time.time())}])
        return tell(state_dir, [f"add map {{map}} {new['hash']} {new['name']}"], sock_path)
    name = req.get("revoke") or req["rotate"]["name"]
    gone = _find(have, name)
    if not gone:
        raise GatewayError(f"no key is named {name}: `doit keys list` shows them")
    if "revoke" in req:
        if gone[0]["name"] == DEFAULT:
            raise GatewayError("the key `default` is API_KEY_FILE's (Pi, smoke, bench) and is not revoked: "
                               "`doit keys rotate default` replaces it")
        write_keys(path, [k for k in have if k not in gone])     # the file first: a crash cannot bring it back
        return tell(state_dir, [f"del map {{map}} {k['hash']}" for k in gone], sock_path)
    new = {"name": gone[0]["name"], "hash": req["rotate"]["hash"], "added": int(time.time())}
    write_keys(path, [new if k is gone[0] else k for k in have if k is gone[0] or k not in gone])
    return tell(state_dir, [f"add map {{map}} {new['hash']} {new['name']}"] +
                [f"del map {{map}} {k['hash']}" for k in gone if k["hash"] != new["hash"]], sock_path)


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
    """The keys with their use, after add, revoke or rotate (change_keys) when req asks for one."""
    running = None
    if {"add", "revoke", "rotate"} & set(req):
        with keys_lock(state_dir):
            running = change_keys(state_dir, req, sock_path)
    have = read_keys(names.state_path(state_dir, names.GATEWAY_KEYS))
    use = usage(sock_path)
    return {"keys": [{"name": k["name"], "added": k["added"], **use.get(k["name"], {})} for k in have],
            "running": running if running is not None else admin("show info", sock_path) is not None}


def ensure(state_dir, default, sock_path=names.GATEWAY_SOCKET):
    """The key map holds the client key of API_KEY_FILE as `default` (its hash given): made when missing,
    brought back or replaced when it differs (the file is the truth for `default`: a rotation that died
    half-way, a map of an earlier version whose `default` was revoked); the door's map (open) when missing."""
    keys_path = names.state_path(state_dir, names.GATEWAY_KEYS)
    with keys_lock(state_dir):
        have = read_keys(keys_path)
        now = [k for k in have if k["name"] == DEFAULT]
        if not have and not os.path.exists(keys_path):
            write_keys(keys_path, [{**default, "added": int(time.time())}])
        elif not now:
            write_keys(keys_path, have + [{**default, "added": int(time.time())}])
            tell(state_dir, [f"add map {{map}} {default['hash']} {DEFAULT}"], sock_path)
        elif [k["hash"] for k in now] != [default["hash"]]:
            change_keys(state_dir, {"rotate": {"name": DEFAULT, "hash": default["hash"]}}, sock_path)
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
            out = drain(float(req["timeout_s"]), group=req.get("group"))
        elif op == "group":
            out = {"told": set_group(req["group"], req["to"])}
        elif op == "keys":
            out = keys(state_dir, req)
        elif op == "ensure":
            out = ensure(state_dir, req["default"])
        elif op == "state":                     # one `show stat` for the whole and each group
            rows = _stat_rows(names.GATEWAY_SOCKET)
            out = {**read_state(names.state_path(state_dir, names.GATEWAY_STATE)),
                   "in_flight": None if rows is None else in_flight(rows=rows),
                   "groups": None if rows is None else groups(rows=rows)}
        else:
            raise GatewayError(f"unknown op {op!r}")
    except (GatewayError, OSError, ValueError, KeyError, IndexError) as err:
        print(json.dumps({"error": f"{type(err).__name__}: {err}" if not isinstance(err, GatewayError) else str(err)}))
        sys.exit(1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
