# mcp-gateway: a small runtime image. Build: docker build -t mcp-gateway .
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gateway ./gateway
# With the OTLP exporter: a container is where traces go to a collector.
RUN pip install --no-cache-dir --prefix=/install ".[otlp]"

FROM python:3.11-slim
COPY --from=build /install /usr/local
RUN useradd --system --uid 10001 gateway
USER gateway
# In a container the gateway must listen beyond loopback; the Host check then stays off and
# Origin checks and authentication do the guarding (see README "Security defaults").
ENV MCP_GATEWAY_SERVER__HOST=0.0.0.0 \
    MCP_GATEWAY_SERVER__PORT=8080 \
    PYTHONUNBUFFERED=1
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=2s CMD python -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8080/healthz').status != 200)"
ENTRYPOINT ["mcp-gateway", "serve"]
