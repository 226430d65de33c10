# epochsync: `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# the documentation tools (requirements-docs.txt), installed into the same .venv on their own
DOCS_STAMP := $(VENV)/.docs-installed
DOCS_SITE  := build/site
DOCS_ADDR  ?= 127.0.0.1:8000
export PATH := $(CURDIR)/$(BIN):$(PATH)
export PYTHONPATH := $(CURDIR)/include$(if $(PYTHONPATH),:$(PYTHONPATH))
export AIRFLOW__CORE__LOAD_EXAMPLES := False
export PIP_DISABLE_PIP_VERSION_CHECK := 1
# a pip.conf may name local index folders that do not exist: pip then prints a warning per
# package and folder (265 of a first make demo's 328 lines here). An empty PIP_EXTRA_INDEX_URL
# does not silence them (pip ignores an empty value), so PIP drops exactly that warning and
# keeps everything else pip says, and its exit status
PIP = set -o pipefail; pip_quiet() { "$(BIN)/pip" "$$@" 2>&1 | { grep -v "^WARNING: Location '.*' is ignored: it is neither a file nor a directory\.$$" || true; }; }; pip_quiet
# MkDocs' banner about its successor, printed on every build
export NO_MKDOCS_2_WARNING := 1

PYTEST_ARGS ?=
# make test's pytest-xdist workers; 0 (the default) runs the suite in one process. Measured
# on this 2-core machine (2026-11-26, clean clones): one process 1,053-1,219 s, two workers
# 1,068-1,086 s with 40% more CPU (each worker starts its own Spark, SeaweedFS and moto).
TEST_WORKERS ?= 0

.PHONY: help venv test test-fast lint format docs docs-serve docs-ref demo demo-transcript gluster airflow bench bench-full bench-ingest bench-merge bench-e2e bench-warm bench-rollback bench-gluster bench-gluster-source bench-gluster-pool bench-gluster-audit soak clean

help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  make %-14s %s\n", $$1, $$2}'

$(STAMP): requirements.txt pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing pinned requirements into $(VENV) (first time: about 2 minutes)"
	@$(PIP) install -q -r requirements.txt
	$(BIN)/python -c "import airflow, pyspark, boto3, moto, yaml, hypothesis" 
	@$(PIP) install -q --no-deps -e .
	@# the build leaves its metadata in include/ (on sys.path): read there as a second copy of the
	@# package, its entry points would register Airflow's plugin twice (an import error)
	@rm -rf include/epochsync.egg-info
	$(BIN)/python -c "import epochsync"
	@touch $(STAMP)

venv: $(STAMP) ## create or reuse .venv and install requirements.txt and the epochsync package

# constrained by requirements.txt (extras stripped: pip takes none in a constraints file), so
# installing the documentation tools never moves a pinned package
$(DOCS_STAMP): $(STAMP) requirements-docs.txt requirements.txt
	@echo "installing the documentation tools (requirements-docs.txt) into $(VENV)"
	sed 's/\[[^]]*\]//' requirements.txt > $(VENV)/constraints.txt
	@$(PIP) install -q -r requirements-docs.txt -c $(VENV)/constraints.txt
	$(BIN)/python -c "import mkdocs, material, mkdocstrings_handlers.python"
	@touch $(DOCS_STAMP)

docs: $(DOCS_STAMP) ## build the documentation site (strict: a broken link fails) and say where it is
	$(BIN)/mkdocs build --strict --quiet --site-dir $(DOCS_SITE)
	@echo "docs: the site is in $(CURDIR)/$(DOCS_SITE) (open $(CURDIR)/$(DOCS_SITE)/index.html, or make docs-serve)"

docs-serve: $(DOCS_STAMP) ## serve the documentation site, rebuilt on every change (DOCS_ADDR=127.0.0.1:8000)
	$(BIN)/mkdocs serve --strict --dev-addr $(DOCS_ADDR)

docs-ref: $(STAMP) ## regenerate the generated pages: config and CLI reference, benchmark results, the README's figures
	$(BIN)/python -m epochsync_dev.docs

test: $(STAMP) $(DOCS_STAMP) ## run the whole test suite (unit, integration, slow, the docs checks)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS); rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests selected"; exit 0; fi; exit $$rc

test-fast: $(STAMP) $(DOCS_STAMP) ## run the tests not marked slow
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS); rc=$$?; [ $$rc -eq 5 ] && exit 0; exit $$rc

lint: $(STAMP) ## ruff lint, format check, mypy on the epochsync package
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: $(STAMP) ## ruff format the tree
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

MINUTES ?= 10
soak: $(STAMP) ## the net of issue 50 on fresh seeds for MINUTES (default 10), histories per minute; SEED=S replays one (SHRINK=1: shrinks its failure to a regression case); CASE=file replays a case
	$(BIN)/python -m epochsync_dev.net $(if $(CASE),--case $(CASE),$(if $(SEED),--seed $(SEED) $(if $(SHRINK),--shrink),--minutes $(MINUTES)))

demo: $(STAMP) ## the main job: simulate a source, replicate every epoch through Airflow, verify (SOURCE=gluster: a live GlusterFS volume instead; NODES=3: replica 3 over three servers, one killed and back; REINTEGRATE=1: then cache reintegration; REINTEGRATE=only)
	$(if $(filter gluster,$(SOURCE)),$(BIN)/python -m epochsync_dev.demo_gluster $(if $(NODES),--nodes $(NODES)),$(BIN)/python -m epochsync_dev.demo $(if $(REINTEGRATE),--reintegrate $(filter only,$(REINTEGRATE))))

demo-transcript: $(STAMP) ## run make demo and keep its transcript (bench/results/demo.txt) for the README and Getting started; then make docs-ref
	$(BIN)/python -m epochsync_dev.demo
	cp var/demo/demo-transcript.txt bench/results/demo.txt
	$(BIN)/python -m epochsync_dev.docs

gluster: $(STAMP) ## a GlusterFS volume for you (2 btrfs bricks, changelog on, FUSE-mounted; NODES=3 TYPE=replica|dist-replica|arbiter: a pool of 3 servers here): prints its mount, a config and how to stop it; Ctrl-C stops and removes it
	$(if $(NODES),$(BIN)/python -m epochsync_dev.pool --dir var/pool --nodes $(NODES) $(if $(TYPE),--type $(TYPE)),$(BIN)/python -m epochsync_dev.gluster --dir var/gluster)

airflow: $(STAMP) ## SeaweedFS + Spark Connect + airflow standalone with the project's DAGs (UI on :8080; LIVE=1: a live source)
	$(BIN)/python -m epochsync_dev.devstack $(if $(LIVE),--live)

bench: $(STAMP) ## the benchmarks that fit in 20 minutes (ingest, 1M merge, warm, e2e's small writes and churn in 10,000 files), results in bench/results/; then make docs-ref
	$(BIN)/python -m epochsync_dev.bench all --set quick
	$(BIN)/python -m epochsync_dev.docs

bench-full: $(STAMP) ## every benchmark row (also the 10M merge, e2e's 30,000-file tree, appends, 10,000-file rename and 100,000-file scenario): the same result files; then make docs-ref
	$(BIN)/python -m epochsync_dev.bench all --set full
	$(BIN)/python -m epochsync_dev.docs

bench-ingest: $(STAMP) ## ingest 1M Lustre lines and 1M JSON Lines records
	$(BIN)/python -m epochsync_dev.bench ingest

bench-merge: $(STAMP) ## merge simulated epochs of 1M and 10M records
	$(BIN)/python -m epochsync_dev.bench merge --event-log bench/scratch/merge/eventlog

bench-e2e: $(STAMP) ## epochsync vs aws s3 sync vs rclone vs whole-file copy, every scenario (SET=quick: the 10,000-file tree only, as make bench)
	$(BIN)/python -m epochsync_dev.bench e2e --set $(or $(SET),full)

bench-warm: $(STAMP) ## small epochs on one warm Spark Connect server: a DAG run, replicate, a 100-epoch catch-up
	$(BIN)/python -m epochsync_dev.bench warm

bench-rollback: $(STAMP) ## roll back a 2,000-file directory rename on SeaweedFS, undo replayed one at a time and in threads (not part of make bench)
	$(BIN)/python -m epochsync_dev.bench rollback --files 2000 --rounds 2

bench-gluster: $(STAMP) ## epochsync beside geo-replication and rsync on a live GlusterFS volume (issue 33), topology single-host; root; under 20 minutes; keeps bench-gluster-source's rows; the three-server topology: make bench-gluster-pool; then make docs-ref
	$(BIN)/python -m epochsync_dev.bench gluster --merge $(BENCH_GLUSTER_ARGS)
	$(BIN)/python -m epochsync_dev.docs

bench-gluster-pool: $(STAMP) ## a replica 3 volume over three servers on this machine: cuts with and without the barrier, a 64 KiB append (about 2 minutes), then beside geo-replication: append, small-writes, steady writer, a server killed in it (bench gluster --topology replica3-3servers, about 15 minutes); root; then make docs-ref
	$(BIN)/python -m epochsync_dev.bench gluster-pool
	$(BIN)/python -m epochsync_dev.bench gluster --topology replica3-3servers $(BENCH_GLUSTER_POOL_ARGS)
	$(BIN)/python -m epochsync_dev.docs

bench-gluster-audit: $(STAMP) ## epochsync audit of a 50,000-file Gluster volume against its cut, metadata only and deep; root; about 10 minutes
	$(BIN)/python -m epochsync_dev.bench gluster-audit

bench-gluster-source: $(STAMP) ## the live-source rows on a GlusterFS volume (issue 31): cuts with and without the barrier, live 10 s epochs under Airflow; root; about 6 minutes; keeps bench-gluster's rows
	$(BIN)/python -m epochsync_dev.bench gluster --parts airflow,cuts --merge
	$(BIN)/python -m epochsync_dev.docs

clean: ## remove build output and test scratch (keeps .venv)
	rm -rf build .pytest_cache .ruff_cache .mypy_cache dist spark-warehouse metastore_db derby.log
