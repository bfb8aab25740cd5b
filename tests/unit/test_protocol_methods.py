"""protocol/methods.py: the method facts the endpoint, the dispatcher, the legacy-client front
and the backends read instead of lists of their own."""

from __future__ import annotations

from gateway.backends.base import internal_call
from gateway.protocol.methods import LISTEN, METHODS, is_long_running


def test_the_methods_whose_work_may_be_long():
    assert {m.name for m in METHODS.values() if m.long_running} == {
        "tools/call", "prompts/get", "resources/read", "completion/complete"}
    assert is_long_running("tools/call") and not is_long_running("tools/list")
    assert not is_long_running("initialize")  # a legacy method outside the table


def test_listen_is_the_one_stream_only_method_and_never_long_running_or_cached():
    assert [m.name for m in METHODS.values() if m.stream_only] == [LISTEN]
    listen = METHODS[LISTEN]
    assert not (listen.long_running or listen.cacheable or listen.idempotent or listen.mrtr)


def test_a_call_reads_stream_only_from_its_spec():
    assert internal_call(LISTEN, {"notifications": {}}).stream_only
    assert not internal_call("tools/list").stream_only
    notification = internal_call("notifications/initialized")
    assert notification.spec is None and not notification.stream_only
