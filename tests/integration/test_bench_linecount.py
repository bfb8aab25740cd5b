"""bench/linecount.py, the launcher that counts a request's Python work, on a real gateway
process (the bundled demo backend behind it): the counts it reports are per request and name
the gateway's own code."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import httpx

from tests.support.procs import ROOT, Proc, free_port

CALL = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "echo", "arguments": {"text": "hi"},
                   "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                             "io.modelcontextprotocol/clientCapabilities": {}}}}
HEADERS = {"mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call", "mcp-name": "echo",
           "accept": "application/json, text/event-stream"}


def counted(proc: Proc, url: str, calls: int, tmp_path: Path) -> str:
    assert proc.proc is not None
    report = tmp_path / "linecount.txt"
    os.kill(proc.proc.pid, signal.SIGUSR1)
    time.sleep(0.2)  # the signal is handled between two bytecodes of the loop
    with httpx.Client(timeout=10) as client:
        for _ in range(calls):
            assert client.post(url, json=CALL, headers=HEADERS).json()["result"]["content"][0]["text"] == "hi"
    (tmp_path / "linecount.requests").write_text(str(calls))
    os.kill(proc.proc.pid, signal.SIGUSR2)
    for _ in range(100):
        if report.exists() and report.stat().st_size:
            return report.read_text()
        time.sleep(0.05)
    raise AssertionError(f"no report written: {proc.output()[-2000:]}")


def test_linecount_reports_the_work_of_one_request(tmp_path: Path) -> None:
    port = free_port()
    proc = Proc([sys.executable, str(ROOT / "bench" / "linecount.py"), "serve", "--host", "127.0.0.1",
                 "--port", str(port)], port, cwd=tmp_path, name="linecount").start()
    try:
        with httpx.Client(timeout=10) as client:  # warm: discovery and first-call work not counted
            client.post(proc.url, json=CALL, headers=HEADERS).raise_for_status()
        few = counted(proc, proc.url, 5, tmp_path)
        (tmp_path / "linecount.txt").unlink()
        many = counted(proc, proc.url, 20, tmp_path)
    finally:
        proc.stop()

    def per_request(report: str) -> int:
        first = report.splitlines()[0]  # "per request (N requests): L lines, P Python calls, C C calls"
        return int(first.split("): ")[1].split(" lines")[0])

    # Per request, not per run: four times the requests, about the same figure (the demo
    # backend runs in the same process and is counted too, the same for every call).
    assert per_request(few) > 100
    assert abs(per_request(many) - per_request(few)) < 0.25 * per_request(few)
    assert "gateway/http11.py" in many and "parse_call" in many and "## C calls" in many
