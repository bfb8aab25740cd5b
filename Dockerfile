# mcp-gateway: a small runtime image. Build: docker build -t mcp-gateway .
# docs/deploy.md says how it runs (ports, user, writable paths, signals).
FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY constraints.txt pyproject.toml README.md ./
COPY gateway ./gateway
# Pinned: every package at the version constraints.txt names (scripts/lock.sh regenerates it),
# with the OTLP exporter, since a container is where traces go to a collector.
RUN pip install --no-cache-dir --prefix=/install --constraint constraints.txt ".[otlp]"

FROM python:3.11-slim-bookworm
# tini as PID 1: it reaps the orphaned children of stdio backends (a server that forks and
# exits would otherwise leave zombies in the pod) and forwards SIGTERM to the gateway alone
# (not to its process group), so stdio backends live until the gateway has drained.
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini=0.19.0-1 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 gateway \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin gateway
COPY --from=build /install /usr/local
# Numeric, so that a pod's runAsNonRoot can verify it without a passwd lookup.
USER 10001:10001
# In a container the gateway listens beyond loopback: Origin checks, authentication and
# server.allowed_hosts do the guarding there (README "Security defaults"). Probes and metrics
# on their own port, without those checks (docs/deploy.md "Operations listener").
# Nothing is written but /tmp (an emptyDir under a read-only root filesystem).
ENV MCP_GATEWAY_SERVER__HOST=0.0.0.0 \
    MCP_GATEWAY_SERVER__PORT=8080 \
    MCP_GATEWAY_SERVER__OPS_PORT=9090 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp
EXPOSE 8080 9090
# `mcp-gateway healthcheck` asks this configuration's /healthz (the ops port when set).
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 CMD ["mcp-gateway", "healthcheck"]
ENTRYPOINT ["/usr/bin/tini", "--", "mcp-gateway"]
CMD ["serve"]
