# The two commands a user needs: `make demo` and `make test`. Both install whatever is missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
WEBGGUF := $(VENV)/bin/webgguf
STAMP := .stamp
DEFAULT_MODEL := smollm2-135m-instruct

.PHONY: demo test setup models lint fuzz clean

demo: setup
	$(WEBGGUF) models --fetch $(DEFAULT_MODEL)
	$(WEBGGUF) generate $(DEFAULT_MODEL) --chat --prompt "What is the capital of France?" --max-tokens 48

test: setup models
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest --durations=15

setup: $(STAMP)/system $(STAMP)/venv

models: setup
	$(WEBGGUF) models --fetch smollm2-135m-instruct
	$(WEBGGUF) models --fetch gemma-3-270m

$(STAMP)/system: tools/setup_system.sh
	bash tools/setup_system.sh
	@mkdir -p $(STAMP) && touch $@

$(STAMP)/venv: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[native,test]'
	@mkdir -p $(STAMP) && touch $@

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf $(STAMP) $(VENV) .pytest_cache .ruff_cache
