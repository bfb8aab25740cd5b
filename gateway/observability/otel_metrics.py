"""The two OpenTelemetry MCP duration metrics as OTel instruments, exported over OTLP when
`observability.otlp_metrics` is on (OTEL_EXPORTER_OTLP_* configure where; the `otlp` extra
provides the exporter). `/metrics` always has them from the loop-owned families (metrics.py);
this is for collectors that take OTLP only.

Recording into the SDK takes its locks and hashes an attribute set per observation, so it is
paid only when configured: off, each request costs one `is None` test here.
"""

from __future__ import annotations

from typing import Any

from gateway import __version__
from gateway.observability import metrics

server_duration: Any = None
client_duration: Any = None
_provider: Any = None


def configure(enabled: bool, *, reader: Any = None) -> None:
    """`reader` replaces the periodic OTLP exporter (tests: the SDK's InMemoryMetricReader)."""
    global server_duration, client_duration, _provider
    if _provider is not None:
        _provider.shutdown()
    server_duration = client_duration = _provider = None
    if not enabled:
        return
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.resources import Resource

    from gateway.observability.tracing import resource

    if reader is None:
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        try:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        except ImportError:
            raise RuntimeError("observability.otlp_metrics needs the package opentelemetry-exporter-otlp-proto-http: "
                               "pip install 'mcp-gateway[otlp]'") from None
        reader = PeriodicExportingMetricReader(OTLPMetricExporter())
    _provider = MeterProvider(metric_readers=[reader], resource=resource(Resource))
    meter = _provider.get_meter("mcp-gateway", __version__)
    boundaries = list(metrics.MCP_OPERATION_BUCKETS)
    server_duration = meter.create_histogram(
        "mcp.server.operation.duration", unit="s", explicit_bucket_boundaries_advisory=boundaries,
        description="MCP request duration as observed on the receiver from the time it was received until the "
                    "result or ack is sent.")
    client_duration = meter.create_histogram(
        "mcp.client.operation.duration", unit="s", explicit_bucket_boundaries_advisory=boundaries,
        description="The duration of the MCP request as observed on the sender from the time it was sent until the "
                    "response is received.")


def attributes(method: str, error: str, tool: str, version: str | None, transport: str,
               address: str | None = None) -> dict[str, Any]:
    """The conventions' attribute set; empty values left out (as `error.type` on success)."""
    out: dict[str, Any] = {"mcp.method.name": method, "network.transport": transport}
    if error:
        out["error.type"] = error
    if tool and tool != metrics.OTHER:
        out["gen_ai.tool.name"] = tool
    if version:
        out["mcp.protocol.version"] = version
    if address:
        out["server.address"] = address
    return out
