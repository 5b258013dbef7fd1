"""A start-up's phases: read from rank 0's journal as recorded on the lab's real engine (tests/records/startup),
unknown (never a wrong figure) where a line is missing or worded otherwise, kept in the release and incident
records (older records without them still load), shown by `doit releases show N`, `doit incidents show N`
and, while the ranks start, `doit status`, and published as the watchdog's gauges."""
import os
from pathlib import Path
from types import SimpleNamespace

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from dsv41.head import status
from dsv41.head.core import incidents, record, release_status, releases as rel, startup, watchdog_metrics
from dsv41.vllm.recipe import Vllm
from test_releases import T0, fields

RECORDS = Path(__file__).parent / "records" / "startup"
START = (RECORDS / "lab-vllm-eager-r0-start.log").read_text()
WHOLE = (RECORDS / "r0-journal-all.log").read_text()
PARSE = Vllm(None).startup


def table(s):
    return [(p.name, None if p.seconds is None else round(p.seconds, 1), p.cache) for p in s.phases]


def without(text, *needles):
    return "\n".join(line for line in text.splitlines() if not any(n in line for n in needles))


def test_the_recorded_start_of_the_labs_real_engine_reads_as_its_phases():
    s = PARSE(START)
    # systemd's Starting 22:22:01.280330; vLLM's first line 22:22:37.749722; "Starting to load model"
    # 22:23:25.741799 to "Loading weights took" 22:23:28.576171; "GiB for KV cache" 22:23:30.795837 to
    # "KV cache size" 22:23:30.834143; "init engine" 22:23:34.843128 to "Application startup complete" 22:23:39.442394
    assert table(s) == [("container", 36.5, None), ("weights", 2.8, None), ("kv_cache", 0.0, None),
                        ("api", 4.6, None)]
    assert round(s.total, 1) == 98.2 and s.current is None
    assert "compile" not in [p.name for p in s.phases]      # the eager profile compiles nothing: no phase, not "unknown"
    assert table(PARSE(WHOLE)) == table(s)                   # the stop after it and the journal before change nothing


def test_a_missing_or_reworded_line_is_unknown_never_a_figure_from_another_line():
    s = PARSE(without(START, "Starting to load model"))
    assert ("weights", 2.3, None) in table(s)               # vLLM's own "Loading weights took 2.28 seconds"
    s = PARSE(without(START, "Starting to load model", "Loading weights took"))
    assert ("weights", None, None) in table(s) and ("kv_cache", 0.0, None) in table(s)
    s = PARSE(START.replace("Application startup complete", "Application started"))
    assert s.total is None and s.current == "api"           # not over, as far as the log says
    s = PARSE(without(START, "systemd["))
    assert ("container", None, None) in table(s) and s.total is None
    assert ("weights", 2.8, None) in table(s)
    assert PARSE("garbage\nnot a journal line\n") == startup.Startup()       # nothing read: no figure at all


def test_the_compile_says_hit_or_miss_by_vllms_own_lines():
    stamp = "2026-12-06T22:23:29.{:06d}+0000 head docker[944]: (Worker_TP0 pid=39) INFO 12-06 22:23:29 [x.py:1] "
    lines = START.splitlines()
    at = next(i for i, line in enumerate(lines) if "Loading weights took" in line) + 1

    def with_(*msgs):
        return "\n".join(lines[:at] + [stamp.format(i) + m for i, m in enumerate(msgs)] + lines[at:])
    hit = with_("Starting torch.compile", "Directly load the compiled graph(s) for compile range (1, 2048) from the "
                "cache, took 0.717 s", "torch.compile took 2.89 s in total")
    assert ("compile", 0.0, "hit") in table(PARSE(hit))
    miss = with_("Starting torch.compile", "Compiling a graph for compile range (1, 2048) takes 30.00 s",
                 "torch.compile took 40.00 s in total")
    assert ("compile", 0.0, "miss") in table(PARSE(miss))
    assert ("compile", 40.0, "miss") in table(PARSE(without(miss, "Starting torch.compile")))
    older = with_("Starting torch.compile", "torch.compile takes 9.27 s in total")   # another version's words
    assert ("compile", None, None) in table(PARSE(without(older, "Starting torch.compile")))


def test_status_says_the_phase_under_way_and_what_it_took_last_time(tmp_path):
    cut = START[:START.index("Loading weights took")].rsplit("\n", 1)[0]
    s = PARSE(cut)
    assert s.current == "weights" and [p.name for p in s.phases] == ["container"]
    record.set_startup(str(tmp_path), {"time": T0, "kind": "launch", "of": "release 1", "total": 530.0,
                                       "phases": [{"phase": "weights", "seconds": 510.0, "cache": None}]})
    journal = SimpleNamespace(code=0, stdout=cut)
    cl = SimpleNamespace(engine_units=lambda node: ["dsv41-r0.service"], head="head", recipe=Vllm(None),
                         journal=lambda *a, **kw: journal, cfg=SimpleNamespace(state_dir=str(tmp_path), start_timeout_s=900))
    got = status.starting(cl, [], now=s.since + 252)
    assert got["line"] == "loading weights, 4:12; 8:30 last time" and got["last_s"] == 510.0
    os.unlink(os.path.join(tmp_path, "startup.json"))        # no start-up before: no "last time"
    assert status.starting(cl, [], now=s.since + 5)["line"] == "loading weights, 0:05"


def test_a_release_keeps_its_phases_and_shows_them_and_an_older_record_still_loads(tmp_path):
    d = str(tmp_path)
    s = PARSE(START)
    measured = {"phases": startup.to_record(s.phases), "total": round(s.total, 1)}
    r = rel.begin(d, fields(), 10, now=T0)
    rel.finish(d, r.number, rel.GOOD, "ready", startup_s=100, now=T0 + 100, phases=measured)
    old = rel.begin(d, fields(unit="ExecStart=run --kv 2\n"), 10, now=T0 + 200)
    rel.finish(d, old.number, rel.GOOD, "ready", startup_s=90, now=T0 + 300)          # as an older version wrote it
    history = rel.load_all(d)
    assert history[0].startup_phases == measured and history[1].startup_phases is None
    shown = "\n".join(release_status.show_lines(history, 2, 1))
    assert "start-up    1:38 from the unit's start to the API" in shown
    assert "    container started                0:36" in shown and "    API ready                        0:05" in shown
    assert "    between phases, or unknown       0:54" in shown
    assert "start-up    " not in "\n".join(release_status.show_lines(history, 2, 2))


def test_an_incident_keeps_its_recoverys_phases_and_shows_them(tmp_path):
    d = str(tmp_path)
    inc = record.open_incident(d, verdict="DEAD", evidence="rank 1 exited", fault_at=T0, now=T0)
    rows = startup.to_record(PARSE(START.replace("Starting to load model", "Starting to lod model")).phases)
    inc = record.set_phase(d, inc, "served", startup={"phases": rows, "total": 98.2})
    record.close_incident(d, inc, "READY", ended=T0 + 120)
    shown = incidents.show(d, 1)
    assert "start-up    1:38 from the unit's start to the API" in shown
    assert "    weights loaded                   0:02" in shown      # vLLM's own figure: its first line is unknown
    assert "    KV cache sized                   0:00" in shown


def test_each_phase_known_is_a_gauge_and_an_unknown_one_has_none():
    reg = CollectorRegistry()
    watchdog_metrics.startup_gauges(reg, Gauge, {"kind": "recovery", "total": 98.2, "phases": [
        {"phase": "weights", "seconds": 2.8, "cache": None}, {"phase": "compile", "seconds": 40.0, "cache": "miss"},
        {"phase": "graphs", "seconds": None, "cache": None}]})
    text = generate_latest(reg).decode()
    assert 'dsv41_startup_phase_seconds{cache="",kind="recovery",phase="weights"} 2.8' in text
    assert 'dsv41_startup_phase_seconds{cache="miss",kind="recovery",phase="compile"} 40.0' in text
    assert 'phase="graphs"' not in text and 'dsv41_startup_seconds{kind="recovery"} 98.2' in text
