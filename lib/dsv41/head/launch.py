"""doit launch: preflight, image, then each node's state -> decide -> apply, then wait until the API generates a
token. The ranks restart through the one ordered restart the watchdog also performs (core.recovery.restart).
A broken cluster (core.health: a rank down, an API that does not answer, or every rank up but no token
within WATCHDOG_PROBE_S although it generated since it started: wedged) is restarted with an incident and
its evidence saved first, and no rank starts on a node whose memory did not come back after the ranks
stopped (NEEDS_REBOOT, refused until it is back or `--force`). A launch that changes what runs is a
release rolled out through core.rollout: checked, and rolled back to the last good release when it fails;
the release that just failed is refused without `--retry-failed`."""
import sys
import time

from dsv41 import names
from dsv41.errors import UserError
from dsv41.head.core import image, observe, preflight, record, rollout, units
from dsv41.head.core.cluster import Cluster
from dsv41.head.core.decide import Kind, Step, decide
from dsv41.head.core.desired import desired, engine_key, read_head_plan, read_or_create_key
from dsv41.head.core.health import BACK, DEGRADED, REPAIR, memory_check


def launch(cfg, force=False, retry_failed=False):
    t0, began = time.monotonic(), time.time()
    cfg.require_workers()
    cl = Cluster(cfg)
    fab = preflight.for_launch(cl)
    said = rollout.carry_on_way_back(cfg, "doit launch")     # a dead process's way back: finished first
    if said:
        print(said)
    states = cl.probe_all(versions=True)
    refuse_if_tripped(cl, states)
    refuse_if_needs_reboot(cl, states, force)
    image_ids = image.ensure(cl, states)
    client_key = read_or_create_key(cfg)
    want = desired(cl, fab, engine_key(cfg, create=True), read_head_plan(cfg))
    if cfg.layout.door:                                          # haproxy -c on the head before anything changes
        cl.gateway.prepare(want.files[cl.head.name][names.GATEWAY_CONFIG][0], cl.gateway.key_hash(client_key))
    ro = rollout.prepare(cfg, want, states, image_ids, retry_failed)     # refuses the release that just failed
    for line in ro.lines:
        print(line)
    resume_watchdog(cfg)
    units.write_rendered(cfg, {cl.spec(n).rank: want.units[n.name] for n in cl.nodes}, units.rendered_dir(cfg))
    if ro.resumed:                          # the release a dead process left rolling out, carried on
        rollout.carry_on(cfg, ro.release, "doit launch")
        print(f"ready: base URL {cfg.api_url}, model {cfg.served_model_name}, key in {cfg.api_key_file}; "
              f"release {ro.release.number} finished")
        return
    steps = decide(cfg.nodes, want, states, cl.recipe, cfg.groups)
    restarting = any(s.kind is Kind.RESTART_RANKS for s in steps)
    h = health_now(cl, states, probe=not restarting)
    fault = h if h.verdict in ((DEGRADED,) if restarting else REPAIR) else None
    if fault and not restarting:
        steps.append(Step(Kind.RESTART_RANKS, "all", "", f"{h.verdict}: {h.evidence}"))
    rollout.run(cl, ro, want, steps, states, force=force, fault=fault, began=began)
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
            f"the memory guard on {n.label} {t['line']}; lower {cl.recipe.memory_settings} first (raise "
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
    """core.health's judgement of the cluster as launch found it (core.observe.look). With probe, and
    every engine unit up after a readiness wait saw this start of rank 0 generate, the recipe's readiness
    is asked for a token within WATCHDOG_PROBE_S (no token: WEDGED); a rank 0 that never generated since
    it started is left to the readiness wait (a start-up). A state file that cannot be read is said and
    read as absent."""
    problems = []
    _, h = observe.judged(cl, states=states, scrape=False, probe="ready" if probe else None,
                          problems=problems)
    for line in problems:
        print(f"dsv41: {line}", file=sys.stderr, flush=True)
    return h


def resume_watchdog(cfg):
    """A watchdog that gave up (or a group's that `doit stop --group` stopped) stays hands-off until a launch:
    this one."""
    for d in sorted({cfg.state_dir, *(cfg.group_config(i).records for i in range(cfg.groups))}):
        if record.clear_gave_up(d):
            print(f"[head] cleared {names.state_path(d, names.WATCHDOG_GAVEUP)}: the watchdog acts again")


def fmt_elapsed(s):
    return f"{int(s // 60)}m{int(s % 60):02d}s"
