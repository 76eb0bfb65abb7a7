# stepwatch: run `make help` for the commands.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: help setup lock demo test test-unit test-integration lint typecheck alerts kube dashboards check bench clean

help:  ## list the commands
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  make %-18s %s\n", $$1, $$2}'

setup:  ## install Debian packages and the Python virtual environment (.venv)
	bash scripts/setup.sh

lock:  ## regenerate requirements/lock.txt (hashed pins of every extra) after a dependency change
	bash scripts/lock.sh

ARGS ?=

demo:  ## the whole loop on embedded defaults (Ctrl-C stops it; ARGS="--duration 150" to bound it)
	$(VENV)/bin/stepwatch demo $(ARGS)

test:  ## run the whole test suite (unit + integration; GPU tests skip without a GPU)
	bash scripts/test.sh $(PYTEST_ARGS)

test-unit:  ## unit tests only
	$(PY) -m pytest -m unit -q $(PYTEST_ARGS)

test-integration:  ## integration tests only (start real services on loopback)
	$(PY) -m pytest -m integration -q $(PYTEST_ARGS)

lint:  ## ruff (lint and format check)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck:  ## strict mypy (the package with its services; bench, dashboards, test helpers) and the import-layer contracts
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy bench dashboards tests
	$(PY) scripts/lint_imports.py

alerts:  ## check and unit-test the alert rules (promtool) and the Alertmanager routing (amtool)
	promtool check rules alerts/src/stepwatch/alerts/rules/*.yml
	promtool test rules alerts/src/stepwatch/alerts/tests/*_test.yml
	amtool check-config alerts/src/stepwatch/alerts/alertmanager/alertmanager.yml

RUNBOOK_BASE_URL ?= https://github.com/stepwatch/stepwatch/blob/main/docs/runbooks.md
kube:  ## regenerate deploy/kubernetes/{prometheus-rules,monitors}.yaml (PrometheusRule, Pod/ServiceMonitor)
	$(PY) -m stepwatch.alerts.kube kube --runbook-base-url $(RUNBOOK_BASE_URL)

dashboards:  ## regenerate the Grafana dashboards (dashboards/json) from dashboards/generate.py
	$(PY) dashboards/generate.py

check: lint typecheck test  ## lint and typecheck, then make test (which runs them again: CI runs make test alone)

bench:  ## run the benchmarks (figures and ratios against same-run baselines)
	$(PY) bench/run_all.py

clean:  ## remove caches and local state (var/)
	rm -rf var .pytest_cache .mypy_cache .ruff_cache
