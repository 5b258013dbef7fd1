# dsv41: set-up, tests, benchmarks and the two-node lab.
PY      := .venv/bin/python
PYTEST  := .venv/bin/pytest
export PATH := $(CURDIR)/.venv/bin:$(PATH)

.PHONY: install test bench lab-up lab-down demo

install: .venv/.installed

.venv/.installed: pyproject.toml
	python3 -m venv .venv
	.venv/bin/pip install -q --upgrade pip
	.venv/bin/pip install -q -e '.[test]'
	touch $@

test: install
	$(PYTEST) -q

bench: install
	@for b in bench/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

lab-up: install        # LAB_NODES=3 for three nodes; LAB_ENGINE=vllm to push the real engine too
	bash tests/lab/up.sh

lab-down:
	bash tests/lab/down.sh

demo: install
	bash tests/lab/demo.sh
