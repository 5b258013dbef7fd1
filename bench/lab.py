"""The lab for benchmarks (tests/lab, driven through tests/lab/labctl.py): up and launched with the
stand-in engine. Benchmarks run doit with the default watchdog settings, unlike the lab tests."""
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "lab"))

from labctl import MODEL, Lab, LabRefused, missing, up  # noqa: E402


class BenchLab(Lab):
    doit_env = {"DSV41_PROFILE": "lab"}


def launched():
    """The lab up (cached: seconds) and the cluster launched with the stand-in engine; None, after
    saying why, when the lab cannot run here."""
    why = missing()
    if why:
        print(f"skipped: {why}; no figures")
        return None
    try:
        up("bench")              # a lab of this checkout's; `make bench` takes down one it brought up
    except LabRefused as err:
        raise SystemExit(str(err)) from None
    lab = BenchLab()
    if lab.on("head", f"test -e {MODEL}/sha256-manifest.txt", check=False).returncode:
        lab.on("head", f"{lab.venv}/bin/python {REPO}/tests/fixture_checkpoint.py {MODEL} --mb 4")
    lab.doit("launch")
    return lab


def timed(lab, args):
    """(seconds, CompletedProcess) of `doit ARGS` on the head."""
    t0 = time.monotonic()
    r = lab.doit(args, check=False)
    return time.monotonic() - t0, r
