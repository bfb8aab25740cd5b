"""`backends[].instances` (gateway/backends/stdio_instances.py): what the settings accept and
what the backend table builds; the behaviour with real processes is in
tests/integration/test_stdio_instances.py."""

from __future__ import annotations

import sys

import pytest
from pydantic import ValidationError

from gateway.backends import create_backend
from gateway.backends.stdio import ModernStdioBackend
from gateway.backends.stdio_instances import StdioInstances
from gateway.settings import BackendSettings

COMMAND = [sys.executable, "-c", "pass"]


def test_instances_apply_to_stdio_backends_only():
    with pytest.raises(ValidationError, match="applies to 'command' \\(stdio\\) backends only"):
        BackendSettings(name="web", url="http://127.0.0.1:1/mcp", instances=2)
    with pytest.raises(ValidationError):
        BackendSettings(name="zero", command=COMMAND, instances=0)


def test_one_instance_is_the_plain_one_process_backend():
    backend = create_backend(BackendSettings(name="one", command=COMMAND, era="modern"))
    assert type(backend) is ModernStdioBackend
    assert [e.label for e in backend.health.endpoints] == ["process"]


def test_n_instances_are_n_processes_each_an_endpoint_labelled_by_its_index():
    backend = create_backend(BackendSettings(name="three", command=COMMAND, era="modern", instances=3))
    assert isinstance(backend, StdioInstances)
    assert [e.label for e in backend.health.endpoints] == ["instance-0", "instance-1", "instance-2"]
    assert len({id(p) for p in backend.processes}) == 3
    # Each instance is a one-process backend; limits stay the backend's (one limiter).
    assert all(i.settings.instances == 1 for i in backend.instances)


def test_era_auto_shares_one_health_with_its_instances_delegate():
    backend = create_backend(BackendSettings(name="auto", command=COMMAND, instances=2))
    assert [e.label for e in backend.health.endpoints] == ["instance-0", "instance-1"]
