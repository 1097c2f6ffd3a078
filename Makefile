# Two commands do all the set-up on a fresh clone: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m jaxops demo

test: $(STAMP)
	$(PY) -m pytest -n auto

bench: $(STAMP)  # from the checkout: the benchmarks are not part of the package
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
