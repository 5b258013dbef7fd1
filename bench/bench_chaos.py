"""Chaos soak: a steady load on the API, random faults one at a time (the cluster not necessarily healed
from the last one), the watchdog on, and after every fault the checks: healthy again (a token back from
a real request) within the SLO, one rank container per node and nothing orphaned, at most one recovery
per fault, memory back near its baseline, every request ended by its deadline. Writes chaos.json
(schema dsv41.chaos/1), chaos.md and chaos.png to --out; exits 1 naming every check that failed.

Runs in the lab (tests/lab): brings it up when it is not up and then takes it down at the end; a lab
that was already up (`make lab-up`) is left up. LAB_ENGINE=vllm runs it on the lab's real engine.

    make chaos                                        # 30 min, faults every 60-180 s
    .venv/bin/python bench/bench_chaos.py --once --every 15-30 --watchdog fast --seed 1   # the short soak
"""
import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "lab"))

from chaos import checks, faults, report  # noqa: E402
from chaos.load import Load, served_model  # noqa: E402
from labctl import LAB_DIR, MODEL, STATE, Lab, LabRefused, missing, up  # noqa: E402

from dsv41.client.api import HEALTH_TIMEOUT  # noqa: E402   the watchdog's /health and /metrics requests

# the lab tests' fast watchdog (tests/lab/test_self_healing.py)
FAST = {"WATCHDOG_INTERVAL_S": "2", "WATCHDOG_PROBE_S": "4", "WATCHDOG_STALL_S": "12", "SSH_TIMEOUT_S": "5"}
MAX_RECOVERIES = 100          # WATCHDOG_MAX_RECOVERIES's highest value (docs/settings.md)
MEM_RETURN_GIB = 8            # issue's default: MemAvailable back within this of the baseline
MEM_RETURN_S = 120
VLLM_MODEL = "/root/lab-model-vllm/DeepSeek-V4.1-Flash-Spark"
STATE_DIR = checks.STATE_DIR


def every_range(text):
    try:
        a, b = (float(x) for x in text.split("-", 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected MIN-MAX seconds, e.g. 60-180") from None
    if not 0 < a <= b:
        raise argparse.ArgumentTypeError(f"{text!r}: expected 0 < MIN <= MAX, e.g. 60-180")
    return a, b


def positive(text):
    try:
        v = float(text)
    except ValueError:
        v = -1
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive number")
    return v


def parse(argv):
    p = argparse.ArgumentParser(prog="bench/bench_chaos.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="chaos-report",
                   help="directory for chaos.json, chaos.md, chaos.png (default: %(default)s)")
    p.add_argument("--minutes", type=positive, default=30, help="how long to inject faults (default: %(default)s)")
    p.add_argument("--once", action="store_true", help="inject the whole catalogue once (a seeded order), then stop")
    p.add_argument("--seed", type=int, default=None, help="the fault schedule's seed (default: random, printed)")
    p.add_argument("--every", type=every_range, default=(60.0, 180.0), metavar="MIN-MAX",
                   help="seconds between faults, drawn uniformly (default: 60-180)")
    p.add_argument("--after-heal", action="store_true",
                   help="each fault waits until every earlier one healed, then --every seconds more: each kind "
                        "proven on its own, as fast as the cluster heals (the short soak)")
    p.add_argument("--slo-s", type=positive, default=None,
                   help="seconds a fault may take to heal (default: the watchdog's detection bound + one "
                        "measured start-up)")
    p.add_argument("--max-recoveries", type=int, default=None,
                   help="WATCHDOG_MAX_RECOVERIES for the soak (default: enough for every fault in a window); "
                        "0 must fail")
    p.add_argument("--budget-test", action="store_true",
                   help="a budget of one recovery: show the watchdog giving up and the `doit launch` that resumes "
                        "it (each time it gives up)")
    p.add_argument("--watchdog", choices=("default", "fast"), default="default",
                   help="the watchdog's timings: its defaults, or the lab tests' fast ones (default: %(default)s)")
    p.add_argument("--backoff-s", type=positive, default=2,
                   help="WATCHDOG_BACKOFF_S, the backoff base (default: %(default)s)")
    p.add_argument("--hold-s", type=positive, default=20,
                   help="how long sshd stays stopped or the link down (default: %(default)s)")
    p.add_argument("--streams", type=int, default=3, help="concurrent request streams (default: %(default)s)")
    p.add_argument("--deadline-s", type=positive, default=30, help="each request's deadline (default: %(default)s)")
    p.add_argument("--faults", default=None,
                   help=f"fault kinds to draw from, comma list (default: all: {','.join(faults.CATALOGUE)}; "
                        "with --budget-test: kill-rank, which `doit launch` repairs)")
    a = p.parse_args(argv)
    if a.faults is None:
        a.faults = "kill-rank" if a.budget_test else ",".join(faults.CATALOGUE)
    kinds = [k for k in a.faults.split(",") if k]
    unknown = [k for k in kinds if k not in faults.CATALOGUE]
    if unknown or not kinds:
        p.error(f"--faults {a.faults!r}: unknown kind(s) {', '.join(unknown) or '(none given)'}; "
                f"use some of {', '.join(faults.CATALOGUE)}")
    if a.max_recoveries is not None and a.max_recoveries < 0:
        p.error(f"--max-recoveries {a.max_recoveries}: expected 0 or more")
    if a.streams < 1:
        p.error(f"--streams {a.streams}: expected 1 or more")
    a.kinds = kinds
    a.seed = random.SystemRandom().randrange(1 << 31) if a.seed is None else a.seed
    return a


def watchdog_env(a):
    """The watchdog settings the soak gives `doit launch`: a window holding a few faults, a budget not
    exhausted by design (unless --max-recoveries or --budget-test say otherwise), a short backoff."""
    window_min = max(1, math.ceil(2 * a.every[1] / 60))
    per_window = math.ceil(window_min * 60 / a.every[0]) + 1
    budget = 1 if a.budget_test else (min(2 * per_window, MAX_RECOVERIES) if a.max_recoveries is None
                                      else a.max_recoveries)
    env = {"WATCHDOG": "1", "WATCHDOG_MAX_RECOVERIES": str(budget), "WATCHDOG_WINDOW_MIN": str(window_min),
           "WATCHDOG_BACKOFF_S": f"{a.backoff_s:g}"}
    if os.environ.get("WATCHDOG") == "0":
        env["WATCHDOG"] = "0"                        # the watchdog off: the first fault must stay unhealed
    return {**env, **(FAST if a.watchdog == "fast" else {})}


def settings(env, *names):
    """{name: value} of the named settings as this tree's `doit config` resolves them, env's values of them
    over the defaults (the verb, not the settings' module, whose path moves)."""
    clean = {k: v for k, v in os.environ.items() if k not in names and k not in ("DSV41_PROFILE", "WORKER", "WORKERS")}
    with tempfile.TemporaryDirectory() as state:
        r = subprocess.run([sys.executable, "-m", "doit", "-f", str(REPO / "dodo.py"), "config", "--json", *names],
                           env={**clean, **{k: env[k] for k in names if k in env}, "STATE_DIR": state,
                                "PYTHONPATH": str(REPO / "lib")}, cwd=REPO, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"chaos: doit config {' '.join(names)}: {' '.join(r.stderr.split())[-300:]}")
    return {k: v["value"] for k, v in json.loads(r.stdout).items()}


def detection_bound(env):
    """Seconds from the fault within which the watchdog must see it: for a hang, the stall is counted
    from the look that saw the last progress (the steps in flight at the fault show at the next look: up
    to one interval after it), noticed at the first look after WATCHDOG_STALL_S (one more interval) and
    confirmed by a probe (WATCHDOG_PROBE_S), plus that look's own time before its probe (at most the
    /health timeout, the nodes' probes running meanwhile); or an API that does not answer two looks in a
    row (a look at a silent API lasts the /health timeout, so looks come no faster than that)."""
    values = settings(env, "WATCHDOG_STALL_S", "WATCHDOG_PROBE_S", "WATCHDOG_INTERVAL_S")
    get = lambda k: float(values[k])  # noqa: E731
    interval = get("WATCHDOG_INTERVAL_S")
    return max(get("WATCHDOG_STALL_S") + get("WATCHDOG_PROBE_S") + 2 * interval + HEALTH_TIMEOUT,
               2 * max(interval, HEALTH_TIMEOUT) + HEALTH_TIMEOUT)


def say(msg):
    print(f"{time.strftime('%H:%M:%S')} chaos: {msg}", flush=True)


class Soak:
    def __init__(self, a, lab, engine):
        self.a, self.lab, self.engine = a, lab, engine
        self.env = {**watchdog_env(a), **({"DSV41_PROFILE": "lab-vllm"} if engine == "vllm" else {})}
        self.faults, self.problems, self.budget = [], [], []    # budget: each give-up and the launch after it
        self.stopped = None             # why no more faults are injected

    def doit(self, args, check=True, timeout=1800):
        return self.lab.doit(args, self.env, check=check, timeout=timeout)

    # ---- before the load --------------------------------------------------------------------------
    def prepare(self):
        lab = self.lab
        if self.engine == "vllm":
            if lab.on("head", f"test -e {VLLM_MODEL}/sha256-manifest.txt", check=False).returncode:
                endpoint = subprocess.run(["bash", str(LAB_DIR / "hub-up.sh")], capture_output=True, text=True,
                                          check=True).stdout.strip()
                lab.doit("download", {**self.env, "HF_ENDPOINT": endpoint}, timeout=1800)
        elif lab.on("head", f"test -e {MODEL}/sha256-manifest.txt", check=False).returncode:
            lab.on("head", f"{lab.venv}/bin/python {REPO}/tests/fixture_checkpoint.py {MODEL} --mb 4")
        self.doit("clear-trip", check=False)
        lab.on("head", f"rm -f {STATE_DIR}/incidents.jsonl {STATE_DIR}/watchdog.gaveup")
        self.doit("launch")
        self.doit("stop")                     # one measured start-up: every rank from stopped to a token
        t0 = time.monotonic()
        self.doit("launch")
        self.startup_s = time.monotonic() - t0
        self.bound_s = detection_bound(self.env)
        self.slo_s = self.a.slo_s or self.bound_s + self.startup_s
        self.baseline = checks.memory_baseline(lab, list(lab.ip))
        say(f"start-up {self.startup_s:.0f} s; detection bound {self.bound_s:.0f} s; SLO {self.slo_s:.0f} s; "
            f"watchdog {' '.join(f'{k}={v}' for k, v in self.env.items())}")
        key = lab.on("head", f"cat {STATE_DIR}/api_key").stdout.strip()
        url = f"http://{lab.ip['head']}:8000/v1"
        self.load = Load(url, key, served_model(url, key), streams=self.a.streams, deadline_s=self.a.deadline_s,
                         prompt="count to 20" if self.engine == "standin" else "Say hello.")

    # ---- the soak ---------------------------------------------------------------------------------
    def run(self):
        a = self.a
        ctx = faults.Ctx(self.lab, self.engine, random.Random(a.seed), hold_s=a.hold_s, state=STATE)
        schedule = faults.plan(a.seed, a.kinds, a.every, a.minutes, once=a.once)
        say(f"seed {a.seed}: {len(schedule)} faults planned: " + ", ".join(f"+{t:.0f} s {k}" for t, k in schedule))
        self.load.start()
        self.started = time.time()
        if self.load_first_ok(self.started, 120) is None:
            self.stopped = "the API never answered a request at the start"
            self.problems.append(self.stopped)
            return
        gaps = random.Random(a.seed + 1)
        for at, kind in schedule:
            if a.after_heal and self.faults:                # from the heal of the fault before, not the clock
                while not self.stopped and any(f["healed_at"] is None for f in self.faults):
                    self.poll()
                    time.sleep(1)
                at = time.time() - self.started + gaps.uniform(*a.every)
            while time.time() < self.started + at and not self.stopped:
                self.poll()
                time.sleep(1)
            if self.stopped:
                break
            self.inject(ctx, kind)
        end = max([d for d in checks.heal_deadlines(self.faults, self.slo_s)] + [time.time()]) + 1
        while not self.stopped and time.time() < end and any(f["healed_at"] is None for f in self.faults):
            self.poll()
            time.sleep(1)
        self.poll()

    def load_first_ok(self, since, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            t = self.load.first_ok_since(since)
            if t:
                return t
            time.sleep(0.5)
        return None

    def inject(self, ctx, kind):
        t = time.time()
        f = {"kind": kind, "at": t - self.started, "injected_at": t, "node": "-", "proof": "", "healed_at": None,
             "checked": False, "left": None}
        self.faults.append(f)
        n = len(self.faults)
        try:
            f["node"], f["proof"] = faults.CATALOGUE[kind](ctx)
        except faults.NoEffect as err:
            f["proof"] = f"NO EFFECT: {err}"
        except Exception as err:  # noqa: BLE001  a fault that broke while injecting is a finding
            f["proof"] = f"NO EFFECT: {type(err).__name__}: {err}"
        f["proved_at"] = time.time()
        f["fault_s"] = round(f["proved_at"] - t, 1)     # how long the fault itself took (a hold, a reboot)
        if f["proof"].startswith("NO EFFECT"):
            self.problems.append(f"fault {n} ({kind} at +{f['at']:.0f} s): {f['proof']}")
            f["healed_at"] = f["proved_at"]
        say(f"fault {n}: {kind} on {f['node']}: {f['proof']}")

    def poll(self):
        """Mark healed faults; after the last fault healed, run the lab checks once; stop at a fault left
        unhealed past its SLO; in --budget-test, resume a watchdog that gave up with `doit launch`."""
        now = time.time()
        for f in self.faults:
            if f["healed_at"] is None:
                f["healed_at"] = self.load.first_ok_since(f["proved_at"])
                if f["healed_at"]:
                    say(f"healed: {f['kind']} on {f['node']} after {f['healed_at'] - f['injected_at']:.0f} s")
        if self.a.budget_test and any(f["healed_at"] is None for f in self.faults):
            self.resume_if_gave_up()
        if self.faults and all(f["healed_at"] for f in self.faults) and not self.faults[-1]["checked"]:
            self.lab_checks(self.faults[-1])
        for f, deadline in zip(self.faults, checks.heal_deadlines(self.faults, self.slo_s)):
            if f["healed_at"] is None and now > deadline and not self.stopped:
                left = self.what_is_left()
                for g in self.faults:
                    g["left"] = left if g["healed_at"] is None else None
                self.stopped = f"{f['kind']} on {f['node']} at +{f['at']:.0f} s left unhealed"
                say(f"STOP: {self.stopped}: {left}")
                self.lab_checks(f)            # what was left on the nodes
                for g in self.faults:
                    g["checked"] = True

    def lab_checks(self, f):
        """Orphans and memory, retried while they settle (memory within MEM_RETURN_S)."""
        f["checked"] = True
        ranks = {n: i for i, n in enumerate(self.lab.ip)}
        deadline = time.monotonic() + MEM_RETURN_S
        while True:
            snaps = {n: checks.node_snapshot(self.lab, n) for n in self.lab.ip}
            orphans = checks.check_orphans(snaps, ranks)
            memory = checks.check_memory(self.baseline, snaps, MEM_RETURN_GIB)
            if not (orphans or memory) or time.monotonic() > deadline or (orphans and f["healed_at"] is None):
                break
            time.sleep(5)
        where = f"after fault {self.faults.index(f) + 1} ({f['kind']} on {f['node']} at +{f['at']:.0f} s)"
        self.problems += [f"{where}: {p}" for p in orphans + memory]
        f["lab_checks"] = orphans + memory
        say(f"checks {where}: {'; '.join(orphans + memory) or 'one rank container per node, nothing orphaned, memory back'}")

    def what_is_left(self):
        r = self.doit("status --json", check=False, timeout=120)
        try:
            st = json.loads(r.stdout)
        except ValueError:
            return f"doit status exited {r.returncode}: {r.stderr.strip()[-200:]}"
        w = st.get("watchdog") or {}
        gave = (w.get("gave_up") or {}).get("reason")
        return (f"doit status: {st.get('state')}; watchdog {w.get('unit')}: {w.get('verdict', '-')} "
                f"({w.get('evidence', '-')})" + (f"; GAVE UP: {gave}" if gave else ""))

    def resume_if_gave_up(self):
        """--budget-test: each time the watchdog gives up, `doit launch` resumes it (recorded)."""
        seen = {b["gave_up_at"] for b in self.budget}
        gave = [i for i in checks.incidents(self.lab) if i.get("action") == "gave up" and i["started"] not in seen]
        if not gave:
            return
        say(f"the watchdog gave up: {gave[0]['result']}; `doit launch` resumes it")
        t0 = time.monotonic()
        r = self.doit("launch", check=False)
        said = [ln for ln in r.stdout.splitlines() if "cleared" in ln or "acts again" in ln]
        self.budget.append({"gave_up_at": gave[0]["started"], "reason": gave[0]["result"], "launch_rc": r.returncode,
                            "launch_s": round(time.monotonic() - t0, 1), "launch_said": said})
        for f in self.faults:
            if f["healed_at"] is None:
                f["healed_by"] = "doit launch"
        say(f"`doit launch` exited {r.returncode} after {self.budget[-1]['launch_s']:.0f} s: {' / '.join(said)}")

    # ---- after ------------------------------------------------------------------------------------
    def finish(self):
        hung = self.load.stop() if hasattr(self, "load") else []
        ended = time.time()
        if not hasattr(self, "started"):
            return None
        records = self.load.snapshot() + hung
        incs = checks.incidents(self.lab)
        if self.faults and not self.faults[-1]["checked"]:
            self.lab_checks(self.faults[-1])
        slo_bound = [f for f in self.faults if f.get("healed_by") != "doit launch"]
        self.problems += checks.check_healed(slo_bound, self.slo_s)
        by_launch = [f for f in self.faults if f.get("healed_by")]
        self.problems += [f"healed by doit launch: {p}" for p in checks.check_healed(by_launch, float("inf"))]
        self.problems += checks.check_recoveries(self.faults, incs)
        self.problems += checks.check_requests(records, self.a.deadline_s)
        if self.a.budget_test and not self.budget:
            self.problems.append("--budget-test: the watchdog never gave up")
        self.problems += [f"--budget-test: `doit launch` after the give-up exited {b['launch_rc']}"
                          for b in self.budget if b["launch_rc"]]
        by_fault = checks.attribute(self.faults, incs)
        for i, f in enumerate(self.faults):
            first = by_fault[i][0]["started"] if by_fault[i] else None
            f["detection_s"] = None if first is None else round(first - f["injected_at"], 1)
            f["recovery_s"] = None if f["healed_at"] is None else round(f["healed_at"] - f["injected_at"], 1)
            f["incidents"] = [f"{x['verdict']} {x['action']}: {x['result'][:60]}" for x in by_fault[i]]
        run = {"started": self.started, "ended": ended, "minutes_run": (ended - self.started) / 60, "seed": self.a.seed,
               "engine": self.engine, "every_s": list(self.a.every), "once": self.a.once, "deadline_s": self.a.deadline_s,
               "streams": self.a.streams, "watchdog": {k: v for k, v in self.env.items() if k != "DSV41_PROFILE"},
               "startup_s": round(self.startup_s, 1), "detection_bound_s": self.bound_s, "slo_s": round(self.slo_s, 1),
               "memory_baseline": self.baseline, "budget_test": self.budget or None, "stopped": self.stopped}
        rep = report.build(run, records, self.faults, incs, self.problems)
        out = report.write(rep, records, self.a.out)
        return rep, out


def main(argv=None):
    a = parse(argv)
    why = missing()
    if why:
        print(f"chaos: cannot run here: {why}", file=sys.stderr)
        return 2
    engine = os.environ.get("LAB_ENGINE", "standin")
    try:                     # a lab of this checkout's, for benchmarks (LAB_FOR=tests: the lab tests' own)
        brought_up = up(os.environ.get("LAB_FOR", "bench"), LAB_ENGINE=engine)
    except LabRefused as err:
        print(f"chaos: {err}", file=sys.stderr)
        return 2
    except RuntimeError as err:
        print(f"chaos: {err}", file=sys.stderr)
        return 1
    if brought_up:
        say("brought the lab up (it is taken down at the end)")
    soak = Soak(a, Lab(), engine)
    result = None
    try:
        soak.prepare()
        soak.run()
    except KeyboardInterrupt:        # make soak's time bound, or Ctrl-C: the report says so and the lab goes
        soak.stopped = "stopped by SIGINT (a time bound, or Ctrl-C) before the soak's end"
        soak.problems.append(soak.stopped)
    finally:
        try:
            result = soak.finish()
        finally:
            if brought_up:
                subprocess.run(["bash", str(LAB_DIR / "down.sh")], capture_output=True, text=True, timeout=600)
    if result is None:
        return 1
    rep, out = result
    av = rep["availability"]
    say(f"{len(rep['faults'])} faults in {rep['minutes_run']:.1f} min; availability "
        f"{'-' if av is None else f'{100 * av:.1f} %'}; {rep['restarts']} restarts; requests "
        + ", ".join(f"{v} {k}" for k, v in rep["requests"].items()))
    for kind, k in rep["per_kind"].items():
        say(f"  {kind:<15} n={k['n']} detection p50 {report.fmt(k['detection_p50_s'])} p95 {report.fmt(k['detection_p95_s'])}"
            f", recovery p50 {report.fmt(k['recovery_p50_s'])} p95 {report.fmt(k['recovery_p95_s'])}, unhealed {k['unhealed']}")
    say(f"report: {out}/chaos.json, chaos.md, chaos.png")
    for p in rep["problems"]:
        print(f"chaos: FAILED: {p}", file=sys.stderr)
    return 0 if rep["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
