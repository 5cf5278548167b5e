# syntax=docker/dockerfile:1
# The Shoal broker and operator image: the `shoal` distribution with extras broker+operator.
#   docker build -f docker/broker.Dockerfile -t ghcr.io/shoal-dev/shoal:0.1.0 .
# Entrypoints: `shoal-broker` (the default command) and `shoal-operator` (the chart's operator
# Deployment sets it as the command). Runs as uid 10001 with a read-only root filesystem (the
# pods mount an emptyDir at /tmp).

ARG PYTHON_IMAGE=docker.io/library/python:3.11.11-slim-bookworm

# Build stage: compilers and OpenSSL headers, needed because python-qpid-proton builds its C
# extension (with TLS) from source.
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
RUN pip install --no-cache-dir '.[broker,operator,tracing]'

# Runtime stage: the same base (so the venv's interpreter path holds), OpenSSL's runtime only.
FROM ${PYTHON_IMAGE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends libssl3 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 shoal \
    && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --shell /usr/sbin/nologin shoal
COPY --from=build /opt/shoal /opt/shoal
ENV PATH=/opt/shoal/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SHOAL_LISTEN=0.0.0.0:5672 \
    SHOAL_HTTP=0.0.0.0:8080 \
    SHOAL_LOG_FORMAT=json
USER 10001:10001
WORKDIR /tmp
EXPOSE 5672 8080
CMD ["shoal-broker"]
