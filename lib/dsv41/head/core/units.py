"""Unit files rendered from units/*.j2 (jinja2, StrictUndefined), and the EXL3 plan rewrite.

Values reach a unit only through the filters below, which apply systemd's own rules
(systemd.service(5) "Command lines", systemd.syntax(7) "Quoting"): an Exec*= word is double-quoted
with C escapes when it holds whitespace, quotes, backslashes, `;` or `#`; `%` becomes `%%`
(specifiers) and `$` becomes `$$` (variable expansion). Environment= assignments (env_assign) are
quoted the same way without `$$`; other settings (unit_value) get `%%` only."""
import ipaddress
import json
import os
import pwd
import re
import sys

import jinja2

from dsv41 import names
from dsv41.errors import UserError
from dsv41.head.core import statefiles
from dsv41.head.core import commands as c
from dsv41.settings.paths import LIB_DIR, ROOT

UNITS_DIR = ROOT / "units"
MEMGUARD_TEMPLATE = "dsv41-memguard.service.j2"
WATCHDOG_TEMPLATE = "dsv41-watchdog.service.j2"
GATEWAY_TEMPLATE = "dsv41-gateway.service.j2"
GATEWAY_SOCKET_TEMPLATE = "dsv41-gateway.socket.j2"
GATEWAY_CONFIG_TEMPLATE = "dsv41-gateway.cfg.j2"
SIDE_DOOR_TEMPLATE = "dsv41-sidedoor.service.j2"
SIDE_DOOR_CONFIG_TEMPLATE = "dsv41-sidedoor.cfg.j2"
_QUOTE_IF = re.compile(r"""[\s"'\\;#\x00-\x1f\x7f]""")


def _quote(s):
    """Quoted per systemd.syntax(7): single quotes when that avoids escaping double quotes."""
    q = "'" if '"' in s and "'" not in s else '"'
    out = []
    for ch in s:
        if ch == "\\" or ch == q:
            out.append("\\" + ch)
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return q + "".join(out) + q


def exec_arg(word):
    """One word of an Exec*= command line that systemd hands to the process unchanged."""
    s = str(word).replace("%", "%%").replace("$", "$$")
    return s if s and not _QUOTE_IF.search(s) else _quote(s)


def env_assign(name, value):
    """One Environment= assignment (quoted, specifiers escaped; no `$` expansion there)."""
    s = f"{name}={value}".replace("%", "%%")
    return s if not _QUOTE_IF.search(s) else _quote(s)


def exec_line(argv):
    """A command line from an argv, or from groups of words (one group per continued line)."""
    groups = argv if argv and isinstance(argv[0], (list, tuple)) else [argv]
    return " \\\n    ".join(" ".join(exec_arg(w) for w in g) for g in groups)


def unit_value(value):
    """A value of a non-Exec setting (paths, descriptions): specifiers escaped; what systemd would
    alter (control characters, edge whitespace, a trailing backslash) is refused."""
    s = str(value)
    if re.search(r"[\x00-\x1f\x7f]", s) or s != s.strip() or s.endswith("\\"):
        raise UserError(f"{s!r} cannot be written into a unit file (control characters, leading or "
                        "trailing whitespace or a trailing backslash): choose another path")
    return s.replace("%", "%%")


def environment(templates_dir=None):
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates_dir or UNITS_DIR)),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             autoescape=False)
    env.filters.update(exec_arg=exec_arg, exec_line=exec_line, unit_value=unit_value,
                       env_assign=env_assign)
    return env


def memguard_vars(cfg, paths):
    return {"memguard": c.memguard_argv(c.fact(paths, "state_dir"))}


def deploying_user():
    """The head's services (watchdog, gateway) run as the user who deploys (whose ssh config reaches the
    workers, who owns the state dir); None for root."""
    return None if os.getuid() == 0 else pwd.getpwuid(os.getuid()).pw_name


def watchdog_vars(paths):
    return {"user": deploying_user(), "watchdog": c.watchdog_argv(c.fact(paths, "state_dir"), sys.executable, LIB_DIR)}


def gateway_vars(cfg, paths):
    return {"port": cfg.port, "user": deploying_user(), "haproxy": c.gateway_argv(c.fact(paths, "state_dir")),
            "socket": names.GATEWAY_SOCKET_UNIT, "listen_fd": names.GATEWAY_LISTEN_FD}


def gateway_socket_vars(cfg):
    """The socket unit that holds PORT for the gateway (every address, as HAProxy's `bind :PORT` did)."""
    return {"port": cfg.port, "service": names.GATEWAY_UNIT}


DOOR_RETRY_BYTES = 262144      # with several groups: the longest request the door holds whole to send it again


def door_vars(cfg, socket):
    """What every door's config (units/door-rules.j2) takes alike: the engine's port, the timeout, and its admin
    socket, a fixed plain path. No path of the state dir enters a door's config (any STATE_DIR works): its maps
    are named relative to the config's folder (`default-path config`)."""
    if not re.fullmatch(r"[A-Za-z0-9/._-]+", socket):
        raise UserError(f"the admin socket {socket!r} must be a plain path")
    return {"engine_port": cfg.engine_port, "timeout_s": cfg.gateway_timeout_s, "socket": socket}


def gateway_config_vars(cfg, layout=None):
    """The head's door; layout: the serving layout (settings.layout.Layout) whose groups it routes among, the
    settings' by default."""
    layout = layout or cfg.layout
    return {**door_vars(cfg, names.GATEWAY_SOCKET), "port": cfg.port,
            "groups": layout.groups, "backend": names.DOOR_BACKEND, "retry_bytes": DOOR_RETRY_BYTES,
            "routing": cfg.routing,
            "bind": c.GATEWAY_BIND, "check_bind": c.CHECK_BIND.format(port=cfg.port),
            "socket_unit": names.GATEWAY_SOCKET_UNIT, "listen_fd": names.GATEWAY_LISTEN_FD,
            "rate_per_min": cfg.key_rate_per_min,
            "keys_map": names.gateway_map(names.GATEWAY_KEYS), "state_map": names.gateway_map(names.GATEWAY_STATE),
            "metrics_path": names.GATEWAY_METRICS_PATH, "routes": names.GATEWAY_ROUTES}


def side_door_bind(bind):
    """A side door's `ADDR:PORT` (an IPv4 or IPv6 address without a zone, HAProxy's spelling: the port after the
    last colon), checked: it is written into the config as it is."""
    addr, _, port = str(bind).rpartition(":")
    try:
        ipaddress.ip_address(addr)
        ok = bool(re.fullmatch(r"[0-9A-Fa-f.:]+", addr)) and port.isdigit() and 1 <= int(port) <= 65535
    except ValueError:
        ok = False
    if not ok:
        raise UserError(f"a side door binds ADDR:PORT (the node's fabric address and a port), not {bind!r}")
    return f"{addr}:{int(port)}"


def side_door_config_vars(cfg, bind):
    """The door's rules and timeouts as the gateway's (door_vars), the routes the gateway's and GET /health,
    the one key the head door's (SIDE_DOOR_KEYS, beside the config)."""
    return {**door_vars(cfg, names.SIDE_DOOR_SOCKET), "bind": side_door_bind(bind),
            "keys_map": names.gateway_map(names.SIDE_DOOR_KEYS, names.SIDE_DOOR_CONFIG),
            "key_name": names.SIDE_DOOR_KEY_NAME, "routes": names.SIDE_DOOR_ROUTES}


def _render(env, name, values):
    try:
        return env.get_template(name).render(**values)
    except jinja2.TemplateNotFound:
        raise UserError(f"units/{name} is missing: restore it from the repository") from None
    except jinja2.UndefinedError as err:
        raise UserError(f"units/{name}: {err} (a template variable that is not provided)") from None


def render_units(cfg, recipe, spec, fabric, paths, master_addr=None, templates_dir=None):
    """{filename: text} for one node: its memory guard, the recipe's engine units (core.recipe) and on
    the head the watchdog, unless WATCHDOG=0, and the gateway with the socket unit holding its port, unless
    GATEWAY=0.

    fabric: this node's resolved fabric facts (ip, ifname, hcas, gid_index), or {rank: facts} with
    the head's; the rendezvous address is the head's ip (master_addr, else cfg's R0_IP for a worker).
    paths: this node's model_dir and state_dir."""
    env = environment(templates_dir)
    out = {names.MEMGUARD_UNIT: _render(env, MEMGUARD_TEMPLATE, memguard_vars(cfg, paths))}
    out.update(recipe.render(lambda name, values: _render(env, name, values), spec, fabric, paths, master_addr,
                             statefiles.server_flags(cfg.state_dir, cfg.image)))
    if spec.rank == 0 and cfg.watchdog:
        out[names.WATCHDOG_UNIT] = _render(env, WATCHDOG_TEMPLATE, watchdog_vars(paths))
    if spec.rank == 0 and cfg.layout.door:
        out[names.GATEWAY_SOCKET_UNIT] = _render(env, GATEWAY_SOCKET_TEMPLATE, gateway_socket_vars(cfg))
        out[names.GATEWAY_UNIT] = _render(env, GATEWAY_TEMPLATE, gateway_vars(cfg, paths))
    if cfg.side_door_node(spec):
        out[names.SIDE_DOOR_UNIT] = side_door_unit(paths, templates_dir)
    return out


def side_door_node_config(cfg, spec):
    """A side door's config for its node, binding the address the head's door reaches it at (settings.layout):
    that node's fabric address, ENGINE_PORT."""
    group = cfg.layout.groups[cfg.group_of(spec)]
    try:
        bind = side_door_bind(f"{group.host}:{group.port}")
    except UserError:
        raise UserError(f"{spec.name}'s side door binds its fabric address, and {group.host!r} is none: set "
                        f"R{spec.rank}_IP to {spec.name}'s fabric address") from None
    return side_door_config(cfg, bind)


def gateway_config(cfg, templates_dir=None, layout=None):
    """dsv41-gateway's HAProxy config (a state file of the head: $STATE_DIR/gateway/haproxy.cfg)."""
    return _render(environment(templates_dir), GATEWAY_CONFIG_TEMPLATE, gateway_config_vars(cfg, layout))


def side_door_config(cfg, bind, templates_dir=None):
    """A side door's HAProxy config (a state file of a group's first node off the head: $STATE_DIR/sidedoor/
    haproxy.cfg) binding bind (its fabric ADDR:PORT) in front of 127.0.0.1:ENGINE_PORT."""
    return _render(environment(templates_dir), SIDE_DOOR_CONFIG_TEMPLATE, side_door_config_vars(cfg, bind))


def side_door_unit(paths, templates_dir=None):
    """dsv41-sidedoor.service for a group's first node off the head (paths: that node's state_dir): HAProxy
    through the gateway's key-reading wrapper, reading this node's engine key; as root, as every unit of a
    worker."""
    return _render(environment(templates_dir), SIDE_DOOR_TEMPLATE,
                   {"haproxy": c.side_door_argv(c.fact(paths, "state_dir"))})


def side_door_key_map(key_hash):
    """The text of a side door's key map (names.SIDE_DOOR_KEYS, to be written 0600): the sha256 (hex) of the head
    door's engine key, named SIDE_DOOR_KEY_NAME; never the key."""
    if not re.fullmatch(r"[0-9a-f]{64}", str(key_hash)):
        raise UserError("a side door's key map holds the sha256 of the head door's key (64 lower-case hex digits)")
    return (f"# dsv41-sidedoor's one key: the sha256 of the head door's engine key, never the key.\n"
            f"{key_hash} {names.SIDE_DOOR_KEY_NAME}\n")


GATEWAY_RENDERED = "haproxy.cfg"
GATEWAY_CHECK_RENDERED = "haproxy.check.cfg"


def gateway_config_files(cfg):
    """{filename: text} of the gateway's config for `doit render`: the config, its copy for `haproxy -c`
    (commands.check_copy) and empty maps beside them where they name them, so `haproxy -c -f
    haproxy.check.cfg` checks it in that folder (the gateway's own maps stay in $STATE_DIR/gateway)."""
    empty = ("# empty: only for `haproxy -c` of haproxy.check.cfg here; the gateway's own maps are in "
             "$STATE_DIR/gateway\n")
    text = gateway_config(cfg)
    return {GATEWAY_RENDERED: text, GATEWAY_CHECK_RENDERED: c.check_copy(text, cfg.port),
            **{names.gateway_map(m): empty for m in (names.GATEWAY_KEYS, names.GATEWAY_STATE)}}


def rendered_dir(cfg):
    """Where rendered units are kept on the head: $STATE_DIR/units."""
    return names.state_path(cfg.state_dir, names.UNITS)


def write_rendered(cfg, rendered_by_rank, out_dir=None):
    """Write {rank: {filename: text}} to <out_dir>/r<N>/ (default $STATE_DIR/units on the head).
    Unchanged files are left alone (their mtime too); files of ranks or units no longer rendered
    are removed. Returns the paths written."""
    out_dir = out_dir or rendered_dir(cfg)
    written = []
    for rank, files in sorted(rendered_by_rank.items()):
        d = os.path.join(out_dir, f"r{rank}")
        for name, text in sorted(files.items()):
            path = os.path.join(d, name)
            if statefiles.write_if_changed(path, text.encode()):
                written.append(path)
    if os.path.isdir(out_dir):
        for sub in os.listdir(out_dir):
            m = re.fullmatch(r"r(\d+)", sub)
            if not m or not os.path.isdir(os.path.join(out_dir, sub)):
                continue
            keep = rendered_by_rank.get(int(m.group(1)), {})
            stale = [names.gateway_map(n) for n in (names.GATEWAY_KEYS, names.GATEWAY_STATE)] + [
                GATEWAY_RENDERED, GATEWAY_CHECK_RENDERED]
            for name in os.listdir(os.path.join(out_dir, sub)):
                if (name.endswith((".service", ".socket")) or name in stale) and name not in keep:
                    os.unlink(os.path.join(out_dir, sub, name))
            if not keep and not os.listdir(os.path.join(out_dir, sub)):
                os.rmdir(os.path.join(out_dir, sub))
    return written


def rewrite_plan(plan_json_text):
    """The EXL3 plan with every `qdir` entry pointing at /model/exl3/<last path component>."""
    try:
        plan = json.loads(plan_json_text)
    except ValueError as err:
        raise UserError(f"the EXL3 plan is not valid JSON ({err}): re-download the checkpoint") from None
    found = []

    def walk(node):
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "qdir":
                    node[k] = _rewrite_qdir(v)
                    found.append(k)
                else:
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(plan)
    if not found:
        raise UserError("the EXL3 plan has no `qdir` key: check PLAN_NAME names a plan in exl3/plan/")
    return json.dumps(plan, indent=2) + "\n"


def _rewrite_qdir(value):
    if not isinstance(value, str):
        raise UserError(f"the EXL3 plan's qdir is {value!r}, not a colon-separated list of bank dirs")
    out = []
    for entry in value.split(":"):
        last = entry.rstrip("/").rsplit("/", 1)[-1]
        if not last or last in (".", ".."):
            raise UserError(f"the EXL3 plan's qdir {value!r} has an empty or relative entry "
                            f"{entry!r}: expected names like qn:q31:q31s")
        out.append(f"/model/exl3/{last}")
    return ":".join(out)
