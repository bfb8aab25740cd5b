"""The pieces of gateway/observability/ that need no server: the request record's reading of an
answer, the log formatters, the access-log timestamp, label bounding."""

from __future__ import annotations

import io
import json
import logging
import re

from gateway.observability import logs, metrics
from gateway.observability.record import CURRENT, RequestRecord


def _record() -> RequestRecord:
    return RequestRecord("rid-1", 0.0, "modern", {})


def test_the_record_reads_errors_is_error_and_result_types():
    error = _record()
    error.note_answer({"jsonrpc": "2.0", "id": 1, "error": {"code": -32602, "message": "bad"}})
    assert (error.code, error.message, error.tool_error) == (-32602, "bad", False)
    odd = _record()
    odd.note_answer({"error": {"code": "nope"}})  # a code that is no integer: an internal error
    assert odd.code == -32603 and odd.message is None
    tool = _record()
    tool.note_answer({"result": {"isError": True, "resultType": "complete", "content": []}})
    assert tool.tool_error and tool.code is None and tool.result_type == "complete"
    strange = _record()
    strange.note_answer({"result": {"isError": "yes", "resultType": "whatever"}})
    assert not strange.tool_error and strange.result_type is None
    # Defaults live on the class: one record's fields never leak into another's.
    assert _record().code is None and _record().tool_error is False


def _reference_note_answer(record: RequestRecord, message: dict | None) -> None:
    """`note_answer` as it read every answer before its shortcut for a plain result."""
    if message is None:
        return
    error = message.get("error")
    if isinstance(error, dict):
        record.code = error.get("code") if type(error.get("code")) is int else -32603
        record.message = error.get("message") if isinstance(error.get("message"), str) else None
        return
    result = message.get("result")
    if isinstance(result, dict):
        record.tool_error = result.get("isError") is True
        rtype = result.get("resultType")
        record.result_type = rtype if rtype in ("complete", "input_required", "task") else None


class _Result(dict):
    pass


def test_the_records_shortcut_for_a_plain_result_reads_every_answer_as_before():
    fields = ("code", "message", "tool_error", "result_type")
    results = [{"resultType": "complete"}, {"isError": True, "resultType": "task"}, {"resultType": ["x"]},
               {"isError": 1, "resultType": "input_required"}, {}, _Result(isError=True, resultType="complete"),
               "done", None, [1]]
    errors = [{"code": -32602, "message": "bad"}, {"code": "x", "message": 3}, "bad", None, [1]]
    messages: list[dict | None] = [None, {}, {"jsonrpc": "2.0", "id": 1}]
    messages += [{"result": r} for r in results] + [{"error": e} for e in errors]
    messages += [{"result": r, "error": e} for r in results for e in errors]
    for message in messages:
        got, expected = _record(), _record()
        got.note_answer(message)
        _reference_note_answer(expected, message)
        assert [getattr(got, f) for f in fields] == [getattr(expected, f) for f in fields], message


def test_json_log_lines_carry_the_request_id_and_nothing_multiline():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JsonFormatter())
    handler.addFilter(logs.RequestContext())
    logger = logging.getLogger("test.observability.json")
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    try:
        token = CURRENT.set(_record())
        try:
            logger.warning("backend %s left out", "b1", extra={"attempt": 2})
            try:
                raise ValueError("boom\nsecond line")
            except ValueError:
                logger.exception("failed")
        finally:
            CURRENT.reset(token)
        logger.info("outside any request")
    finally:
        logger.removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3  # the traceback stays inside its line
    first, failure, outside = (json.loads(line) for line in lines)
    assert first == {"time": first["time"], "level": "warning", "logger": "test.observability.json",
                     "message": "backend b1 left out", "request_id": "rid-1", "attempt": 2}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", first["time"])
    assert "ValueError: boom" in failure["exception"] and failure["request_id"] == "rid-1"
    assert "request_id" not in outside


def test_the_text_format_appends_the_request_id():
    record = logging.LogRecord("gateway.x", logging.INFO, "", 0, "hello", (), None)
    record.request_id = "abc"
    assert logs.TextFormatter().format(record).endswith("gateway.x: hello [request_id=abc]")


def test_access_timestamps_are_utc_milliseconds():
    assert logs._timestamp(0.25) == "1970-01-01T00:00:00.250Z"
    assert logs._timestamp(86400.5) == "1970-01-02T00:00:00.500Z"  # milliseconds truncated, as a clock would


def test_the_tool_and_version_labels_are_bounded():
    assert metrics.code_label(-31001) == "-31001" and metrics.code_label(-32099) == "other"
    from gateway.observability.middleware import _version_label

    assert _version_label("2026-07-28") == "2026-07-28" and _version_label("1999-01-01") == "other"
    assert _version_label(None) == ""
