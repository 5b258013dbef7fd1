"""The chaos soak (bench/bench_chaos.py): a steady load (load.py), random faults (faults.py), the checks
after each fault (checks.py) and the report (report.py)."""
