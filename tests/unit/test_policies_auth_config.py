"""`auth` settings for mode jwt: what check-config refuses, and what the consistent settings
compile into (metadata URL and paths, the metadata document)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.cli import main
from gateway.policies.jwt_config import metadata_paths, metadata_url, resolved_algorithms
from gateway.policies.prm import metadata_document
from gateway.settings import ConfigError, load_settings
from tests.support.oauth import ec_key, rsa_key

BASE = {"mode": "jwt", "issuer": "https://idp.test", "audience": "https://mcp.test/mcp",
        "jwks_url": "https://idp.test/jwks", "authorization_servers": ["https://idp.test"]}


def auth(**changes: Any) -> Any:
    merged = {k: v for k, v in {**BASE, **changes}.items() if v is not None}
    return load_settings(None, auth=merged).auth


def problems(**changes: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        auth(**changes)
    (loc, message), = caught.value.problems
    assert loc == "auth"
    return message


def test_consistent_settings_load():
    settings = auth()
    assert resolved_algorithms(settings) == ("RS256", "ES256")


@pytest.mark.parametrize(("changes", "expected"), [
    ({"audience": None}, "audience is required"),
    ({"audience": "mcp.test/mcp"}, "not an absolute http(s) URI"),
    ({"audience": "https://mcp.test/mcp#x"}, "fragment"),
    ({"issuer": None}, "issuer is required"),
    ({"jwks_url": None}, "needs one key source"),
    ({"hs256_secret": "s" * 32}, "exactly one key source, not jwks_url and hs256_secret"),
    ({"jwks_url": "http://idp.test/jwks"}, "must use https"),
    ({"algorithms": ["none"]}, "'none' is never accepted"),
    ({"algorithms": ["RS256", "HS256"]}, "only accepted with hs256_secret"),
    ({"algorithms": ["XX1"]}, "'XX1' is not supported"),
    ({"jwks_url": None, "hs256_secret": "short"}, "at least 32 bytes"),
    ({"jwks_url": None, "hs256_secret": "s" * 32, "algorithms": ["RS256"]}, "need a public key"),
    ({"jwks_url": None, "public_key": "not a pem"}, "not a PEM public key"),
    ({"jwks_url": None, "public_key_file": "/nonexistent/key.pem"}, "cannot read"),
    ({"authorization_servers": []}, "at least one entry"),
    ({"authorization_servers": ["idp.test"]}, "authorization_servers.0"),
    ({"method_scopes": {"tools/run": ["x"]}}, "'tools/run' is not an MCP method"),
    ({"required_scopes": ["a b"]}, "not a valid scope token"),
    ({"required_scopes": ['say"hi']}, "not a valid scope token"),
    ({"scopes_supported": ["mcp", "offline_access"]}, "should not require or advertise 'offline_access'"),
])
def test_inconsistent_settings_are_refused(changes, expected):
    assert expected in problems(**changes)


def test_every_problem_is_reported_at_once():
    message = problems(audience=None, jwks_url=None, authorization_servers=[])
    assert "audience" in message and "key source" in message and "authorization_servers" in message


def test_jwt_fields_under_mode_none_are_refused():
    with pytest.raises(ConfigError, match="issuer set but mode is 'none'"):
        load_settings(None, auth={"issuer": "https://idp.test"})


def test_credentials_in_the_jwks_url_are_refused_and_never_shown():
    message = problems(jwks_url="https://reader:hunter2-jwks@idp.test/jwks")
    assert "carries credentials" in message and "reader:***@idp.test" in message
    assert "hunter2" not in message
    assert "hunter2" not in problems(jwks_url="http://reader:hunter2-jwks@idp.test/jwks")


def test_plain_http_jwks_is_fine_on_loopback():
    assert auth(jwks_url="http://127.0.0.1:9/jwks").jwks_url == "http://127.0.0.1:9/jwks"


def test_public_key_algorithm_follows_the_key(tmp_path: Path):
    ec = ec_key()
    pem_file = tmp_path / "key.pem"
    pem_file.write_text(rsa_key().public_pem())
    assert resolved_algorithms(auth(jwks_url=None, public_key=ec.public_pem())) == ("ES256",)
    assert resolved_algorithms(auth(jwks_url=None, public_key_file=str(pem_file))) == ("RS256",)
    assert "do not fit" in problems(jwks_url=None, public_key=ec.public_pem(), algorithms=["RS256"])


def test_an_rsa_public_key_under_2048_bits_is_refused():
    """RFC 7518 §3.3: RS256 keys MUST be 2048 bits or more (pyjwt would accept and warn)."""
    from cryptography.hazmat.primitives.asymmetric import rsa

    from tests.support.oauth import SigningKey

    weak = SigningKey("weak", "RS256", rsa.generate_private_key(public_exponent=65537, key_size=1024))
    assert "1024-bit RSA key; at least 2048 bits" in problems(jwks_url=None, public_key=weak.public_pem())


def test_secret_is_not_printed():
    settings = auth(jwks_url=None, hs256_secret="a-very-secret-value-of-32-bytes!!")
    assert "a-very-secret" not in repr(settings) and "a-very-secret" not in str(settings.model_dump())


@pytest.mark.parametrize(("audience", "mcp_path", "url", "paths"), [
    ("https://mcp.test/mcp", "/mcp", "https://mcp.test/.well-known/oauth-protected-resource/mcp",
     ["/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"]),
    # Behind a proxy that publishes /public/mcp as the gateway's /mcp: both forms are served.
    ("https://mcp.test/public/mcp/", "/mcp", "https://mcp.test/.well-known/oauth-protected-resource/public/mcp",
     ["/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp",
      "/.well-known/oauth-protected-resource/public/mcp"]),
    ("https://mcp.test", "/", "https://mcp.test/.well-known/oauth-protected-resource",
     ["/.well-known/oauth-protected-resource"]),
])
def test_metadata_location(audience, mcp_path, url, paths):
    settings = auth(audience=audience)
    assert metadata_url(settings) == url
    assert list(metadata_paths(settings, mcp_path)) == paths


def test_metadata_url_override():
    assert metadata_url(auth(resource_metadata_url="https://docs.test/prm")) == "https://docs.test/prm"


def test_metadata_document():
    assert metadata_document(auth(required_scopes=["mcp:read"])) == {
        "resource": "https://mcp.test/mcp",
        "authorization_servers": ["https://idp.test"],
        "bearer_methods_supported": ["header"],
        "scopes_supported": ["mcp:read"],
    }
    assert "scopes_supported" not in metadata_document(auth())
    assert metadata_document(auth(required_scopes=["a"], scopes_supported=["b"]))["scopes_supported"] == ["b"]


def test_check_config_names_the_problem(tmp_path: Path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"auth": {**BASE, "audience": None}}))
    assert main(["check-config", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "  auth: " in err and "audience is required" in err
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump({"auth": BASE}))
    assert main(["check-config", str(good)]) == 0
    assert "auth: jwt" in capsys.readouterr().out


def test_pipeline_authenticates_after_origin_and_before_body_limits():
    from gateway.app import pipeline
    from gateway.policies.auth import NoAuth
    from gateway.policies.jwt_auth import JwtAuth
    from gateway.policies.limits import RequestLimits
    from gateway.policies.origin import OriginPolicy

    jwt_steps = [step.cls for step in pipeline(load_settings(None, auth=BASE))]
    none_steps = [step.cls for step in pipeline(load_settings(None))]
    # Digest §a.5: Origin (403) first, then authentication (401/403), then anything body-related.
    for steps, auth_cls in ((jwt_steps, JwtAuth), (none_steps, NoAuth)):
        assert steps.index(OriginPolicy) + 1 == steps.index(auth_cls) == steps.index(RequestLimits) - 1
    assert NoAuth not in jwt_steps and JwtAuth not in none_steps


async def test_bad_origin_is_403_before_any_token_check():
    import httpx

    from gateway.app import build_app

    app = build_app(load_settings(None, auth=BASE))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as client:
        hostile = await client.post("/mcp", headers={"origin": "https://evil.example"}, content=b"{}")
        tokenless = await client.post("/mcp", content=b"{}")
        metadata = await client.get("/.well-known/oauth-protected-resource/mcp")
    assert hostile.status_code == 403 and "www-authenticate" not in hostile.headers
    assert tokenless.status_code == 401
    assert metadata.status_code == 200 and metadata.json()["resource"] == BASE["audience"]
