"""dsv41-gateway: HAProxy on the head's PORT, the one door in front of rank 0's API server (GATEWAY=1).

Its config (units/dsv41-gateway.cfg.j2) is a state file of the head, its unit and the socket unit that
holds PORT for it (dsv41-gateway.socket: HAProxy takes the port as descriptor 3 at each start, so a restart
or a crash of HAProxy queues connections instead of refusing them) are head units: all are rendered by
core.units, recorded by every release, and the config is checked with `haproxy -c` on the head before a
launch applies them (prepare()). No secret is rendered: the engine key reaches HAProxy through its unit's
environment, read at start from the mode-0600 key file rank 0 mounts; the client keys' map
(`doit keys`) and the door's state live beside it and are never part of a release.

The door: while the engine is not ready every request is answered 503 with Retry-After (the expected
seconds to ready, 5 to 60) and why: closed by whoever restarts the ranks (core.recovery.restart: "release
7 rolling out", "recovering from DEAD"), by `doit stop`, or found by the gateway's own health check.
A planned restart first drains (drain(): new requests 503, those in flight finish, DRAIN_S at most).
The node side (maps, runtime API) is dsv41.node.gateway. Every command reaches it as `cl.gateway` (a
Gateway of its Cluster)."""
import json
import time

from dsv41 import names
from dsv41.errors import UserError
from dsv41.head.core import commands, release_history

key_hash = names.key_hash                 # how the gateway knows a client key: its sha256, in hex
STOPPED = "stopped by `doit stop`"        # the door's reason after `doit stop`: nothing reopens it but a launch


class Gateway:
    """The head's gateway of one Cluster: each call runs dsv41.node.gateway on the head; UserError naming
    what failed. With GATEWAY=0 the door calls do nothing."""
    STOPPED = STOPPED
    DEFAULT_KEY, NAME_RE, OLD_NAME_RE = names.DEFAULT_KEY, names.KEY_NAME_RE, names.KEY_OLD_NAME_RE
    key_hash = staticmethod(key_hash)

    def __init__(self, cl):
        self.cl = cl
        self.on = cl.cfg.layout.door
        # one group's Cluster (Config.group_config) acts on its own server only: the others go on serving
        self.server = None if cl.cfg.scope is None else names.door_server(cl.cfg.scope, cl.cfg.groups)

    def _call(self, req):
        cl, head = self.cl, self.cl.home
        r = head.run(cl.module(head, "gateway", json.dumps({"state_dir": cl.cfg.state_dir, **req})), check=False)
        try:
            out = json.loads(r.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise UserError(f"the gateway's helper on {head.label} failed: "
                            f"{(r.stderr or r.stdout).strip()[-300:]}") from None
        if "error" in out:
            raise UserError(f"gateway: {out['error']}")
        return out

    def expect_s(self):
        """The seconds the engine is expected to take to start: the last good release's measured start-up
        (core.release_history.last_startup_s), None when there is none or the history cannot be read."""
        try:
            return release_history.last_startup_s(release_history.load_all(self.cl.cfg.state_dir))
        except UserError:
            return None

    def close(self, reason, starting=False):
        """Every request is answered 503 naming `reason` from now until open(); starting: the engine is
        starting, so the 503s carry its expected start-up (expect_s) as Retry-After; else no estimate (a
        stop, a restart that failed)."""
        if self.on and self.server:
            self._call({"op": "group", "group": self.server, "to": "maint"})
        elif self.on:
            expect_s = self.expect_s() if starting else None
            self._call({"op": "door", "door": "closed", "reason": reason,
                        "ready_at": int(time.time() + expect_s) if expect_s else 0})

    def open(self):
        if self.on and self.server:
            self._call({"op": "group", "group": self.server, "to": "ready"})
        elif self.on:
            self._call({"op": "door", "door": "open", "reason": "", "ready_at": 0})

    def drain(self, reason, starting=False):
        """A planned restart's (or stop's) first step: the door closed (as close()), then the requests in
        flight finish, DRAIN_S at most (one group's: its server drains, then stays out, in maintenance). -> a line
        to say, or None (nothing was in flight, or GATEWAY=0); a gateway that cannot be asked is said and the
        restart goes on without a drain."""
        if not self.on:
            return None
        try:
            if self.server:             # its server drains: no new request, those in flight finish
                self._call({"op": "group", "group": self.server, "to": "drain"})
            else:
                self.close(reason, starting)
            out = self._call({"op": "drain", "timeout_s": self.cl.cfg.drain_s, "group": self.server})
            if self.server:             # drained: out of the door until it is opened again
                self._call({"op": "group", "group": self.server, "to": "maint"})
        except UserError as err:
            return f"warning: no drain: {err}"
        if out["left"]:
            return f"drained for {out['waited_s']:.0f} s (DRAIN_S): {out['left']} request(s) still in flight are cut"
        return f"drained: the requests in flight finished within {out['waited_s']:.0f} s" if out["waited_s"] >= 1 else None

    def state(self, problems=None):
        """{"door", "reason", "ready_at", "in_flight", "groups"} (node.gateway's `state`; in_flight and groups
        None: no gateway running). With a list for problems, a gateway that cannot be asked is said there and
        None returned."""
        try:
            return self._call({"op": "state"})
        except UserError as err:
            if problems is None:
                raise
            problems.append(str(err))
            return None

    def keys(self, **req):
        """The keys with their use; add={name, hash}, revoke=name or rotate={name, hash} first (under the
        keys' lock, the running gateway's answer checked: node.gateway's `keys`)."""
        return self._call({"op": "keys", **req})

    def ensure(self, default_key_hash):
        """The key map holds API_KEY_FILE's client key as `default` (made, or put back to it), and the door's
        map exists."""
        self._call({"op": "ensure", "default": {"name": "default", "hash": default_key_hash}})

    def prepare(self, config_text, default_key_hash):
        """Before a launch applies the gateway: its maps exist (ensure) and the rendered config passes
        `haproxy -c` on the head, checked as its copy that binds 127.0.0.1:PORT (commands.check_copy: HAProxy
        cannot check the descriptor of PORT that only systemd hands it). UserError naming the fix."""
        cl, head = self.cl, self.cl.home
        self.ensure(default_key_hash)
        # beside the config: the maps are named relative to its folder
        tmp = names.state_path(cl.paths(head).state_dir, names.GATEWAY_CONFIG + ".check")
        head.write_file(tmp, commands.check_copy(config_text, cl.cfg.port))
        r = head.run(commands.haproxy_check(tmp), check=False)
        cl.remove(head, tmp)
        if r.code == 127 or "not found" in (r.stderr or ""):
            raise UserError(f"haproxy is not installed on {head.label}: `sudo apt install haproxy` there "
                            "(dsv41-gateway runs it), or set GATEWAY=0")
        if r.code != 0:
            raise UserError(f"the gateway's rendered config fails `haproxy -c` on {head.label}: "
                            f"{(r.stderr or r.stdout).strip()[-400:]}")
