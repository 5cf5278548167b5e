# syntax=docker/dockerfile:1
# The Shoal analytics image: Spark (the pyspark wheel's jars), a Java 17 JRE, and the `shoal`
# distribution with extras broker+analytics.
#   docker build -f docker/analytics.Dockerfile -t ghcr.io/shoal-dev/shoal-analytics:0.1.0 .
# Entrypoint `shoal-analytics`; the chart runs /opt/shoal/analytics-job.py (ingest, then analyze).
# Also a Spark-on-Kubernetes image: spark-entrypoint.sh understands the `driver` and `executor`
# commands Spark gives its pods. Runs as uid 185 (Spark's convention), read-only root filesystem
# with /tmp mounted by the pods. JAVA_HOME is a link made at build time, so any architecture works.

ARG PYTHON_IMAGE=docker.io/library/python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev pkg-config libssl-dev \
    && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/shoal
ENV PATH=/opt/shoal/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY scripts/build_wire.py scripts/hatch_build.py scripts/
COPY broker broker
COPY operator operator
COPY analytics analytics
RUN pip install --no-cache-dir '.[broker,analytics]'

FROM ${PYTHON_IMAGE}
# Bookworm's Java is 17, which Spark 4 supports; tini reaps the JVM's children as PID 1;
# procps gives Spark's scripts `ps`.
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless tini procps libssl3 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 185 spark \
    && useradd --system --uid 185 --gid 185 --home-dir /tmp --shell /usr/sbin/nologin spark \
    && ln -s "$(dirname "$(dirname "$(readlink -f /usr/bin/java)")")" /opt/java
COPY --from=build /opt/shoal /opt/shoal
COPY docker/spark-entrypoint.sh /opt/shoal/spark-entrypoint.sh
COPY docker/analytics-job.py /opt/shoal/analytics-job.py
ENV PATH=/opt/shoal/bin:$PATH \
    JAVA_HOME=/opt/java \
    SPARK_HOME=/opt/shoal/lib/python3.11/site-packages/pyspark \
    PYSPARK_PYTHON=/opt/shoal/bin/python \
    PYSPARK_DRIVER_PYTHON=/opt/shoal/bin/python \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    SPARK_LOCAL_DIRS=/tmp
USER 185:185
WORKDIR /tmp
ENTRYPOINT ["/usr/bin/tini", "--", "/opt/shoal/spark-entrypoint.sh"]
CMD ["shoal-analytics", "--help"]
