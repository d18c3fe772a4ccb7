# fedlink: one command for each thing a newcomer or CI does.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast docs proto lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, pinned: anything looser resolves to a multi-GB CUDA build.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[all,dev,docs]'
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
# The docs site is built by a test (tests/unit/test_docs.py), so make test covers it too.
TEST_WORKERS ?= 6
test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=25 tests

# The inner loop: unit and property tests only (no servers, no subprocesses of whole runs).
test-fast: $(STAMP)
	$(PY) -m pytest -q -n 2 --durations=10 tests/unit tests/property

# The guide: docs/configuration.md regenerated from the config classes, then the site built
# into site/ with every warning an error.
docs: $(STAMP)
	$(PY) docs/gen_config.py
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

proto: $(STAMP)
	$(PY) -m fedlink.proto.regen

lint: $(STAMP)
	$(VENV)/bin/ruff check fedlink tests benchmarks clients examples docs
	$(VENV)/bin/mypy
	$(VENV)/bin/hadolint server/Containerfile clients/edge/Containerfile

bench: $(STAMP)
	@set -e; for b in benchmarks/*.py; do \
	  case $$b in */_common.py|*/results.py) continue;; esac; \
	  echo "== $$b"; $(PY) $$b --quick --json runs/bench/$$(basename $$b .py).json; \
	done
	$(PY) benchmarks/results.py runs/bench --mode quick

clean:
	rm -rf $(VENV) runs site .pytest_cache .mypy_cache .ruff_cache
