.PHONY: setup demo test bench clean example-fraud example-iot
VENV ?= .venv

setup:
	./scripts/bootstrap.sh

demo: setup
	$(VENV)/bin/lakestream demo

example-fraud: setup
	$(VENV)/bin/lakestream demo --pattern fraud

example-iot: setup
	$(VENV)/bin/lakestream demo --pattern iot

test: setup
	$(VENV)/bin/python -m pytest -x -v --durations=15 tests

bench: setup
	$(VENV)/bin/python bench/e2e.py

clean:
	-$(VENV)/bin/lakestream stack down
	rm -rf .lakestream
