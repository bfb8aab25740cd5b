"""uvicorn's start and stop lines, once per process (docs/observability.md "Logs").

A `serve` process runs up to three uvicorn servers (the MCP listener, the operations listener,
the embedded demo backend), and they all log through uvicorn's one `uvicorn.error` logger: each
said "Started server process [pid]", so an operator read it two or three times. A real
`python -m gateway serve` with all three listeners, in text and in JSON, stopped by SIGTERM:
every uvicorn line of the start and of the stop is there exactly once."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from tests.support.procs import free_port, gateway_process

STARTUP = ("Started server process", "Waiting for application startup.", "Application startup complete.")
SHUTDOWN = ("Shutting down", "Waiting for application shutdown.", "Application shutdown complete.",
            "Finished server process")


def _messages(output: str, log_format: str) -> list[tuple[str, str]]:
    """(logger, message) of every line."""
    out = []
    for line in output.splitlines():
        if log_format == "json":
            record = json.loads(line)  # every line is one JSON object
            out.append((record["logger"], record["message"]))
        else:
            # "2026-12-02 03:50:52,010 INFO uvicorn.error: Started server process [13033]"
            _date, _time, _level, rest = line.split(" ", 3)
            logger, _, message = rest.partition(": ")
            out.append((logger, message))
    return out


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_each_uvicorn_start_and_stop_line_is_printed_once(tmp_path: Path, log_format: str):
    config = tmp_path / "gateway.yaml"
    # No backends: the demo backend runs in the process too; and an operations listener.
    config.write_text(yaml.safe_dump({"server": {"ops_port": free_port()},
                                      "observability": {"log_format": log_format}}))
    gateway = gateway_process(config).start()
    try:
        for _ in range(200):  # the "listening" line comes once every listener has started
            if "listening on" in gateway.output():
                break
            time.sleep(0.05)
    finally:
        gateway.stop()
    assert gateway.proc.returncode == 0, gateway.output()
    messages = _messages(gateway.output(), log_format)
    assert any("serving the bundled demo backend" in m for _, m in messages)  # three listeners ran
    assert any("operations (/healthz, /readyz, /metrics)" in m for _, m in messages)
    for line in (*STARTUP, *SHUTDOWN):
        said = [(logger, m) for logger, m in messages if m.startswith(line)]
        assert len(said) == 1, (line, said, gateway.output())
        assert said[0][0] == "uvicorn.error"
