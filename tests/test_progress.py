"""The one progress display (head/core/progress.py) in its plain-line form, as journald and CI see it."""
import io

from dsv41.head.core import progress


def test_a_wait_that_runs_past_its_total_still_closes_with_its_line():
    out = io.StringIO()
    with progress.bar("waiting for the API", 10, unit="s", stream=out, interval=0) as wait:
        wait.update(4)
        wait.update(8)               # the last sleep of a wait overshoots its deadline
    lines = out.getvalue().splitlines()
    assert lines[0] == "waiting for the API: 4/10 s (40%)"
    assert lines[-1] == "waiting for the API: 10 of 10 s used"
