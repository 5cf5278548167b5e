# The two commands (see README): `make run` and `make test`. Everything else is their plumbing.
# Both install what they need: Debian packages via apt when missing, Python packages into .venv,
# the rhea test client via npm.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 5672
HTTP_PORT ?= 8080
REDIS_URL ?=

.PHONY: run test test-sentinel test-cluster lint unit system-deps venv node-deps bench bench-peers bench-cluster \
	bench-redis-floor clean fuzz

run: venv
	$(VENV)/bin/shoal-broker --listen 127.0.0.1:$(PORT) --http 127.0.0.1:$(HTTP_PORT) \
		$(if $(REDIS_URL),--redis-url $(REDIS_URL),--data-dir .data/redis)

# The main run spreads whole test files over one worker more than the CPUs, at most four
# (pytest-xdist): each worker has its own Redis and brokers (tests/conftest.py), and a module's
# fixtures stay in one worker. The suite waits more than it computes (brokers, failovers, Spark
# JVMs starting): on 2 vCPUs the main run took 10:48 with 3 workers against 17:46 with 2, its
# tests' summed time no longer (1 861 s against 2 060 s); with 4 workers it took 14:20 against 14:30
# with 3 on a slower VM, where the run is CPU-bound: its 2 745 test-seconds spread evenly over the
# three workers (the longest file 124 s). TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
test: venv node-deps lint
	$(PY) -m pytest -p no:cacheprovider -n $(TEST_WORKERS) --maxprocesses 4 --dist loadfile
	$(MAKE) --no-print-directory test-sentinel
	$(MAKE) --no-print-directory test-cluster

# The store rounds spread whole files over the main run's workers too: each worker starts its
# own Sentinel set or Redis Cluster (tests/conftest.py).
STORE_ROUND = -n $(TEST_WORKERS) --maxprocesses 4 --dist loadfile

# The core functional modules again, with the brokers on a primary, a replica and three sentinels
# (tests/conftest.py, docs/redis-modes.md); part of `make test` (about 2 minutes).
SENTINEL_CORE := tests/amqp/test_queues.py tests/amqp/test_topics.py tests/amqp/test_delayed.py \
	tests/amqp/test_failover.py tests/jms/test_subscriptions.py tests/jms/test_transactions.py \
	tests/amqp/test_redelivery_delay.py tests/amqp/test_last_value.py
SENTINEL_CORE += tests/amqp/test_exclusive.py::test_a_killed_replicas_active_consumer_is_followed_in_order_with_nothing_lost
SENTINEL_CORE += tests/amqp/test_priority_levels.py
SENTINEL_CORE += tests/amqp/test_message_groups.py
SENTINEL_CORE += tests/store/test_shared_fetch_lua.py
SENTINEL_CORE += tests/store/test_sharing_fast_path.py tests/store/test_lone_fetch.py
# the backlog walk's look at an address it found empty (about 4 s)
SENTINEL_CORE += tests/store/test_backlog_probe.py
SENTINEL_CORE += tests/amqp/test_big_bodies.py tests/amqp/test_recent_bodies.py
# a pause answered once every replica applied it (about 10 s)
SENTINEL_CORE += tests/management/test_control.py
SENTINEL_CORE += tests/amqp/test_redelivery_order.py::test_an_outcome_read_in_one_turn_with_a_drain_reaches_the_store_before_its_fetch
# what an idle broker imports, in each store mode's client (about 8 s)
SENTINEL_CORE += tests/amqp/test_idle_imports.py
test-sentinel: venv node-deps
	SHOAL_TEST_STORE=sentinel $(PY) -m pytest -p no:cacheprovider $(STORE_ROUND) $(SENTINEL_CORE)

# The same core modules with the brokers on a Redis Cluster of three primaries and three replicas
# (tests/support/redisclusters.py, docs/redis-modes.md#redis-cluster), and a committer killed
# mid-transaction, whose commits there span shards; part of `make test` (about 2 minutes).
CLUSTER_CORE := $(SENTINEL_CORE) tests/jms/test_commit_crash.py
# A burst of attaches past the store's connection pool, served in turn (about 25 s).
CLUSTER_CORE += tests/amqp/test_attach_burst.py
# The operator on a Redis Cluster: provisioning, updates, policies and the deletion policies
# (every tests/k8s module that touches Redis passes in any store mode; these are the quick ones,
# about 40 s together).
CLUSTER_CORE += tests/k8s/test_operator_lifecycle.py tests/k8s/test_operator_deletion_order.py \
	tests/k8s/test_operator_policies.py
test-cluster: venv node-deps
	SHOAL_TEST_STORE=cluster $(PY) -m pytest -p no:cacheprovider $(STORE_ROUND) $(CLUSTER_CORE)

lint: venv
	$(VENV)/bin/ruff check broker operator analytics tests bench docker charts fuzz scripts
	$(VENV)/bin/ruff format --check broker operator analytics tests bench docker charts fuzz scripts
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

unit: venv
	$(PY) -m pytest -p no:cacheprovider tests/unit

# Debian packages, installed only when missing.
system-deps: .stamp-system
.stamp-system: scripts/ensure-system-deps.sh
	PYTHON=$(PYTHON) bash scripts/ensure-system-deps.sh
	@touch $@

venv: $(VENV)/.installed
# Installing also compiles the broker's C (scripts/hatch_build.py), hence its sources.
$(VENV)/.installed: pyproject.toml .stamp-system broker/shoal_broker/amqp/_wire.c broker/shoal_broker/amqp/_wire.h \
		broker/shoal_broker/routing/_entry.c broker/shoal_broker/routing/_entry_api.h \
		broker/shoal_broker/store/_replies.c broker/shoal_broker/metrics/_latency.c \
		broker/shoal_broker/amqp/outcome_codes.py scripts/build_wire.py scripts/hatch_build.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[broker,operator,analytics,dev]'
	@touch $@

node-deps: tests/rhea/node_modules/.installed
tests/rhea/node_modules/.installed: tests/rhea/package.json tests/rhea/package-lock.json .stamp-system
	cd tests/rhea && npm ci --silent --no-audit --no-fund
	@touch $@

# Every decoder of peer input under atheris/libFuzzer, FUZZ_RUNS inputs each (fuzz/run.py).
FUZZ_RUNS ?= 100000
FUZZ_TARGETS := sasl sections selector frames replies
fuzz: venv
	mkdir -p .fuzz/crashes
	set -e; for target in $(FUZZ_TARGETS); do \
		$(PY) fuzz/run.py $$target -runs=$(FUZZ_RUNS) -timeout=10 -rss_limit_mb=2048 \
			-artifact_prefix=.fuzz/crashes/ -print_final_stats=1 .fuzz/corpus/$$target; \
	done

# The benchmark suite (docs/performance.md): Shoal alone, or interleaved with RabbitMQ (installed
# via apt by bench/rabbitmq.sh when missing). QUICK=1 runs small counts, a check that all works.
bench: venv
	bash bench/run.sh

bench-peers: venv
	bash bench/peers.sh

# Redis Cluster of 1, 2 and 3 shards against standalone Redis, interleaved (bench/cluster.sh).
bench-cluster: venv
	bash bench/cluster.sh

# redis-server's own cost in cluster mode against standalone, no broker (bench/redis_floor.sh):
# the floor of the Redis side of bench-cluster's 1-shard overhead.
bench-redis-floor: system-deps
	bash bench/redis_floor.sh

clean:
	rm -rf $(VENV) .venv-bench .fuzz .stamp-system tests/rhea/node_modules .mypy_cache .ruff_cache .import_linter_cache
