"""The one type of every secret setting: a value that never shows itself.

A `Secret` setting is given in one of three forms:

    client_secret: s3cret                          # inline (tests, local runs)
    client_secret: {env: BACKEND_CLIENT_SECRET}    # an environment variable
    client_secret: {file: /var/run/secrets/gw/x}   # a file: a mounted Kubernetes Secret

and always becomes a pydantic `SecretStr`, whose `repr`, `str` and JSON dump are
`'**********'`: the value reaches only the code that calls `get_secret_value()` (the header
or token request it is for). `{env}` and `{file}` are read when the settings are loaded, that
is at start-up and on every reload; a file's trailing newline (what `kubectl create secret
--from-file` and editors leave) is dropped. A missing variable or unreadable file is a
configuration error that names the variable or path, never the value.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, SecretStr

FORMS = "a string, {env: VARIABLE} or {file: /path}"


def resolve(value: Any) -> Any:
    """The secret's text from any of its forms (a SecretStr passes through)."""
    if isinstance(value, (str, SecretStr)):
        return value
    if isinstance(value, dict) and len(value) == 1:
        (form, where), = value.items()
        if form == "env" and isinstance(where, str) and where:
            found = os.environ.get(where)
            if found is None:
                raise ValueError(f"environment variable {where} is not set")
            return found
        if form == "file" and isinstance(where, str) and where:
            try:
                text = Path(where).read_text(encoding="utf-8")
            except OSError as exc:
                raise ValueError(f"cannot read secret file {where}: {exc.strerror or type(exc).__name__}") from None
            except UnicodeDecodeError:
                raise ValueError(f"secret file {where} is not UTF-8 text") from None
            return text.removesuffix("\n").removesuffix("\r")
    # Never echo the input: it may be the secret itself, mis-shaped.
    raise ValueError(f"must be {FORMS}")


Secret = Annotated[SecretStr, BeforeValidator(resolve)]
"""A secret setting (see the module docstring for its forms)."""


def reveal(secret: SecretStr | None) -> str | None:
    return None if secret is None else secret.get_secret_value()
