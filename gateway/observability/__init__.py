"""Metrics (Prometheus), traces (OpenTelemetry) and logs."""
