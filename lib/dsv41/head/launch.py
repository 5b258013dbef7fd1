"""doit launch: preflight, image, then each node's state -> decide -> apply, then wait until the API generates a
token. The ranks restart through the one ordered restart the watchdog also performs (core.recovery.restart).
A broken cluster (core.health: a rank down, an API that does not answer, or every rank up but no token
within WATCHDOG_PROBE_S although it generated since it started: wedged) is restarted with an incident and
its evidence saved first, and no rank starts on a node whose memory did not come back after the ranks
stopped (NEEDS_REBOOT, refused until it is back or `--force`)."""
import time

from dsv41 import names
from dsv41.errors import UserError
from dsv41.head.core import exporter, image, preflight, record, recovery, units
from dsv41.head.core.cluster import Cluster, say
from dsv41.head.core.decide import Kind, Step, decide
from dsv41.head.core.desired import desired, read_head_plan, read_or_create_key
from dsv41.head.core.health import BACK, DEGRADED, NO_TOKEN, REPAIR, TOKEN, Memory, Observation, assess, memory_check
from dsv41.head.core.ranks import wait_ready


def launch(cfg, force=False):
    t0 = time.monotonic()
    cfg.require_workers()
    cl = Cluster(cfg)
    fab = preflight.for_launch(cl)
    states = cl.probe_all()
    refuse_if_tripped(cl, states)
    refuse_if_needs_reboot(cl, states, force)
    resume_watchdog(cfg)
    image.ensure(cl, states)
    want = desired(cl, fab, read_or_create_key(cfg), read_head_plan(cfg))
    units.write_rendered(cfg, {cl.spec(n).rank: want.units[n.name] for n in cl.nodes}, units.rendered_dir(cfg))
    steps = decide(cfg.nodes, want, states, cl.recipe)
    restarting = any(s.kind is Kind.RESTART_RANKS for s in steps)
    h = health_now(cl, states, probe=not restarting)
    fault = h if h.verdict in ((DEGRADED,) if restarting else REPAIR) else None
    if fault and not restarting:
        steps.append(Step(Kind.RESTART_RANKS, "all", "", f"{h.verdict}: {h.evidence}"))
    paused = pause_watchdog(cl, states, steps)
    apply(cl, want, steps, states, force, fault)
    wait_ready(cl)
    apply_watchdog(cl, steps, paused)
    print(f"ready: base URL {cfg.api_url}, model {cfg.served_model_name}, key in {cfg.api_key_file}; "
          + done(steps, time.monotonic() - t0))


def done(steps, took):
    """What this launch did, for its last line."""
    if any(s.kind is Kind.RESTART_RANKS for s in steps):
        return f"ranks (re)started, start-up took {fmt_elapsed(took)}"
    if steps:
        return "applied: " + ", ".join(dict.fromkeys(f"{s.kind.value} on {s.node}" for s in steps))
    return "nothing changed"


def refuse_if_tripped(cl, states):
    tripped = [(n, states[n.name].tripped) for n in cl.nodes if states[n.name].tripped]
    if tripped:
        n, t = tripped[0]
        raise UserError(
            f"the memory guard on {n.label} {t['line']}; lower KV_BYTES or GPU_UTIL first (raise "
            "MEMGUARD_GIB only after that), then run `doit clear-trip` and launch again")


def refuse_if_needs_reboot(cl, states, force):
    """A restart found a node's memory not back: refuse until it is (or --force, which starts the ranks
    anyway; the baseline stays as it was)."""
    marker = record.needs_reboot(cl.cfg.state_dir)
    if not marker:
        return
    check = memory_check(cl.cfg, states)
    if force or check.verdict == BACK:
        record.clear_needs_reboot(cl.cfg.state_dir)
        print("[head] " + ("--force: starting although " + marker["line"] if check.verdict != BACK
                           else "the memory came back on every node: NEEDS_REBOOT cleared"))
        return
    raise UserError(f"NEEDS_REBOOT: {check.line() or marker['line']}")


def health_now(cl, states, probe):
    """core.health's judgement of the cluster as launch found it. With probe, and every engine unit up
    after a readiness wait saw this start of rank 0 generate, the recipe's readiness is asked for a token
    within WATCHDOG_PROBE_S (no token: WEDGED); a rank 0 that never generated since it started is left to
    the readiness wait (a start-up)."""
    cfg = cl.cfg
    client = cl.api(read_timeout=cfg.watchdog_probe_s)
    head = states[cl.head.name]
    every = [states[n.name].unit(u) for n in cl.nodes for u in cl.engine_units(n)]
    started = max((head.unit(u).since for u in cl.engine_units(cl.head)), default=0.0)
    ready = record.ready_at(cfg.state_dir)
    health = client.health()
    token = None
    if probe and health == 200 and ready is not None and ready >= started and all(u.active == "active" for u in every):
        token = TOKEN if cl.recipe.ready(client) else NO_TOKEN
    obs = Observation(time.time(), states, health, None, token, ready_at=ready)
    return assess(cfg, obs, Memory(), cl.recipe)


def resume_watchdog(cfg):
    """A watchdog that gave up stays hands-off until a launch: this one."""
    if record.clear_gave_up(cfg.state_dir):
        print(f"[head] cleared {names.state_path(cfg.state_dir, names.WATCHDOG_GAVEUP)}: the watchdog acts again")


def apply(cl, want, steps, states, force=False, fault=None):
    by_name = {n.name: n for n in cl.nodes}
    for s in steps:
        node = by_name.get(s.node)
        if s.kind is Kind.WRITE:
            state = cl.paths(node).state_dir
            text, mode = want.files[node.name][s.target]
            node.write_file(f"{state}/{s.target}", text, mode=mode)
            if s.target == names.SECRET_KEY:      # the key's old place (an env file): gone
                cl.remove(node, f"{state}/{names.KEY_ENV}")
            say(node, f"wrote {state}/{s.target}" + (f" (mode {mode:o})" if mode != 0o644 else ""))
        elif s.kind is Kind.INSTALL:
            install_unit(cl, node, s.target, want.units[node.name][s.target])
    for name in {s.node for s in steps if s.kind is Kind.INSTALL}:
        cl.systemctl(by_name[name], "daemon-reload")
    for s in steps:
        if s.kind in (Kind.START_GUARD, Kind.RESTART_GUARD, Kind.RELOAD_GUARD):
            control(cl, by_name[s.node], s.kind, names.MEMGUARD_UNIT, "memory guard")
    for s in steps:
        if s.kind is Kind.RESTART_RANKS:
            print(f"(re)starting the ranks: {s.reason}")
            recovery.restart(cl, fault=fault, by="doit launch", force=force, log=lambda m: print(f"[head] {m}"))
    for s in steps:
        if s.kind is Kind.START_EXPORTER:            # monitoring: never stops the launch
            exporter.start(cl, by_name[s.node])


WATCHDOG_STEPS = (Kind.START_WATCHDOG, Kind.RESTART_WATCHDOG, Kind.STOP_WATCHDOG)


def pause_watchdog(cl, states, steps):
    """A running watchdog stops while launch restarts the ranks (it would take their start-up for a
    fault); apply_watchdog starts it again once the API is ready, so a failed launch leaves it stopped."""
    running = states[cl.head.name].unit(names.WATCHDOG_UNIT).active == "active"
    if running and any(s.kind is Kind.RESTART_RANKS for s in steps):
        cl.systemctl(cl.head, "stop", names.WATCHDOG_UNIT)
        say(cl.head, "paused the watchdog while the ranks restart")
        return True
    return False


def apply_watchdog(cl, steps, paused):
    """The watchdog steps, after the API is ready (a paused watchdog starts again, unless WATCHDOG=0)."""
    kinds = [s.kind for s in steps if s.kind in WATCHDOG_STEPS] or ([Kind.START_WATCHDOG] if paused else [])
    for kind in kinds:                           # restart starts a stopped one
        control(cl, cl.head, kind, names.WATCHDOG_UNIT, "watchdog")


def control(cl, node, kind, unit, what):
    """systemctl start, restart, reload or stop of a service kept enabled (disabled when stopped)."""
    verb = kind.value.split("-")[0]
    cl.systemctl(node, verb, unit)
    cl.systemctl(node, "disable" if verb == "stop" else "enable", "--quiet", unit)
    say(node, f"{verb}{'ped' if verb == 'stop' else 'ed'} the {what}")


def install_unit(cl, node, name, text):
    """Write /etc/systemd/system/<name> atomically; through sudo -n when the node's user is not root."""
    path = f"{names.UNIT_DIR}/{name}"
    if cl.uid(node) == 0:
        node.write_file(path, text)
    else:
        tmp = f"{cl.paths(node).state_dir}/{names.RUN}/.{name.replace('/', '_')}.tmp"
        node.write_file(tmp, text)
        node.run(["sudo", "-n", "install", "-D", "-m", "0644", tmp, path])   # -D: a drop-in's dir
    say(node, f"installed {path}")


def fmt_elapsed(s):
    return f"{int(s // 60)}m{int(s % 60):02d}s"
