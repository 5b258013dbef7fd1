"""End to end with the lab's real engine: vLLM 0.32's CPU build as two tensor-parallel ranks (rank 0 on
the head, rank 1 headless on the worker) over the lab's veth fabric, serving a tiny model (SmolLM2-135M)
that went the checkpoint's way: downloaded from the Hub stand-in with its split shards, reassembled and
verified on the head, copied to the worker and verified there, mounted at /model on both. Only what
conf/lab-vllm.toml lists differs from a Spark's units; these tests run it without torch.compile
(conf/lab-vllm-eager.toml: nothing they prove depends on compiled kernels), but for the warm-cache figure."""
import contextlib
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import lab_up
import labctl
from labctl import CACHE, LAB_DIR, DoorClient, only_503s

from dsv41.client import metrics
from dsv41.head.core import hang
from dsv41.settings import schema
from dsv41.vllm.recipe import Vllm

pytestmark = [pytest.mark.lab, pytest.mark.vllm]

MODEL = "/root/lab-model-vllm/DeepSeek-V4.1-Flash-Spark"
STATE = "/root/.dsv41-two-sparks"


def api(lab, path, key=None, body=None):
    """(HTTP status, body) of a request to the head's API, from the head."""
    cmd = ["curl", "-sS", "-m", "120", "-w", "\n%{http_code}", f"http://127.0.0.1:8000{path}"]
    if key:
        cmd += ["-H", f"Authorization: Bearer {key}"]
    if body is not None:
        cmd += ["-H", "Content-Type: application/json", "--data-binary", "@-"]
    r = lab.on("head", cmd, check=False, input=json.dumps(body) if body is not None else None)
    text, _, code = r.stdout.rpartition("\n")
    return int(code or 0), text


@pytest.fixture(scope="module")
def vllm(lab):
    if not (CACHE / "vllm" / ".done").exists():
        pytest.skip("the lab's real engine is not built: run 'LAB_ENGINE=vllm bash tests/lab/cache.sh' "
                    "(tests/setup/lab.sh does)")
    lab_up(LAB_ENGINE="vllm")
    endpoint = subprocess.run(["bash", str(LAB_DIR / "hub-up.sh")], capture_output=True, text=True,
                              check=True).stdout.strip()
    # the watchdog stays off (lab.doit's default: these tests repair by hand); those that take `watched` turn it on
    env = {"DSV41_PROFILE": "lab-vllm-eager", "HF_ENDPOINT": endpoint}
    lab.doit("stop", check=False)
    for node, rank in (("head", 0), ("worker1", 1)):
        lab.on(node, f"systemctl stop dsv41-gateway.socket dsv41-gateway dsv41-r{rank} dsv41-memguard 2>/dev/null; "
               f"rm -rf {STATE} {Path(MODEL).parent} "
               "/etc/systemd/system/dsv41-*; systemctl daemon-reload", check=False)
    t0 = time.monotonic()
    lab.doit("download", env)
    t1 = time.monotonic()
    launched = lab.doit("launch", env, timeout=1800)
    took, launch_s = time.monotonic() - t0, time.monotonic() - t1
    print(f"real engine: download + launch from nothing took {took:.0f} s (the launch {launch_s:.0f} s)")
    key = lab.on("head", f"cat {STATE}/api_key").stdout.strip()
    yield SimpleNamespace(env=env, key=key, launched=launched, took=took, launch_s=launch_s)
    lab.doit("stop", env, check=False)


def test_launch_from_nothing_serves_through_two_real_vllm_ranks(lab, vllm):
    out = vllm.launched.stdout
    assert "ready: base URL http://198.51.100.11:8000/v1" in out and "ranks (re)started" in out
    for node, rank in (("head", 0), ("worker1", 1)):
        image = lab.on(node, f"docker inspect --format '{{{{.Config.Image}}}}' dsv41-r{rank}").stdout.strip()
        assert "/lab/vllm@sha256:" in image
        args = lab.on(node, f"docker inspect --format '{{{{json .Args}}}}' dsv41-r{rank}").stdout
        assert "--swa-block-size" not in args and '"--master-addr","198.51.100.11"' in args.replace(", ", ",")
    r1_args = lab.on("worker1", "docker inspect --format '{{json .Args}}' dsv41-r1").stdout
    assert "--headless" in r1_args and "--shutdown-timeout" not in r1_args
    # vLLM 0.32 lists --shutdown-timeout: `doit image` found it and rank 0 drains itself for DRAIN_S when stopped
    assert "--shutdown-timeout: taken" in out
    assert '"--shutdown-timeout","120"' in lab.on("head", "docker inspect --format '{{json .Args}}' dsv41-r0").stdout
    # the checkpoint went the whole way: parts reassembled and verified on the head, shards copied
    for node in ("head", "worker1"):
        listing = lab.on(node, f"ls {MODEL}").stdout.split()
        assert "model-00005-of-00006.safetensors" in listing and not [n for n in listing if ".part" in n]
        receipt = json.loads(lab.on(node, f"cat {STATE}/checkpoint-receipt.json").stdout)
        assert len(receipt["files"]) == 6
    assert "model-00006-of-00006.safetensors" in lab.on("worker1", "docker exec dsv41-r1 ls /model").stdout


def test_the_real_api_answers_with_the_key_only(lab, vllm):
    code, body = api(lab, "/v1/models", vllm.key)
    model = json.loads(body)["data"][0]
    assert code == 200 and model["id"] == "deepseek-v4.1-flash" and model["max_model_len"] == 8192
    assert api(lab, "/v1/models")[0] == 401 and api(lab, "/v1/models", "wrong")[0] == 401
    code, body = api(lab, "/v1/chat/completions", vllm.key, {
        "model": "deepseek-v4.1-flash", "messages": [{"role": "user", "content": "Name three colours."}],
        "max_tokens": 24, "temperature": 0})
    answer = json.loads(body)
    assert code == 200 and answer["choices"][0]["message"]["content"].strip()
    assert answer["usage"]["completion_tokens"] > 0
    code, body = api(lab, "/v1/completions", vllm.key, {
        "model": "deepseek-v4.1-flash", "prompt": "The three primary colors are", "max_tokens": 16,
        "temperature": 0, "stream": True})
    chunks = [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: {")]
    assert code == 200 and len(chunks) > 3 and body.rstrip().endswith("data: [DONE]")
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]).strip()


def test_the_door_gives_no_model_answer_to_a_hostile_client_on_the_fabric(lab, vllm):
    """tests/door_corpus.py from worker1 at the head's port 8000 with no key, a wrong key and a revoked key:
    no model answer, and the door's log shows none of it passed to the engine (tests/lab/door_hostile.py)."""
    from door_hostile import run_hostile_corpus
    run_hostile_corpus(lab, vllm.key, vllm.env)


def test_evidence_holds_the_stopped_engine_cores_stack_and_no_key(lab, vllm):
    """node/evidence.py on the head while rank 0's EngineCore is stopped (SIGSTOP: the API answers, nothing
    progresses): py-spy, installed on the lab's nodes from PyPI, dumps every Python process of the rank
    container, the stopped EngineCore with vLLM's frames among them; the API key is nowhere in it."""
    pid = lab.on("head", "pgrep -f '^VLLM::EngineCore'").stdout.split()[0]
    lab.on("head", f"kill -STOP {pid}")
    try:
        req = json.dumps({"containers": ["dsv41-r0"], "units": ["dsv41-r0.service"]})
        r = lab.on("head", f"cd {lab.repo}/lib && python3 -m dsv41.node.evidence '{req}'", timeout=300)
    finally:
        lab.on("head", f"kill -CONT {pid}", check=False)
    ev = json.loads(r.stdout)
    assert int(pid) in ev["dumped_pids"] and len(ev["dumped_pids"]) >= 2, ev["notes"]
    assert re.search(r"vllm/v1/engine/core\.py:\d+", ev["files"][f"pyspy-{pid}.txt"])
    assert "dsv41-r0" in ev["files"]["containers.txt"] and vllm.key not in r.stdout
    assert api(lab, "/v1/completions", vllm.key, {"model": "deepseek-v4.1-flash", "prompt": "Hi",
                                                  "max_tokens": 2})[0] == 200


def test_a_long_chunked_prefill_is_progress_though_no_token_total_moves(lab, vllm):
    """A prompt of about 7400 tokens prefilled alone in chunks of BATCH (2048), /metrics scraped every second
    on the head: the token totals and the step count stand still until the first token (vLLM records a
    step only with output) while the KV-cache use grows chunk by chunk, so head/core/hang.Progress never sees
    the engine flat for more than about one chunk (measured: 13 s to the first token, 11 samples with none
    counted, flat at most 3 s)."""
    r = lab.on("head", f"/opt/dsv41-venv/bin/python {lab.repo}/bench/prefill_signals.py --words 7000 "
               f"--metrics-url http://127.0.0.1:18000/metrics --raw /tmp/prefill-raw.jsonl", timeout=900)
    found = json.loads(r.stdout.splitlines()[-1])
    scrapes = [json.loads(line) for line in lab.on("head", "cat /tmp/prefill-raw.jsonl").stdout.splitlines()]
    progress = hang.Progress.for_recipe(Vllm)
    flats = [progress.update(metrics.parse(s["text"], at=s["t"])) for s in scrapes]
    print(f"real engine: {found['prompt_tokens']} prompt tokens in {found['took_s']} s, {found['prefill_samples']} s "
          f"with no token counted; longest flat stretch {max(flats):.1f} s; moved: {found['moved']}")
    assert found["prefill_samples"] >= 8
    assert not any("iteration_tokens_total_count" in k or "tokens_total{" in k for k in found["moved"])
    assert any(k.startswith("vllm:kv_cache_usage_perc") for k in found["moved"])
    assert max(flats) < found["prefill_samples"] / 2


def test_smoke_and_bench_report_against_the_real_engine(lab, vllm):
    r = lab.doit("smoke", vllm.env, check=False)
    lines = r.stdout.splitlines()
    for name in ("text", "tools", "vision", "reasoning", "stream"):
        assert any(re.match(rf"^{name}\s+(PASS|FAIL|SKIP) ", ln) for ln in lines), r.stdout
    assert any(re.match(r"^stream\s+PASS ", ln) for ln in lines), r.stdout      # the protocol works
    assert r.returncode in (0, 1)                   # a 135M model may honestly FAIL the arithmetic
    r = lab.doit("bench -- --out /tmp/lab-bench.json --prefill 256 --conc 1 --reps 1 --dec-reps 1 --kinds short "
                 "--ctx --request-timeout-s 60",
                 vllm.env, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads(lab.on("head", "cat /tmp/lab-bench.json").stdout)
    assert result["prefill"] and result["decode"]


@pytest.mark.soak           # the watchdog's repair of a killed worker is the per-landing proof
def test_a_killed_worker_rank_fails_the_api_as_vllm_does_and_launch_repairs_it(lab, vllm):
    lab.on("worker1", "docker kill dsv41-r1")
    code, body = api(lab, "/v1/completions", vllm.key, {"model": "deepseek-v4.1-flash", "prompt": "Hi",
                                                        "max_tokens": 4})
    assert code != 200                              # real vLLM: 500 EngineDeadError, then rank 0 exits
    deadline = time.monotonic() + 60
    while True:
        r = lab.doit("status --json", vllm.env, check=False)
        report = json.loads(r.stdout)
        if report["state"] in ("NOT RUNNING", "DEGRADED", "DOWN") and report["nodes"]["head"]["rank_state"] != "active/running":
            break
        assert time.monotonic() < deadline, report
        time.sleep(2)
    assert r.returncode in (1, 3, 6)
    t0 = time.monotonic()
    r = lab.doit("launch", vllm.env, timeout=1800)
    print(f"real engine: relaunch after a killed worker took {time.monotonic() - t0:.0f} s")
    assert "ranks (re)started" in r.stdout
    assert json.loads(lab.doit("status --json", vllm.env).stdout)["state"] == "READY"
    assert api(lab, "/v1/completions", vllm.key, {"model": "deepseek-v4.1-flash", "prompt": "Hi",
                                                  "max_tokens": 4})[0] == 200


WARM_RATIO_MAX = 0.9         # docs/lab.md: a warm start-up 0.55 of a cold one on an AVX-512 Xeon


@pytest.mark.soak
def test_a_warm_cache_launch_is_faster_than_a_cold_one(lab, vllm):
    """With torch.compile, as on a Spark (conf/lab-vllm.toml): both ranks from stopped with the compile cache
    ($STATE_DIR/cache) emptied on every node, then again with it warm, measured in the same run; both launches
    of the release already in service (the profile's change is launched first), so neither has a rollout.
    Each start-up's phases are read from rank 0's journal. vLLM's CPU build compiles inside its warm-up
    (compilation mode DYNAMO_TRACE_ONCE: no "torch.compile took" line, no compile phase), so there the cache
    shows as a shorter warm-up, and the cold start leaves inductor's kernels in the cache on both ranks; a
    build whose log shows the compile (the GPU build's) says miss, then hit. The warm start finds the ranks'
    caches alike (nothing cleared)."""
    # a cold compile on 2 busy cores can outlast the lab profile's 3-minute rollout floor: measured, not judged
    env = {**vllm.env, "DSV41_PROFILE": "lab-vllm", "ROLLOUT_MIN_TIMEOUT_MIN": "10"}
    lab.doit("launch", env, timeout=1800)
    took, phases, said, held = {}, {}, {}, {}
    for cache in ("cold", "warm"):
        lab.doit("stop", env)
        if cache == "cold":
            for node in ("head", "worker1"):
                lab.on(node, f"rm -rf {STATE}/cache/*")
        t0 = time.monotonic()
        r = lab.doit("launch", env, timeout=1800)
        took[cache], said[cache] = time.monotonic() - t0, r.stdout + r.stderr
        assert json.loads(lab.doit("status --json", env).stdout)["state"] == "READY"
        last = json.loads(lab.on("head", f"cat {STATE}/startup.json").stdout)
        phases[cache] = {p["phase"]: p for p in last["phases"]}
        phases[cache]["whole"] = {"seconds": last["total"], "cache": None}
        held[cache] = {n: e["caches"]["bytes"]["torch inductor"] for n, e in
                       json.loads(lab.doit("status --json", env).stdout)["nodes"].items()}
        lab.on("head", f"journalctl -u dsv41-r0 -o short-iso-precise --no-pager --since=-{int(took[cache]) + 60}s "
                       f"> /tmp/startup-{cache}.log", check=False)      # kept for the parser's records
    ratio = took["warm"] / took["cold"]
    print(f"real engine: launch with a warm compile cache took {took['warm']:.0f} s, with a cold one "
          f"{took['cold']:.0f} s ({ratio:.2f} of it); per phase (s, cold / warm):")
    for name in phases["cold"]:
        cold, warm = phases["cold"][name], phases["warm"].get(name, {})
        print(f"  {name:<10} {cold['seconds']!s:>8} {cold['cache'] or '':<5} {warm.get('seconds')!s:>8} "
              f"{warm.get('cache') or ''}")
    lab.doit("launch", vllm.env, timeout=1800)              # the other tests' profile again
    assert ratio <= WARM_RATIO_MAX
    print(f"  torch inductor's cache after each (bytes per node): {held}")
    if "compile" in phases["cold"]:
        assert (phases["cold"]["compile"]["cache"], phases["warm"]["compile"]["cache"]) == ("miss", "hit"), phases
    else:
        assert phases["warm"]["warmup"]["seconds"] < phases["cold"]["warmup"]["seconds"], phases
    assert all(held["cold"].values()), held
    assert "caches differ between the ranks" not in said["warm"], said["warm"][-3000:]


def never_ready_image(lab):
    """The lab's engine image with a shim on the rank's command (/opt/vllm/bin/vllm, the units' ENGINE_CMD)
    that starts the real vLLM on port 8009: it starts and never serves on the API's port. Pushed to the
    lab registry and pinned by digest."""
    ref = lab.on("head", "cat /etc/dsv41-lab/engine-vllm.ref").stdout.strip()
    repo = "198.51.100.11:5000/lab/vllm-never-ready"
    script = (f"set -e; cid=$(docker create {ref}); trap 'docker rm -f $cid >/dev/null' EXIT; "
              "docker cp $cid:/opt/vllm/bin/vllm /tmp/vllm.real; docker cp /tmp/vllm.real $cid:/opt/vllm/bin/vllm.real; "
              "printf '#!/bin/sh\\nexec /opt/vllm/bin/vllm.real \"$@\" --port 8009\\n' > /tmp/vllm.shim; "
              "chmod +x /tmp/vllm.shim; docker cp /tmp/vllm.shim $cid:/opt/vllm/bin/vllm; "
              f"docker commit $cid {repo}:1 >/dev/null; docker push {repo}:1 >/dev/null; "
              f"docker image inspect --format '{{{{index .RepoDigests 0}}}}' {repo}:1")
    return lab.on("head", script, timeout=600).stdout.strip().splitlines()[-1]


def rolled_back(lab, vllm, env, what):
    """A launch with `env` that fails, rolls back and serves again: its exit, line and time to the first token
    on the release before it, against that release's start-up."""
    before = lab.doit("releases", vllm.env).stdout
    serving = int(re.search(r"^\* +(\d+) ", before, re.M).group(1))
    startup = re.search(rf"^\* +{serving} .*?(\d+(?:\.\d+)?) (s|min)  ", before, re.M)
    t0 = time.monotonic()
    r = lab.doit("launch", {**vllm.env, **env}, check=False, timeout=1800)
    assert r.returncode == 10, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"rolled back to release {serving}, serving again" in r.stderr
    code, _ = api(lab, "/v1/completions", vllm.key, {"model": "deepseek-v4.1-flash", "prompt": "Hi", "max_tokens": 1})
    took = time.monotonic() - t0
    assert code == 200
    assert json.loads(lab.doit("status --json", vllm.env).stdout)["release"]["serving"]["number"] == serving
    shown = f"{startup.group(1)} {startup.group(2)}" if startup else "?"
    print(f"real engine: {what}: first token on release {serving} again {took:.0f} s after the launch began "
          f"(release {serving}'s start-up: {shown})")
    return r


def test_an_engine_flag_vllm_rejects_rolls_back_to_the_release_before(lab, vllm):
    lab.doit("launch", vllm.env, timeout=1800)
    r = rolled_back(lab, vllm, {"EXTRA": "--no-such-flag"}, "a flag vLLM rejects")
    assert "dsv41-r0.service" in r.stdout + r.stderr and "--no-such-flag" not in \
        lab.on("head", "cat /etc/systemd/system/dsv41-r0.service").stdout


@pytest.mark.soak           # per landing: the stand-in's release that never becomes ready (test_lab_rollout.py)
def test_an_image_that_starts_and_never_serves_rolls_back_at_its_deadline(lab, vllm):
    """The deadline at half a minute (START_TIMEOUT_MIN and ROLLOUT_MIN_TIMEOUT_MIN for this launch), not
    twice a start-up: what is proven is that the deadline ends the wait and the way back serves."""
    ref = never_ready_image(lab)
    r = rolled_back(lab, vllm, {"IMG": ref, "START_TIMEOUT_MIN": "0.5", "ROLLOUT_MIN_TIMEOUT_MIN": "0.5"},
                    "an image that never serves")
    assert "did not become ready within 0.5 min (the rollout deadline" in r.stdout + r.stderr
    assert ref not in lab.on("head", "cat /etc/systemd/system/dsv41-r0.service").stdout


def test_the_memory_guard_trips_on_the_engines_allocation_and_stops_both_ranks(lab, vllm):
    lab.doit("stop", vllm.env)
    avail = int(lab.on("head", "awk '/MemAvailable/ {print $2}' /proc/meminfo").stdout) / 2**20
    floor = f"{avail - 2:.2f}"          # two starting ranks take about 6 GiB (the lab nodes share the host's memory)
    r = lab.doit("launch", {**vllm.env, "MEMGUARD_GIB": floor}, check=False, timeout=1800)
    assert r.returncode != 0
    deadline = time.monotonic() + 90
    while any(lab.on(n, "docker ps -q --filter name=dsv41-r").stdout.strip() for n in ("head", "worker1")):
        assert time.monotonic() < deadline, "a rank container still runs after the trip"
        time.sleep(2)
    tripped = [n for n in ("head", "worker1") if lab.on(n, f"test -e {STATE}/memguard.tripped", check=False).returncode == 0]
    assert tripped
    trip = json.loads(lab.on(tripped[0], f"cat {STATE}/memguard.tripped").stdout)
    assert trip["mem_available_bytes"] < trip["floor_bytes"] and trip["killed"]
    r = lab.doit("status", vllm.env, check=False)
    assert r.returncode == 5 and "TRIPPED" in r.stdout
    lab.doit("clear-trip", vllm.env)
    assert "TRIPPED" not in lab.doit("status", vllm.env, check=False).stdout
    # the ranks stay stopped: the next test's `watched` launch starts both from stopped (one start-up saved)


def test_a_launch_killed_while_the_real_engine_starts_is_finished_by_the_watchdog(lab, vllm):
    """The memory guard's trip left both ranks stopped: the launch that turns the watchdog on (a release of
    its own) is killed with SIGKILL while they start. With nobody touching anything the watchdog carries it
    on: the ranks it started serve within what was left of the rollout deadline and hold, the release is
    good, and the next test's launch finds nothing to change (the start-up shared)."""
    env = {**vllm.env, **WATCHED}
    t0 = time.monotonic()
    out = lab.doit_killed("launch", env, "started dsv41-r1", timeout=600)
    number = int(re.search(r"^release (\d+): ", out, re.M).group(1))

    def finished():
        report = json.loads(lab.doit("status --json", env, check=False).stdout)
        return report["release"]["rolling_out"] is None and report
    report = labctl.wait_for(f"release {number} carried on by the watchdog", finished, timeout=900, every=3)
    took = time.monotonic() - t0
    assert report["state"] == "READY" and report["release"]["serving"]["number"] == number, report["release"]
    assert report["watchdog"]["unit"] == "active"
    assert api(lab, "/v1/completions", vllm.key, {"model": "deepseek-v4.1-flash", "prompt": "Hi", "max_tokens": 1})[0] == 200
    print(f"real engine: a launch killed while the ranks started: release {number} good and serving {took:.0f} s "
          "after it began")


# The watchdog's short settings for these tests (the defaults are measured by the chaos soak: docs/faults.md).
# A step of the tiny model takes milliseconds and a chunked prefill's longest flat stretch is about 3 s
# (test_a_long_chunked_prefill_is_progress_though_no_token_total_moves), so 15 s of no progress is a hang.
# The watchdog's look, stall and probe at their defaults (the hang bound is the defaults' promise); only its
# budget and backoff are loosened, so that one test's recoveries never hold up the next's
WATCHED = {"WATCHDOG": "1", "WATCHDOG_BACKOFF_S": "5", "WATCHDOG_MAX_RECOVERIES": "10", "SSH_TIMEOUT_S": "5"}
DEFAULTS = {s.name: s.default for s in schema.OWN if s.name in ("WATCHDOG_INTERVAL_S", "WATCHDOG_STALL_S",
                                                                  "WATCHDOG_PROBE_S")}
HANG_BOUND_S = 90                     # a hang under load, seen at the defaults (70 s after the last progress)
DOWN_BOUND_S = 2 * DEFAULTS["WATCHDOG_INTERVAL_S"] + 5      # two intervals + the /health timeout
SLACK_S = 10                          # a probe round trip and an ssh look on 2 busy cores


@pytest.fixture
def watched(lab, vllm):
    """The real engine launched with the watchdog on at short settings and no incidents yet."""
    env = {**vllm.env, **WATCHED}
    lab.on("head", f"rm -rf {STATE}/incidents.jsonl {STATE}/incidents {STATE}/watchdog.gaveup")
    t0 = time.monotonic()
    r = lab.doit("launch", env, timeout=1800)
    if "ranks (re)started" in r.stdout:        # after the memory guard's trip: both ranks from stopped
        print(f"real engine: launch from stopped took {time.monotonic() - t0:.0f} s (from nothing: {vllm.launch_s:.0f} s)")
    assert json.loads(lab.doit("status --json", env).stdout)["state"] == "READY"
    return env


def incidents_since(lab, t0):
    return [i for i in lab.incidents(STATE) if i["started"] >= t0]


def recovered(lab, t0, what, timeout=900):
    """The first recovery after t0 that ended READY (the lab's nodes share this machine's clock)."""
    deadline = time.monotonic() + timeout
    while True:
        done = [i for i in incidents_since(lab, t0) if i["result"] == "READY"]
        if done:
            inc = done[0]
            print(f"real engine, {what}: {inc['verdict']} seen after {inc['started'] - t0:.0f} s, serving again "
                  f"after {inc['ended'] - t0:.0f} s (the watchdog's defaults: "
                  f"{', '.join(f'{k} {v}' for k, v in DEFAULTS.items())})")
            return inc
        assert time.monotonic() < deadline, incidents_since(lab, t0)
        time.sleep(3)


def stopped_until_recovered(lab, node, process, what, seen=None):
    """SIGSTOP the node's process whose command line starts with `process`, until the first recovery after
    it ended READY (then SIGCONT, in case it was not replaced) -> (pid, when it was stopped, the incident).
    seen(): called once the watchdog opened the incident (a load that only the detection needs ends)."""
    pid = lab.on(node, f"pgrep -f '^{process}'").stdout.split()[0]
    t0 = time.time()
    lab.on(node, f"kill -STOP {pid}")
    try:
        if seen:
            labctl.wait_for("the incident", lambda: incidents_since(lab, t0), timeout=300, every=1)
            seen()
        return pid, t0, recovered(lab, t0, what)
    finally:
        lab.on(node, f"kill -CONT {pid}", check=False)


LOAD = ("while :; do curl -sS -o /dev/null -m 300 http://127.0.0.1:8000/v1/completions -H 'Content-Type: "
        "application/json' -H \"Authorization: Bearer $(cat {key_file})\" -d '{{\"model\": \"deepseek-v4.1-flash\", "
        "\"prompt\": \"Count to a thousand:\", \"max_tokens\": {tokens}, \"ignore_eos\": true}}'; done")


@contextlib.contextmanager
def under_load(lab, clients=3, tokens=300):
    """clients loops on the head, each asking `tokens` tokens at a time (by default the lab's MAX_SEQS 2: two
    run, one waits), until the block ends."""
    loops = [lab.popen("head", ["bash", "-c", LOAD.format(key_file=f"{STATE}/api_key", tokens=tokens)])
             for _ in range(clients)]
    time.sleep(8)                                               # tokens flowing, one request waiting

    def end():                                                  # -> the block's value: ends the load early
        for p in loops:
            p.kill()
        lab.on("head", "pkill -f 'curl -sS -o /dev/null -m 300'", check=False)
    try:
        yield end
    finally:
        end()


def engine_core_stopped_under_load(lab, vllm, clients=3, tokens=300):
    """Rank 0's EngineCore stopped (SIGSTOP) under `clients` clients' load, until the watchdog recovered ->
    (its pid, when it was stopped, the incident)."""
    with under_load(lab, clients, tokens) as unload:        # the detection under load; the restart without
        return stopped_until_recovered(lab, "head", "VLLM::EngineCore", "EngineCore stopped under load", unload)


def serves(lab, vllm, env):
    assert json.loads(lab.doit("status --json", env).stdout)["state"] == "READY"
    assert api(lab, "/v1/completions", vllm.key, {"model": "deepseek-v4.1-flash", "prompt": "Hi",
                                                  "max_tokens": 2})[0] == 200


@pytest.mark.soak           # per landing: a real-engine group's rank killed under load (below), the stand-in's
def test_the_watchdog_repairs_a_killed_worker_of_the_real_engine(lab, vllm, watched):
    """...and a client at the door (the openai SDK, no retries) is answered all along: 200, or 503 with
    Retry-After while the engine restarts; never a refused connection."""
    client = DoorClient(lab, vllm.key)
    try:
        t0 = time.time()
        lab.on("worker1", "docker kill dsv41-r1")
        inc = recovered(lab, t0, "worker rank killed")
    finally:
        answers = client.end()["answers"]
    print(f"real engine, worker rank killed: the door's answers {answers}")
    assert inc["verdict"] in ("DEGRADED", "DEAD") and inc["started"] - t0 <= DOWN_BOUND_S + SLACK_S
    assert only_503s(answers) and answers.get("200") and len(answers) > 1, answers
    serves(lab, vllm, watched)


def test_the_watchdog_repairs_a_stopped_engine_core_under_load_and_keeps_its_stack(lab, vllm, watched):
    """Rank 0's EngineCore stopped (SIGSTOP) under three clients' load: /health answers, the requests count
    as running and waiting, no progress signal moves and no token comes back. WEDGED within 90 s at the
    watchdog's defaults (its probe reports the stopped process at two looks in a row); the
    incident folder is saved before the restart, with the stopped process's stack (a vllm frame) and no
    key; `doit incidents` shows the outage from the fault, not from its detection."""
    pid, t0, inc = engine_core_stopped_under_load(lab, vllm)
    assert inc["verdict"] == "WEDGED" and inc["started"] - t0 <= HANG_BOUND_S, inc
    assert "no progress signal moved" in inc["evidence"]
    assert abs(inc["fault_at"] - t0) <= 10                      # the last progress seen, not the detection
    folder = f"{STATE}/incidents/{inc['folder']}" if inc.get("folder") else None
    assert folder and re.search(r"vllm/v1/engine/core\.py:\d+",
                                lab.on("head", f"cat {folder}/head/pyspy-{pid}.txt").stdout)
    assert lab.on("head", f"grep -rlF -e {vllm.key} {STATE}/incidents", check=False).stdout == ""
    listed = lab.doit("incidents", watched).stdout.splitlines()
    assert "WEDGED" in listed[1] and "READY" in listed[1], listed
    shown = lab.doit("incidents show 1", watched).stdout
    print(f"real engine: `doit incidents show 1` of that recovery:\n{shown}")
    assert re.search(r"^ +weights loaded +\d+:\d\d$", shown, re.M) and re.search(r"^ +start-up +\d+:\d\d ", shown, re.M)
    serves(lab, vllm, watched)


@pytest.mark.soak           # the false-restart cases: long work that outlasts the hang bound, at the defaults
def test_long_work_that_outlasts_the_hang_bound_is_never_restarted_at_the_watchdogs_defaults(lab, vllm, watched):
    """With the watchdog at its defaults, each of these runs longer than the hang bound (90 s) and none is an
    incident: the longest prefill the lab's context allows (about 7400 tokens) alone in chunks of BATCH 16;
    one stream of many tokens; and a request queued behind two long streams (MAX_SEQS 2)."""
    env = {**watched, "BATCH": "16"}
    lab.doit("launch", env, timeout=1800)
    t0 = time.time()
    r = lab.on("head", f"/opt/dsv41-venv/bin/python {lab.repo}/bench/prefill_signals.py --words 7000 "
               f"--metrics-url http://127.0.0.1:18000/metrics", timeout=900)
    prefill = json.loads(r.stdout.splitlines()[-1])
    probe = DoorClient(lab, vllm.key)
    probe.stream(32, exact=True)
    [timed] = probe.end()["streams"]
    per_token = (timed["ended"] - timed["started"]) / 32
    n = int(1.3 * HANG_BOUND_S / per_token)              # a stream of 1.3 bounds
    one = DoorClient(lab, vllm.key)
    one.stream(n, exact=True)
    [stream] = one.end()["streams"]
    long = DoorClient(lab, vllm.key)                     # two long streams fill MAX_SEQS, a third request waits
    for _ in range(2):
        long.stream(n, exact=True)
    waited = lab.on("head", ["curl", "-sS", "-o", "/dev/null", "-m", "600", "-w", "%{http_code} %{time_total}",
                             "http://127.0.0.1:8000/v1/completions", "-H", f"Authorization: Bearer {vllm.key}",
                             "-H", "Content-Type: application/json", "-d", json.dumps(
                                 {"model": "deepseek-v4.1-flash", "prompt": "Hi", "max_tokens": 8})], timeout=700)
    code, queued_s = waited.stdout.split()
    streams = long.end()["streams"]
    print(f"real engine at the watchdog's defaults: a {prefill['prompt_tokens']}-token prefill in BATCH 16 took "
          f"{prefill['took_s']:.0f} s; a {n}-token stream {stream['ended'] - stream['started']:.0f} s; a request queued "
          f"behind two such streams answered {code} after {float(queued_s):.0f} s; incidents: {incidents_since(lab, t0)}")
    assert incidents_since(lab, t0) == []
    assert prefill["took_s"] > HANG_BOUND_S and stream["whole"] and stream["ended"] - stream["started"] > HANG_BOUND_S
    assert all(s["whole"] for s in streams) and code == "200" and float(queued_s) > HANG_BOUND_S, (streams, waited.stdout)
    lab.doit("launch", watched, timeout=1800)          # the other tests' settings again


# E-mail at the alert defaults (scrape 15 s, ALERT_FOR_S 60 s, group wait 30 s, group interval 120 s): an SMTP
# server (aiosmtpd, a host process in the head's network namespace) on the head's 127.0.0.1:2525 writes a
# maildir. The decode threshold is the lab CPU engine's pace, not a Spark's.
SMTP_PORT = 2525
MAIL = {"METRICS_DIR": "/var/lib/dsv41/metrics", "ALERT_EMAIL_TO": "oncall@example.org",
        "ALERT_EMAIL_FROM": "dsv41@example.org", "ALERT_SMTP_SMARTHOST": f"127.0.0.1:{SMTP_PORT}",
        "ALERT_SMTP_REQUIRE_TLS": "0", "ALERT_DECODE_TOKS_MIN": "1"}
GROUP_INTERVAL_S = 120


@pytest.mark.soak           # Alertmanager's default timings take minutes; per landing: test_alerts.py's short incident
@pytest.mark.parametrize("clients,tokens", [(1, 16), (3, 300)], ids=["light load", "heavy load"])
def test_a_stopped_engine_core_mails_one_firing_naming_the_incident_and_one_resolve(lab, vllm, watched, tmp_path,
                                                                                  clients, tokens):
    """Rank 0's EngineCore stopped under a light load (one short request at a time: the engine is often idle,
    so its probe waits out WATCHDOG_PROBE_S) and a heavy one, the watchdog and e-mail at their defaults: the
    decode and TTFT alerts wait for the watchdog's verdict and stay quiet after the recovery, so the incident
    is one firing mail naming it and one resolve, and nothing more a group interval later."""
    import mailbox
    from test_lab_monitoring import api as prometheus
    env = {**watched, **MAIL}
    maildir = tmp_path / "mail"
    smtp = subprocess.Popen(["ip", "netns", "exec", "head", sys.executable, "-m", "aiosmtpd", "-n", "-l",
                             f"127.0.0.1:{SMTP_PORT}", "-c", "aiosmtpd.handlers.Mailbox", str(maildir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        lab.doit("launch", env, timeout=1800)
        lab.doit("monitoring --install", env)
        labctl.wait_for("every target scraped", lambda: all(
            t["health"] == "up" for t in prometheus(lab, "/api/v1/targets")["activeTargets"]), 120)

        def mails():
            return [(m["Subject"], " ".join(p.get_payload(decode=True).decode() for p in m.walk()
                                            if p.get_content_type() == "text/plain"))
                    for m in mailbox.Maildir(maildir, create=False)] if (maildir / "new").exists() else []
        assert mails() == []
        _, t0, inc = engine_core_stopped_under_load(lab, vllm, clients, tokens)
        resolved = labctl.wait_for("the resolved mail", lambda: [m for m in mails() if m[0].startswith("[RESOLVED]")],
                                   timeout=GROUP_INTERVAL_S + 300, every=5)
        resolved_s = time.time() - t0
        time.sleep(GROUP_INTERVAL_S + 15)                        # nothing more
        got = sorted(mails(), key=lambda m: not m[0].startswith("[FIRING]"))
        print(f"real engine, {clients} client(s) of {tokens} tokens: a stopped EngineCore mailed {[m[0] for m in got]}; "
              f"the resolve {resolved_s:.0f} s "
              f"after the fault (recovered after {inc['ended'] - t0:.0f} s)")
        assert [m[0].split("]")[0] + "]" for m in got] == ["[FIRING]", "[RESOLVED]"], got
        assert f"incident {inc['id']}: WEDGED on " in got[0][0] and "DecodeSlow" not in got[0][0] + resolved[0][0]
        assert all(f"incident={inc['id']}" in body for _, body in got), got
    finally:
        smtp.terminate()
        lab.on("head", "systemctl disable --now dsv41-prometheus dsv41-alertmanager", check=False)
        lab.doit("launch", watched, timeout=1800)


def test_the_watchdog_repairs_a_stopped_worker_process_under_load_naming_the_worker(lab, vllm, watched):
    """The worker's VLLM::Worker_TP1 stopped under three clients' load: rank 0's step never ends, its /metrics
    stand still and /health answers. WEDGED on worker1 (its probe reports the stopped process) within 90 s
    at the watchdog's defaults, serving again by itself."""
    with under_load(lab) as unload:
        pid, t0, inc = stopped_until_recovered(lab, "worker1", "VLLM::Worker_TP", "Worker_TP1 stopped under load",
                                               unload)
    assert inc["verdict"] == "WEDGED" and inc["started"] - t0 <= HANG_BOUND_S, inc
    assert inc["node"] == "worker1" and f"(pid {pid}) on worker1 is stopped" in inc["evidence"], inc
    serves(lab, vllm, watched)


@pytest.mark.soak           # per landing: the stopped processes above, which the nodes' probes name at once
def test_a_worker_cut_off_from_the_head_under_load_is_wedged_by_the_stall_and_the_probe_within_90_s(lab, vllm,
                                                                                                   watched):
    """A hang that no process state shows: every TCP packet from the head to the worker dropped (ssh let
    through), under three clients' load. The ranks' processes sleep in their sockets, none is stopped,
    /health answers and nothing moves: WEDGED by the stall and the probe within 90 s at the defaults. The
    rule goes once the incident opened, so the restart finds the fabric whole."""
    rule = "INPUT -s 198.51.100.11 -p tcp ! --dport 22 -j DROP"
    with under_load(lab):
        t0 = time.time()
        lab.on("worker1", f"iptables -I {rule}")
        try:
            labctl.wait_for("the incident", lambda: incidents_since(lab, t0), timeout=300, every=2)
        finally:
            lab.on("worker1", f"iptables -D {rule}", check=False)
        inc = recovered(lab, t0, "worker cut off from the head under load")
    assert inc["verdict"] == "WEDGED" and inc["started"] - t0 <= HANG_BOUND_S, inc
    assert "the probe got no token" in inc["evidence"] and "is stopped" not in inc["evidence"], inc
    serves(lab, vllm, watched)


def test_the_watchdog_repairs_a_stopped_api_server_without_the_stop_grace(lab, vllm, watched):
    """The API server (rank 0's main process) stopped: /health does not answer; DEAD after two intervals;
    its container is killed rather than given the 30 s stop grace it would never use."""
    init = lab.on("head", "docker inspect -f '{{.State.Pid}}' dsv41-r0").stdout.strip()
    pid = lab.on("head", f"pgrep -P {init}").stdout.split()[0]
    t0 = time.time()
    lab.on("head", f"kill -STOP {pid}")
    inc = recovered(lab, t0, "API server stopped")
    assert inc["verdict"] == "DEAD" and inc["started"] - t0 <= DOWN_BOUND_S + SLACK_S, inc
    # no stop grace waited out: rank 0's unit starts again within 30 s of the incident (a start-up's own
    # length depends on the CPU, so it is not what is bounded)
    line = lab.on("head", f"journalctl -u dsv41-r0 -o short-unix --no-pager --since=@{int(inc['started'])} "
                          "| grep -m1 ' Started dsv41-r0'", check=False).stdout
    assert line and float(line.split()[0]) - inc["started"] < 30, (line, inc)
    serves(lab, vllm, watched)


@pytest.mark.soak           # per landing: test_faults.py's killed guard, the chaos soak's kill-guard
def test_a_killed_memory_guard_comes_back_and_the_ranks_never_notice(lab, vllm, watched):
    pid = lab.units("worker1", ["dsv41-memguard.service"], ("MainPID",))["dsv41-memguard.service"]["MainPID"]
    before = rank_start_of(lab)
    t0 = time.time()
    lab.on("worker1", f"kill -9 {pid}")
    deadline = time.monotonic() + 60
    while guard(lab) in ((pid, "active"),) or guard(lab)[1] != "active":
        assert time.monotonic() < deadline, "the memory guard did not come back"
        time.sleep(2)
    time.sleep(3 * 5)                                            # three watchdog intervals
    assert incidents_since(lab, t0) == [] and rank_start_of(lab) == before
    serves(lab, vllm, watched)


@pytest.mark.soak           # per landing: the chaos soak's stop-sshd on the stand-in
def test_a_frozen_worker_sshd_is_never_acted_on_and_status_names_the_node(lab, vllm, watched):
    """Every sshd of the worker stopped: the ranks still serve, the watchdog cannot refresh the worker's facts
    and so does nothing (UNKNOWN), and status names the node it cannot see."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from chaos.faults import sshd_pids
    pids = sshd_pids("worker1")
    before = rank_start_of(lab)
    t0 = time.time()
    subprocess.run(["kill", "-STOP", *pids], check=True)
    try:
        assert api(lab, "/v1/completions", vllm.key, {"model": "deepseek-v4.1-flash", "prompt": "Hi",
                                                      "max_tokens": 2})[0] == 200
        r = lab.doit("status", watched, check=False)
        assert r.returncode != 0 and "worker1" in r.stdout + r.stderr, r.stdout
        def unknown():
            seen = json.loads(lab.on("head", f"cat {STATE}/watchdog.status.json").stdout)
            return seen["verdict"] == "UNKNOWN" and "worker1" in seen["evidence"] and seen
        labctl.wait_for("the watchdog's UNKNOWN naming worker1", unknown, timeout=60)
        time.sleep(3 * 5)                                        # three intervals more: still nothing done
    finally:
        subprocess.run(["kill", "-CONT", *pids], check=False)
    assert incidents_since(lab, t0) == [] and rank_start_of(lab) == before
    serves(lab, vllm, watched)


def rank_start_of(lab):
    return {n: lab.units(n, [f"dsv41-r{r}.service"])[f"dsv41-r{r}.service"]["ActiveEnterTimestamp"]
            for n, r in (("head", 0), ("worker1", 1))}


def guard(lab):
    """(MainPID, ActiveState) of the worker's memory guard."""
    p = lab.units("worker1", ["dsv41-memguard.service"], ("MainPID", "ActiveState"))["dsv41-memguard.service"]
    return p["MainPID"], p["ActiveState"]


@pytest.mark.soak
def test_a_stream_still_running_when_the_doors_drain_ends_finishes_inside_vllm(lab, vllm):
    """vLLM's own drain after the door's: with DRAIN_S=8, rank 0 runs with --shutdown-timeout 8 (this vLLM takes
    it), and a stream of about 12 s begun before `doit stop` outlasts the door's 8 s wait and still ends whole
    inside vLLM's; without it the stream would be cut when the door's wait ends."""
    env = {**vllm.env, "DRAIN_S": "8"}
    lab.doit("launch", env, timeout=1800)
    assert '"--shutdown-timeout","8"' in lab.on("head", "docker inspect --format '{{json .Args}}' dsv41-r0").stdout
    probe = DoorClient(lab, vllm.key)
    probe.stream(64, exact=True)
    [timed] = probe.end()["streams"]
    per_token = (timed["ended"] - timed["started"]) / 64
    client = DoorClient(lab, vllm.key)
    client.stream(int(12 / per_token), exact=True)
    t0 = time.monotonic()
    lab.doit("stop", env)
    stop_s = time.monotonic() - t0
    [s] = client.end()["streams"]
    took = s["ended"] - s["started"]
    print(f"real engine: a {took:.1f} s stream ({s['chunks']} chunks, {per_token * 1000:.0f} ms a token) across "
          f"`doit stop` with DRAIN_S=8: whole {s['whole']}; the stop took {stop_s:.0f} s")
    assert s["whole"] and took > 9, s                    # past the door's wait (begun 1 s before the stop)
    lab.doit("launch", vllm.env, timeout=1800)          # the other tests' settings again


def test_stop_leaves_nothing_running(lab, vllm, watched):
    """Last, with the watchdog on: `doit stop` stops it first, and nothing comes back."""
    lab.doit("stop", watched)
    time.sleep(2 * 5)                                            # two watchdog intervals
    for node, rank in (("head", 0), ("worker1", 1)):
        assert lab.on(node, "docker ps -aq --filter name=dsv41-").stdout.strip() == ""
        units = [f"dsv41-r{rank}.service", "dsv41-memguard.service"] + (["dsv41-watchdog.service"] if rank == 0 else [])
        states = lab.units(node, units)
        assert all(p["ActiveState"] != "active" for p in states.values()), states
    assert ":18000 " not in lab.on("head", "ss -ltn").stdout          # the engine's port
    assert api(lab, "/v1/models", vllm.key)[0] == 503                # the door stays: "stopped by `doit stop`"
    r = lab.doit("status", vllm.env, check=False)
    assert r.returncode == 3 and "door closed: stopped by `doit stop`" in r.stdout, r.stdout
    lab.doit("stop --free-port", watched)
    assert ":8000 " not in lab.on("head", "ss -ltn").stdout



def test_two_one_node_groups_of_the_real_engine_lose_no_request_to_a_killed_rank(lab, vllm):
    """After the stop: GROUPS=2 on the two nodes, each a one-node engine of its own (rank 0 on the head, bound to
    core 0; rank 0 of group 1 on worker1 behind its side door, core 1: the profile binds by the node's rank).
    Under a steady load of short requests from clients that never retry, group 1's rank killed costs no request
    begun after it and refuses no connection, and its watchdog brings group 1 back while group 0 serves. The load
    ends 20 s after group 1's watchdog opened its incident: on the lab's 2 cores a start-up beside a loaded
    engine starves (an engine's other processes share the cores its compute threads are bound to)."""
    env = {**vllm.env, **WATCHED, "GROUPS": "2"}
    t0 = time.monotonic()
    lab.doit("launch", env, timeout=1800)
    print(f"real engine, two one-node groups: launch from stopped took {time.monotonic() - t0:.0f} s")
    doc = json.loads(lab.doit("status --json", env).stdout)
    assert [(g["state"], g["at_door"].split()[0]) for g in doc["groups"]] == [("READY", "UP")] * 2, doc["groups"]
    unit = lab.on("worker1", "cat /etc/systemd/system/dsv41-r1.service").stdout
    assert "--nnodes 1" in unit and "--host 127.0.0.1" in unit and "VLLM_CPU_OMP_THREADS_BIND=1" in unit
    head_rank = lab.on("head", "systemctl show -p ActiveEnterTimestampMonotonic --value dsv41-r0").stdout
    load = labctl.DoorLoad(lab, "deepseek-v4.1-flash", clients=2)
    time.sleep(8)
    load.mark()
    t_kill = time.time()
    lab.on("worker1", "docker kill dsv41-r1")
    labctl.wait_for("group 1's incident", lambda: lab.incidents(f"{STATE}/groups/g1"), timeout=120)
    time.sleep(20)
    out = load.end()
    print(f"real engine, group 1's rank killed under load: {out['requests']} requests, {out['after']} begun after "
          f"the kill, {out['failed_after']} of them failed, {out['refused']} refused: {out['codes']}")
    assert out["failed_after"] == 0 and out["refused"] == 0 and out["after"] > 10, out

    def healed():
        closed = [i for i in lab.incidents(f"{STATE}/groups/g1") if i["result"] == "READY"]
        groups = json.loads(lab.doit("status --json", env, check=False).stdout).get("groups") or []
        return closed and [g["at_door"].split()[0] for g in groups] == ["UP", "UP"]
    labctl.wait_for("group 1 recovered and back at the door", healed, timeout=600, every=3)
    print(f"real engine: group 1 served again {time.time() - t_kill:.0f} s after its rank was killed")
    assert lab.on("head", "systemctl show -p ActiveEnterTimestampMonotonic --value dsv41-r0").stdout == head_rank
    assert all(i["started"] < t_kill for i in lab.incidents(STATE))      # the whole's watchdog acted on nothing


@pytest.mark.soak           # per landing: the same two rollouts on the four-node stand-in (test_groups_lab.py)
def test_a_change_rolls_across_two_real_engine_groups_with_streams_in_flight_and_a_rejected_one_goes_back_alone(
        lab, vllm):
    """GROUPS=2 on the real engine (two one-node groups), one client of short requests 1 s apart that never
    retries and a stream begun every 20 s: a change of the KV cache's size rolls over group 0 then group 1, and
    every request and stream begun meanwhile ends whole; a change the engine rejects (a flag vLLM does not know)
    stops at group 0, which goes back alone while group 1's rank is never restarted, again losing
    nothing. The load is light and the rollout's floor 10 minutes: on the lab's 2 cores a start-up beside an
    engine kept busy starves (docs/faults.md), which a Spark's own cores do not share."""
    import threading
    env = {**vllm.env, **WATCHED, "GROUPS": "2", "ROLLOUT_MIN_TIMEOUT_MIN": "10"}
    lab.doit("launch", env, timeout=1800)

    def under_load(change, check):
        started = {n: lab.on(n, f"systemctl show -p ActiveEnterTimestampMonotonic --value dsv41-r{i}").stdout
                   for i, n in enumerate(("head", "worker1"))}
        load, streams, done = labctl.DoorLoad(lab, "deepseek-v4.1-flash", clients=1, pause_s=1), \
            DoorClient(lab, vllm.key), threading.Event()

        def keep_streaming():
            while not done.wait(20):
                streams.stream(120, exact=True)
        streaming = threading.Thread(target=keep_streaming, daemon=True)
        streams.stream(120, exact=True)
        streaming.start()
        load.mark()
        t0 = time.monotonic()
        r = lab.doit("launch", {**env, **change}, check=check, timeout=2400)
        took = time.monotonic() - t0
        done.set()
        streaming.join(timeout=120)
        out, ended = load.end(), streams.end()
        cut = [s for s in ended["streams"] if not s["whole"]]
        after = {n: lab.on(n, f"systemctl show -p ActiveEnterTimestampMonotonic --value dsv41-r{i}").stdout
                 for i, n in enumerate(("head", "worker1"))}
        print(f"real engine, {change}: the launch took {took:.0f} s (exit {r.returncode}); {out['after']} requests "
              f"begun after it, {out['failed_after']} failed, {out['refused']} refused; {len(ended['streams'])} "
              f"streams, {len(cut)} cut")
        assert out["failed_after"] == 0 and out["refused"] == 0 and out["after"] > 5, out
        assert not cut and len(ended["streams"]) >= 3, ended["streams"]
        return r, started, after

    r, before, after = under_load({"KV_BYTES": "1000000000"}, check=True)
    assert r.stdout.index("(re)starting the ranks of group 0") < r.stdout.index("(re)starting the ranks of group 1")
    assert all(after[n] != before[n] for n in before), (before, after)
    for i, n in enumerate(("head", "worker1")):
        assert "--kv-cache-memory-bytes 1000000000" in lab.on(n, f"cat /etc/systemd/system/dsv41-r{i}.service").stdout
    r, before, after = under_load({"KV_BYTES": "1000000000", "EXTRA": "--no-such-flag"}, check=False)
    assert r.returncode == 10 and "rolled back to release" in r.stdout + r.stderr, r.stdout[-3000:] + r.stderr
    assert after["worker1"] == before["worker1"] and after["head"] != before["head"]
    lab.doit("launch", vllm.env, timeout=1800)                 # one group again, as the other tests run
