# pymq: the two commands a newcomer needs are `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
SOURCES := $(shell find connector broker_stub proto -name '*.py' -o -name '*.proto' -o -name '*.pyi' 2>/dev/null)
PYTEST_ARGS ?=
RMQ_VERSION := 5.3.3
RMQ         := $(VENV)/rocketmq-$(RMQ_VERSION)
RMQ_CLIENT_JAVA_VERSION := 5.1.0
RMQ_CLIENT_JAVA := $(VENV)/rocketmq-client-java-$(RMQ_CLIENT_JAVA_VERSION)
KAFKA_VERSION := 4.1.2
KAFKA       := $(VENV)/kafka-$(KAFKA_VERSION)
# The API reference from the docstrings; a warning (a broken reference, an undocumented module) fails.
DOCS        = $(PY) -m sphinx -E -W --keep-going -q -b html docs build/docs

.PHONY: setup rocketmq rocketmq-client-java kafka demo test unit lint typecheck proto bench clean docs

# Java 17 for Spark, a virtualenv with the pinned dependencies, pymq installed into it.
setup: $(VENV)/.installed

$(VENV)/.java:
	@command -v java >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless)
	@mkdir -p $(VENV) && touch $@

$(VENV)/.deps: setup.cfg pyproject.toml $(VENV)/.java
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q ".[dev]"
	touch $@

$(VENV)/.installed: $(VENV)/.deps $(SOURCES)
	$(PIP) install -q --no-deps --force-reinstall .
	touch $@

# The real Apache RocketMQ (name server, brokers, mqadmin, Java client) that integration tests run
# (tests/rocketmq_cluster.py): jars from Maven Central, once, through the project's own Maven cache
# and settings, so nothing in ~/.m2 can break or change it. javac compiles the tests' Java producer.
rocketmq: $(RMQ)/.fetched

$(RMQ)/.fetched: tests/rocketmq/pom.xml tests/rocketmq/settings.xml $(VENV)/.java
	@command -v mvn >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq maven)
	@command -v javac >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq openjdk-17-jdk-headless)
	rm -rf $(RMQ)/lib.tmp
	mvn -q -B -s tests/rocketmq/settings.xml -f tests/rocketmq/pom.xml -Dmaven.repo.local=$(abspath $(VENV))/m2 \
	  org.apache.maven.plugins:maven-dependency-plugin:3.6.1:copy-dependencies \
	  -DincludeScope=runtime -DoutputDirectory=$(abspath $(RMQ))/lib.tmp
	rm -rf $(RMQ)/lib && mv $(RMQ)/lib.tmp $(RMQ)/lib
	touch $@

# RocketMQ 5's official Java client (gRPC), which tests/test_v2_java_client.py runs against the
# embedded broker's apache.rocketmq.v2 service: one shaded jar from Maven Central, same cache and settings.
rocketmq-client-java: $(RMQ_CLIENT_JAVA)/.fetched

$(RMQ_CLIENT_JAVA)/.fetched: tests/rocketmq/client-java/pom.xml tests/rocketmq/settings.xml $(VENV)/.java
	@command -v mvn >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq maven)
	@command -v javac >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq openjdk-17-jdk-headless)
	rm -rf $(RMQ_CLIENT_JAVA)/lib.tmp
	mvn -q -B -s tests/rocketmq/settings.xml -f tests/rocketmq/client-java/pom.xml -Dmaven.repo.local=$(abspath $(VENV))/m2 \
	  org.apache.maven.plugins:maven-dependency-plugin:3.6.1:copy-dependencies \
	  -DincludeScope=runtime -DoutputDirectory=$(abspath $(RMQ_CLIENT_JAVA))/lib.tmp
	rm -rf $(RMQ_CLIENT_JAVA)/lib && mv $(RMQ_CLIENT_JAVA)/lib.tmp $(RMQ_CLIENT_JAVA)/lib
	touch $@

# Apache Kafka (KRaft broker and tools, into lib/) and Spark's Kafka connector (its four jars, into
# spark/) that benchmarks/bench_vs_kafka.py runs pymq against: from Maven Central, once, through the
# project's own Maven cache and settings (benchmarks/kafka/pom.xml), never ~/.m2 or ~/.ivy2.
kafka: $(KAFKA)/.fetched

$(KAFKA)/.fetched: benchmarks/kafka/pom.xml benchmarks/kafka/settings.xml $(VENV)/.java
	@command -v mvn >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq maven)
	rm -rf $(KAFKA)/lib.tmp $(KAFKA)/spark.tmp
	mvn -q -B -s benchmarks/kafka/settings.xml -f benchmarks/kafka/pom.xml -Dmaven.repo.local=$(abspath $(VENV))/m2 \
	  org.apache.maven.plugins:maven-dependency-plugin:3.6.1:copy-dependencies \
	  org.apache.maven.plugins:maven-dependency-plugin:3.6.1:copy@spark \
	  -DincludeScope=runtime -DoutputDirectory=$(abspath $(KAFKA))/lib.tmp \
	  -Dspark.jars.dir=$(abspath $(KAFKA))/spark.tmp
	rm -rf $(KAFKA)/lib $(KAFKA)/spark && mv $(KAFKA)/lib.tmp $(KAFKA)/lib && mv $(KAFKA)/spark.tmp $(KAFKA)/spark
	touch $@

# The main job: the demo pipeline on an embedded broker.
demo: setup
	$(PY) examples/demo_pipeline.py

# Every test: unit, integration (a real broker process, real RocketMQ, a real local Spark), lint, types, docs.
test: setup rocketmq rocketmq-client-java
	$(PY) -m ruff check connector broker_stub proto tests examples benchmarks
	$(PY) -m mypy connector broker_stub proto
	$(DOCS)
	$(PY) -m pytest $(PYTEST_ARGS)

lint: setup
	$(PY) -m ruff check connector broker_stub proto tests examples benchmarks

typecheck: setup
	$(PY) -m mypy connector broker_stub proto

# The fast loop while changing code: unit tests only (no Spark, no broker process), lint, types.
unit: setup
	$(PY) -m ruff check connector broker_stub proto tests examples benchmarks
	$(PY) -m mypy connector broker_stub proto
	$(PY) -m pytest -m "not integration" $(PYTEST_ARGS)

# Regenerate the gRPC code after editing proto/pymq_proto/v1/pymq.proto, and apache.rocketmq.v2's
# (RocketMQ 5 clients) from the published protos in proto/pymq_proto/rocketmq_v2/proto-sources.
proto: $(VENV)/.deps
	PATH=$(abspath $(VENV))/bin:$$PATH $(PY) -m grpc_tools.protoc -I proto \
	  --python_out=proto --grpc_python_out=proto --mypy_out=proto --mypy_grpc_out=proto \
	  proto/pymq_proto/v1/pymq.proto
	PATH=$(abspath $(VENV))/bin:$$PATH PYTHONPATH=proto $(PY) -m pymq_proto.rocketmq_v2.generate

# Every benchmark, quick (bench_vs_kafka.py: pymq next to Spark's Kafka connector on a real Kafka).
bench: setup kafka
	$(PY) benchmarks/run_all.py

# The API reference (docs/, Sphinx autodoc) from the docstrings of this tree, into build/docs;
# any warning fails it. Needs no broker and no Spark JVM.
docs: setup
	$(DOCS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
