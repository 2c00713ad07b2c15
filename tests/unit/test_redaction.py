"""Redaction: detectors from detect-secrets and configured literals, typed placeholders."""

from __future__ import annotations

import pytest

from agentbox.gateway.redaction import Redactor

AWS = "AKIAIOSFODNN7EXAMPLE"
GITHUB = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
KEY = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7\nabc\n-----END RSA PRIVATE KEY-----"


@pytest.fixture(scope="module")
def redactor() -> Redactor:
    return Redactor({"GITHUB_TOKEN": "s3cr3t-literal-value"})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"key={AWS} done", "key=[REDACTED:aws-access-key] done"),
        (f"token {GITHUB}\n", "token [REDACTED:github-token]\n"),
        (f"before\n{KEY}\nafter", "before\n[REDACTED:private-key]\nafter"),
        ("x s3cr3t-literal-value y", "x [REDACTED:GITHUB_TOKEN] y"),
        ("sk_live_4eC39HqLyjWDarjtT1zdp7dc", "[REDACTED:stripe-access-key]"),
    ],
)
def test_secrets_become_typed_placeholders(redactor: Redactor, text: str, expected: str) -> None:
    assert redactor.redact(text) == expected


def test_ordinary_output_is_untouched(redactor: Redactor) -> None:
    text = "hello world\n============================= 12 passed in 0.31s\n/usr/bin/python3 3.11.2"
    assert redactor.redact(text) == text


def test_bytes_keep_invalid_utf8_around_findings(redactor: Redactor) -> None:
    data = b"\xff\xfe " + AWS.encode() + b" \x80"
    assert redactor.redact_bytes(data) == b"\xff\xfe [REDACTED:aws-access-key] \x80"


def test_every_occurrence_and_overlaps(redactor: Redactor) -> None:
    out = redactor.redact(f"{AWS} and {AWS}")
    assert AWS not in out and out.count("[REDACTED:aws-access-key]") == 2


def test_literals_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_TOKEN", "value-from-the-env-123")
    r = Redactor.from_env(["MY_TOKEN", "UNSET_VARIABLE"], detectors=False)
    assert r.redact("a value-from-the-env-123 b") == "a [REDACTED:MY_TOKEN] b"


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("cloudant_password = 'abcdefghijklmnopqrstuvwx'", "cloudant-credentials"),
        ("ibm_cloud_iam_key: " + "A" * 44, "ibm-cloud-iam-key"),
        ("SOFTLAYER_API_KEY=" + "a" * 64, "softlayer-credentials"),
        ("https://user:" + "a" * 24 + "@acct.cloudant.com", "cloudant-credentials"),
    ],
)
def test_keyword_detectors_still_fire_behind_their_prefilter(
    redactor: Redactor, text: str, kind: str
) -> None:
    assert f"[REDACTED:{kind}]" in redactor.redact(text)
