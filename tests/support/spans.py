"""The in-memory span exporter as a module-scoped fixture: tracing on for the module's tests,
off after them. Import `spans` into a test module to use it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.observability import tracing


@pytest.fixture(scope="module")
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing.configure(True, span_exporter=exporter)
    try:
        yield exporter
    finally:
        tracing.configure(False)
