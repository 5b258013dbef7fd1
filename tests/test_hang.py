"""head/core/hang.py: the progress tracker over /metrics snapshots (tables, the recorded real /metrics, and the
stand-in engine during a chunked prefill and with its worker stopped), the recovery backoff under a fake
clock, and the memory-return rule."""
import signal
import threading
import time

import pytest

from dsv41.client import metrics
from dsv41.head.core import hang
from dsv41.vllm.recipe import Vllm
from test_standin_engine import KEY, NAME, REAL_METRICS, Reader, ranks, token_text  # noqa: F401 (fixture)

GIB = 1 << 30
E0 = (("engine", "0"), ("model_name", NAME))


def snap(t, running=1, waiting=0, steps=0, prompt=0, gen=0, kv=0.0, preempt=0, queries=0, done=0, engines=1):
    vals = {"vllm:num_requests_running": running, "vllm:num_requests_waiting": waiting,
            "vllm:iteration_tokens_total_count": steps, "vllm:prompt_tokens_total": prompt,
            "vllm:generation_tokens_total": gen, "vllm:kv_cache_usage_perc": kv,
            "vllm:num_preemptions_total": preempt, "vllm:prefix_cache_queries_total": queries,
            "vllm:request_success_total": done}
    s = metrics.Snapshot(t)
    for name, v in vals.items():
        s.samples[name] = {E0: float(v)}
        if engines == 2:
            s.samples[name][(("engine", "1"), ("model_name", NAME))] = 0.0
    return s


def test_every_series_it_watches_is_in_real_vllm_metrics():
    real = metrics.parse(REAL_METRICS.read_text())
    missing = [n for n in Vllm.progress_metrics + Vllm.work_metrics if n not in real.samples]
    assert missing == []


# (snapshots as keyword changes at 15 s intervals, flat seconds expected after each)
CASES = {
    "idle for long is never flat": ([dict(running=0)] * 5, [0, 0, 0, 0, 0]),
    "decoding": ([dict(gen=g) for g in (0, 10, 20, 30)], [0, 0, 0, 0]),
    "steps with output move the step count": ([dict(steps=s) for s in (0, 4, 8, 12)], [0, 0, 0, 0]),
    "a chunked prefill moves only KV-cache use": ([dict(kv=k) for k in (0.0, 0.1, 0.2)], [0, 0, 0]),
    "stuck with a request running": ([dict(gen=5)] * 4 + [dict(gen=6), dict(gen=6)], [0, 15, 30, 45, 0, 15]),
    "stuck with requests only waiting": ([dict(running=0, waiting=2)] * 3, [0, 15, 30]),
    "work that arrives is timed from the last idle look": ([dict(running=0), dict(running=1), dict(running=1)],
                                                           [0, 15, 30]),
    "a preemption or a finished request is progress": ([dict(), dict(preempt=1), dict(preempt=1, done=1)], [0, 0, 0]),
}


@pytest.mark.parametrize("case", CASES)
def test_progress_tracker(case):
    changes, want = CASES[case]
    p = hang.Progress.for_recipe(Vllm)
    got = [p.update(snap(15.0 * i, **c)) for i, c in enumerate(changes)]
    assert got == want


def test_progress_names_what_moved_and_when_progress_was_last_seen():
    p = hang.Progress.for_recipe(Vllm)
    p.update(snap(0, steps=3, kv=0.1))
    p.update(snap(15, steps=3, kv=0.2))
    assert p.moved == ("vllm:kv_cache_usage_perc",) and p.last_progress == 15
    assert p.update(snap(30, steps=3, kv=0.2)) == 15 and p.moved == () and p.last_progress == 15


def test_a_second_engine_moving_is_progress():
    p = hang.Progress.for_recipe(Vllm)
    a = snap(0, engines=2)
    p.update(a)
    b = snap(15, engines=2)
    b.samples["vllm:generation_tokens_total"][(("engine", "1"), ("model_name", NAME))] = 7.0
    assert p.update(b) == 0 and p.moved == ("vllm:generation_tokens_total",)


def test_stand_in_prefill_is_progress_and_a_stopped_worker_is_not(ranks):
    """The tracker fed by the stand-in's real /metrics every 0.1 s: a 2000-token prompt prefilled in 100-token
    chunks (no token total moves for about a second) never looks flat for long; a stream whose worker is
    SIGSTOPped is flat from the stop on."""
    r = ranks(env={"LAB_ENGINE_TOKEN_S": "0.05"}, args=["--max-num-batched-tokens", "100"]).up()
    url = f"http://127.0.0.1:{r.port}/metrics"
    t = threading.Thread(target=r.request, args=("POST", "/v1/completions",
                                                 {"model": NAME, "prompt": "hello " * 2000, "max_tokens": 2}))
    p, flats, totals_still = hang.Progress.for_recipe(Vllm), [], 0
    t.start()
    while t.is_alive():
        s = metrics.scrape(url)
        flats.append(p.update(s))
        totals_still += s.value("vllm:prompt_tokens_total") == 0 and any(hang.work(s, Vllm.work_metrics))
        time.sleep(0.1)
    assert totals_still >= 5 and max(flats) < 0.5

    resp = r.stream("count to 60")
    reader = Reader(resp)
    assert token_text(reader.next_token(5))
    r.kill(1, signal.SIGSTOP)
    t0, flat = time.monotonic(), 0.0
    while time.monotonic() - t0 < 3:
        flat = p.update(metrics.scrape(url))
        time.sleep(0.1)
    r.kill(1, signal.SIGCONT)
    assert len(reader.rest(10)) > 1   # and it goes on
    resp.close()
    assert flat > 2.5


# ---- backoff --------------------------------------------------------------------------------------------

def test_backoff_doubles_from_the_second_recovery():
    assert [hang.backoff_wait(n, 30) for n in (1, 2, 3, 4, 5)] == [0, 30, 60, 120, 240]


GATES = [  # recoveries (started, ended), now, max -> action, n, wait left
    ([], 1000, 2, ("restart", 1, 0)),
    ([(900, 990)], 1000, 2, ("wait", 2, 20)),
    ([(900, 960)], 1000, 2, ("restart", 2, 0)),
    ([(900, 990), (1010, 1020)], 1030, 2, ("give up", 3, 0)),
    ([(900, 950), (960, 970)], 1000, 3, ("wait", 3, 30)),
    ([(-5000, -4990)], 1000, 2, ("restart", 1, 0)),               # outside the window: the count starts again
    ([(-5000, -4990), (900, 990)], 1000, 2, ("wait", 2, 20)),
]


@pytest.mark.parametrize("done,now,most,want", GATES)
def test_recovery_gate(done, now, most, want):
    g = hang.recovery_gate(now, done, window_s=3600, max_recoveries=most, backoff_s=30)
    assert (g.action, g.n, round(g.wait_s)) == want


def test_backoff_waits_while_the_loop_keeps_observing():
    """A fake clock runs an interval loop as the watchdog's: every 15 s it observes and publishes; the
    verdict asks for a recovery every time; a restart takes 20 s of the clock. The gate never blocks the
    loop: during each backoff the loop still looks every interval, and each restart starts at the first
    interval after its wait has passed."""
    clock, done, looks, published = 0.0, [], [], []
    while clock < 600:
        looks.append(clock)
        g = hang.recovery_gate(clock, done, window_s=3600, max_recoveries=4, backoff_s=30)
        published.append((clock, g.action))
        if g.action == "give up":
            break
        if g.action == "restart":
            done.append((clock, clock + 20))
            clock += 20
        clock += 15
    starts = [s for s, _ in done]
    assert starts == [0, 50, 130, 270]     # the previous ones ended at 20, 70, 150: waits of 30, 60, 120 s
    assert [e for e in published if e[1] == "give up"] == [(305, "give up")]
    waiting = [t for t, a in published if a == "wait"]
    assert waiting == [35, 85, 100, 115, 165, 180, 195, 210, 225, 240, 255]   # it looked every interval
    assert all(b - a <= 35 for a, b in zip(looks, looks[1:]))


# ---- memory return ----------------------------------------------------------------------------------------

MEM = [  # baselines, now (GiB), verdict, missing
    ({"head": 100, "worker1": 100}, {"head": 99, "worker1": 95}, "BACK", {}),
    ({"head": 100, "worker1": 100}, {"head": 99, "worker1": 88}, "SHORT", {"worker1": 12.0}),
    ({"head": 100, "worker1": 100}, {"head": 92, "worker1": 100}, "BACK", {}),           # exactly the margin
    ({"head": 100}, {"head": 99, "worker1": 10}, "BACK", {}),                             # no baseline: skipped
    ({"head": 100, "worker1": 100}, {"head": 99, "worker1": None}, "UNREAD", {}),
    ({"head": 100, "worker1": 100}, {"head": 80, "worker1": None}, "SHORT", {"head": 20.0}),
]


@pytest.mark.parametrize("base,now,verdict,missing", MEM)
def test_memory_returned(base, now, verdict, missing):
    gib = lambda d: {k: None if v is None else v * GIB for k, v in d.items()}
    c = hang.memory_returned(gib(base), gib(now), 8)
    assert c.verdict == verdict and c.missing_gib == missing
    for node, gap in missing.items():
        assert any(line.startswith(f"{node}:") and f"{gap:.1f} GiB below" in line for line in c.lines)
    assert len(c.warnings) == len([n for n in now if n not in base])


def test_memory_wait_ends_when_it_is_back_or_when_time_is_up():
    t = {"now": 0.0}
    clock, sleep = (lambda: t["now"]), (lambda s: t.__setitem__("now", t["now"] + s))
    base = {"head": 100 * GIB, "worker1": 100 * GIB}
    back_at = 31
    read = lambda: {"head": 100 * GIB, "worker1": (99 if t["now"] >= back_at else 50) * GIB}
    c = hang.wait_memory_back(read, base, return_gib=8, return_s=120, clock=clock, sleep=sleep)
    assert c.verdict == "BACK" and back_at <= t["now"] < back_at + 2.01
    t["now"], back_at = 0.0, 10_000
    c = hang.wait_memory_back(read, base, return_gib=8, return_s=120, clock=clock, sleep=sleep)
    assert c.verdict == "SHORT" and t["now"] == 120 and "worker1" in c.line() and "50.0 GiB below" in c.line()
