"""The Secret type: three forms, never shown, errors that name the source and not the value."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from gateway.secret import Secret


class Holder(BaseModel):
    value: Secret


def test_inline_env_and_file_forms(tmp_path, monkeypatch):
    monkeypatch.setenv("GW_TEST_SECRET", "from-env")
    path = tmp_path / "s"
    path.write_text("from-file\n")
    assert Holder(value="inline").value.get_secret_value() == "inline"
    assert Holder(value={"env": "GW_TEST_SECRET"}).value.get_secret_value() == "from-env"
    assert Holder(value={"file": str(path)}).value.get_secret_value() == "from-file"


def test_never_in_repr_str_or_json():
    holder = Holder(value="hunter2-value")
    for shown in (repr(holder), str(holder), holder.model_dump_json(), str(holder.model_dump())):
        assert "hunter2-value" not in shown


@pytest.mark.parametrize("value, says", [
    ({"env": "GW_TEST_ABSENT"}, "environment variable GW_TEST_ABSENT"),
    ({"file": "/nonexistent/secret"}, "cannot read secret file /nonexistent/secret"),
    (["hunter2-value"], "must be a string, {env: VARIABLE} or {file: /path}"),
    ({"env": "X", "file": "hunter2-value"}, "must be a string"),
    ({"vault": "hunter2-value"}, "must be a string"),
])
def test_bad_forms_name_the_source_never_the_value(value, says):
    with pytest.raises(ValidationError) as exc:
        Holder(value=value)
    message = exc.value.errors()[0]["msg"]
    assert says in message and "hunter2-value" not in message
