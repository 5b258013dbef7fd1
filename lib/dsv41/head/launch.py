"""doit launch: preflight, image, then each node's state -> decide -> apply, then wait until the API generates a
token. The engine's units stop and start in the recipe's order (core.ranks). A broken cluster (a rank down,
or every rank up but no token within WATCHDOG_PROBE_S although it generated since it started: wedged) is
restarted with its evidence saved first in an incident folder, and no rank starts on a node whose memory did
not come back after the ranks stopped (core.recovery: NEEDS_REBOOT, refused until it is back or `--force`)."""
import os
import time

from dsv41 import names
from dsv41.errors import UserError
from dsv41.head.core import exporter, hang, image, preflight, ranks, recovery, units
from dsv41.head.core.cluster import Cluster, say
from dsv41.head.core.decide import Kind, Step, decide
from dsv41.head.core.desired import desired, read_head_plan, read_or_create_key
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
    fault = broken(cl, states) or (None if restarting else wedged(cl, states))
    if fault and not restarting:
        steps.append(Step(Kind.RESTART_RANKS, "all", "", f"{fault[0]}: {fault[1]}"))
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
    """A restart found a node's memory not back: refuse until it is (or --force, which also takes the
    memory as it is now as every node's new baseline)."""
    marker = recovery.needs_reboot(cl.cfg.state_dir)
    if not marker:
        return
    check = recovery.check_now(cl.cfg, states)
    if force or check.verdict == hang.OK:
        recovery.clear_needs_reboot(cl.cfg.state_dir)
        print("[head] " + ("--force: starting although " + marker["line"] if check.verdict != hang.OK
                           else "the memory came back on every node: NEEDS_REBOOT cleared"))
        return
    raise UserError(f"NEEDS_REBOOT: {check.line() or marker['line']}")


def broken(cl, states):
    """("DEGRADED", what is broken, when it broke) when some engine unit runs and another does not, or one
    failed; None when the ranks are all up or all stopped cleanly."""
    units = [(n, u, states[n.name].unit(u)) for n in cl.nodes for u in cl.engine_units(n)]
    down = [(n, u, s) for n, u, s in units if s.active != "active"]
    if not down or (len(down) == len(units) and all(s.result in ("success", "") for _, _, s in down)):
        return None
    since = [float(s.inactive_enter[1:]) for _, _, s in down if s.inactive_enter.startswith("@")
             and s.inactive_enter != "@0"]
    return ("DEGRADED", "; ".join(f"{u} on {n.name} is {s.active or 'not installed'} ({s.result or '?'})"
                                  for n, u, s in down), min(since) if since else None)


def wedged(cl, states):
    """("WEDGED", what, None) when every engine unit is up, a readiness wait saw rank 0 generate since it
    started (ready.json), and no token comes back within WATCHDOG_PROBE_S now; else None. A rank 0 that
    never generated since it started is left to the readiness wait (a start-up). Launch asks only when
    nothing else restarts the ranks."""
    every = [states[n.name].unit(u) for n in cl.nodes for u in cl.engine_units(n)]
    started = max((states[cl.head.name].unit(u).since for u in cl.engine_units(cl.head)), default=None)
    ready = ranks.ready_at(cl.cfg.state_dir)
    if any(u.active != "active" for u in every) or ready is None or started is None or ready < started:
        return None
    if cl.recipe.ready(cl.api(read_timeout=cl.cfg.watchdog_probe_s)):
        return None
    return ("WEDGED", f"every rank is up, but no token came back within {cl.cfg.watchdog_probe_s} s "
                      "(WATCHDOG_PROBE_S)", None)


def restart_ranks(cl, states, force, fault=None):
    """A broken cluster's evidence first, then its containers killed (no stop grace); stop; each node's
    baseline when it has none (every node's with force); start once every node's memory came back."""
    if fault:
        recovery.save_evidence(cl, *fault, log=lambda m: print(f"[head] {m}"))
        ranks.kill_ranks(cl)
    ranks.stop_ranks(cl)
    recovery.record_baselines(cl, cl.observe(), force=force)
    recovery.start_when_memory_back(cl, force=force, log=lambda m: print(f"[head] {m}"))


def resume_watchdog(cfg):
    """A watchdog that gave up stays hands-off until a launch: this one."""
    marker = names.state_path(cfg.state_dir, names.WATCHDOG_GAVEUP)
    if os.path.exists(marker):
        os.unlink(marker)
        print(f"[head] cleared {marker}: the watchdog acts again")


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
            restart_ranks(cl, states, force, fault)
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
