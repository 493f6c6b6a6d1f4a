# oncelog developer entry points. Every target installs what it needs.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
JSDIR  := tests/js
JSSTAMP := $(JSDIR)/node_modules/.installed

.PHONY: venv run serve test unit integration bench clean

venv: $(STAMP) $(JSSTAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,spark]'
	touch $@

$(JSSTAMP): $(JSDIR)/package.json
	cd $(JSDIR) && npm install --no-audit --no-fund --silent
	touch $@

run: $(STAMP)
	$(PY) examples/spark_pipeline.py

serve: $(STAMP)
	$(VENV)/bin/oncelog serve --listen 127.0.0.1:9092 --data-dir ./data

test: venv
	$(PY) -m pytest -q

unit: $(STAMP)
	$(PY) -m pytest -q tests/unit

integration: venv
	$(PY) -m pytest -q tests/integration

bench: $(STAMP)
	$(PY) -m pip install -q -e '.[test,bench]'
	$(PY) bench/run.py --quick

clean:
	rm -rf $(VENV) $(JSDIR)/node_modules data
