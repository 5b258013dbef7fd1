# dsv41: set-up, tests, benchmarks and the two-node lab.
PY      := .venv/bin/python
PYTEST  := .venv/bin/pytest
export PATH := $(CURDIR)/.venv/bin:$(PATH)

.PHONY: install test soak bench lab-up lab-down demo chaos faults

install: .venv/.installed

.venv/.installed: pyproject.toml
	python3 -m venv .venv
	.venv/bin/pip install -q --upgrade pip
	.venv/bin/pip install -q -e '.[test]'
	touch $@

# What CI runs: every shipped behaviour proven once (tests/test.sh): the lab's tests, with the unit tests
# beside them; each part's seconds are printed, and appended to $(TEST_TIMES) when set.
test: install
	@TEST_TIMES="$(TEST_TIMES)" bash tests/test.sh

# What repeats a proof under load or measures a figure, within SOAK_MIN minutes (60) in all: the tests
# marked soak, the fault table (bench/bench_faults.py, each fault 30-45 s after the one before healed),
# then the chaos soak for what is left of the time (at least 5 min). `make test soak` runs everything.
SOAK_MIN ?= 60
soak: install
	@bash tests/soak.sh $(SOAK_MIN)

# Every benchmark runs, and one that failed or had no figure (exit non-zero) fails the target at the end.
# A lab the benchmarks bring up is taken down after them; one that was up before is left as it was.
# The chaos soak has its own target (make chaos): 30 minutes by default; the fault table at the watchdog's
# defaults (bench_faults.py, about 35 minutes) has `make faults`.
LAB_OWNER = $${LAB_STATE:-/var/lib/dsv41-lab}/owner
bench: install
	@before=$$(cat $(LAB_OWNER) 2>/dev/null); rc=0; failed=; \
	for b in bench/bench_*.py; do case $$b in bench/bench_chaos.py|bench/bench_faults.py) continue;; esac; \
		echo "== $$b"; $(PY) $$b || { rc=1; failed="$$failed $$b"; }; done; \
	if [ -z "$$before" ] && [ "$$(cat $(LAB_OWNER) 2>/dev/null)" = "$$(printf '%s\nbench' "$(CURDIR)")" ]; then \
		bash tests/lab/down.sh; fi; [ -z "$$failed" ] || echo "== failed or no figure:$$failed"; exit $$rc

lab-up: install        # LAB_NODES=3 for three nodes; LAB_ENGINE=vllm to push the real engine too
	bash tests/lab/up.sh

lab-down:
	bash tests/lab/down.sh

demo: install
	bash tests/lab/demo.sh

chaos: install         # the chaos soak (bench/bench_chaos.py --help); CHAOS_ARGS="--once --every 15-30 --watchdog fast"
	$(PY) bench/bench_chaos.py $(CHAOS_ARGS)

faults: install        # the fault table at the watchdog's defaults (bench/bench_faults.py); LAB_ENGINE=vllm for the real engine
	$(PY) bench/bench_faults.py
