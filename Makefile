# The two commands a user needs: `make demo` and `make test`. Both install whatever is missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
WEBGGUF := $(VENV)/bin/webgguf
STAMP := .stamp
DEFAULT_MODEL := smollm2-135m-instruct
# The models the tests use, fetched side by side (make -j below).
TEST_MODELS := smollm2-135m-instruct gemma-3-270m
FETCH_MODELS := $(TEST_MODELS:%=fetch-%)
# Independent steps run side by side: the venv beside npm ci, then the models beside the page build (a
# fresh clone's setup 53 s -> ~35 s on the 2-core machine). A recipe's own lines still run in order.
MAKEFLAGS += --jobs=4

.PHONY: demo test test-fast setup models web lint fuzz clean $(FETCH_MODELS)

# The chat page on http://127.0.0.1:8000 (the default model is served from the local cache).
demo: setup web
	$(WEBGGUF) models --fetch $(DEFAULT_MODEL)
	@echo "open http://127.0.0.1:8000/?model=$(DEFAULT_MODEL)"
	$(WEBGGUF) serve --port 8000

# The whole suite, what CI runs (docs/TESTING.md): skip reasons shown (-rs), the slowest tests listed.
# Two worker processes (pytest-xdist), each taking whole files (a browser module's tests build on each
# other in file order; module-scoped fixtures are built once): one process alone kept ~1 of the 2 cores
# busy. Each worker keeps to one thread of BLAS (numpy's reference) and of lavapipe: two workers with
# a thread per core each oversubscribed the cores (OpenBLAS's threads spin while they wait). Three
# workers were slower still (docs/TESTING.md "Time"). Files go out in collection order, the long ones
# first (tests/conftest.py LONG_FILES), not by their number of tests.
test: setup models web
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 LP_NUM_THREADS=1 \
		$(PY) -m pytest -n 2 --dist loadfile --no-loadscope-reorder -rs --durations=30 tests

# The edit-test loop: unit and kernel tests, no browser, no whole-model runs, on every core (they are
# independent of each other; the browser tests are not, so `make test` hands out whole files). Work
# stealing: plain load balancing gave each worker a first batch of a quarter of the tests, and with the
# long files first one worker ran all the sampler tests while the other sat idle (3 min 38 s -> 2 min 25 s).
test-fast: setup models
	$(PY) -m pytest -n auto --dist worksteal -rs --durations=10 -m "not whole_model" tests/unit tests/kernels

setup: $(STAMP)/system $(STAMP)/venv $(STAMP)/npm

# Pyodide's runtime, our wheels and the page, built into web/dist (the e2e tests rebuild it when stale).
web: setup
	$(PY) tools/build_web.py

models: $(FETCH_MODELS)

$(FETCH_MODELS): fetch-%: setup
	$(WEBGGUF) models --fetch $*

$(STAMP)/system: tools/setup_system.sh
	bash tools/setup_system.sh
	@mkdir -p $(STAMP) && touch $@

$(STAMP)/venv: pyproject.toml | $(STAMP)/system
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[native,test]'
	@mkdir -p $(STAMP) && touch $@

$(STAMP)/npm: package.json package-lock.json | $(STAMP)/system
	npm ci --no-audit --no-fund
	@mkdir -p $(STAMP) && touch $@

# Every fuzz target for 200 s with a fresh seed (docs/FUZZING.md); the corpus persists in build/fuzz.
fuzz: setup models
	$(PY) fuzz/run.py --seconds 200 --corpus build/fuzz/corpus --artifacts build/fuzz/artifacts

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf $(STAMP) $(VENV) node_modules web/dist web/public/pyodide web/public/wheels build .pytest_cache .ruff_cache
