# fedlink: one command for each thing a newcomer or CI does.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test proto lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, pinned: anything looser resolves to a multi-GB CUDA build.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[all,dev]'
	touch $(STAMP)

# The same poor fleet twice, synchronous FedAvg then fedlink's elastic rounds, and the
# comparison (time to 90% accuracy and its ratio, printed last).
demo: $(STAMP)
	$(PY) -m fedlink simulate examples/demo_sync_fedavg.toml
	$(PY) -m fedlink simulate examples/demo_poor_network.toml
	$(PY) -m fedlink compare runs/demo-sync-fedavg runs/demo-elastic --target 0.9 \
	  --output runs/demo-comparison

# Many tests wait on wall time (10 s round trips, blackouts, long polls), not on the CPU: six
# workers on two cores; --dist loadgroup keeps each xdist_group (tests sharing an expensive
# module fixture, the packet tier) on one worker. TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 6
test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup tests

proto: $(STAMP)
	$(PY) -m fedlink.proto.regen

lint: $(STAMP)
	$(VENV)/bin/ruff check fedlink tests benchmarks clients examples
	$(VENV)/bin/mypy
	$(VENV)/bin/hadolint server/Containerfile clients/edge/Containerfile

bench: $(STAMP)
	@set -e; for b in benchmarks/*.py; do \
	  echo "== $$b"; $(PY) $$b --quick --json runs/bench/$$(basename $$b .py).json; \
	done

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache
