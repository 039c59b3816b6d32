# Two entry points: `make demo` and `make test`. Both build .venv on first use.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# pytest-xdist processes (0: one pytest process); a file's tests stay together in one, handed out
# in tests/conftest.py's order (longest files first). On 2 cores, most tests wait on measurement
# windows, loads or a docker build: three processes took the suite from 22:45 to 18:50 min, four
# to 19:32 (tests/conftest.py: exclusive_cpu runs alone)
PYTEST_WORKERS ?= 3

.PHONY: demo test venv lint clean docker-image

$(STAMP): pyproject.toml scripts/setup_venv.sh scripts/install_perf_analyzer.sh scripts/install_ma_peer.sh \
		scripts/install_kserve_peer.sh \
		scripts/install_system_packages.sh scripts/apt_get.sh
	PYTHON=$(PYTHON) bash scripts/setup_venv.sh $(VENV)
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/build_examples.py
	$(BIN)/python examples/demo.py

test: $(STAMP)
	$(BIN)/python examples/build_examples.py
	$(BIN)/ruff check analyzer tests benchmarks examples
	@# mypy (~30 s of one core) beside the tests, its verdict after theirs (`make lint` alone is
	@# the quick check); it holds the tests' shared lock (tests/conftest.py), so that a test
	@# that needs the machine to itself waits for it
	@log=$$(mktemp); lock=$$(command -v flock >/dev/null && \
	  echo flock -s "$${TMPDIR:-/tmp}/model-analyzer-tests.lock"); \
	$$lock $(BIN)/mypy > $$log 2>&1 & typing=$$!; \
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder \
	  $(PYTEST_ARGS); rc=$$?; \
	wait $$typing; typed=$$?; echo "$(BIN)/mypy:"; cat $$log; rm -f $$log; \
	if [ $$typed != 0 ]; then echo "mypy failed" >&2; exit $$typed; fi; \
	if [ $$rc = 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi; exit $$rc

# The worker image for --triton-launch-mode docker, from local files (needs root and dockerd).
docker-image: $(STAMP)
	bash scripts/start_dockerd.sh
	VENV=$(abspath $(VENV)) bash scripts/build_worker_image.sh

lint: $(STAMP)
	$(BIN)/ruff check analyzer tests benchmarks examples
	$(BIN)/mypy

clean:
	rm -rf $(VENV)
