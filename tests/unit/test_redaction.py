"""Redaction: detectors from detect-secrets and configured literals, typed placeholders."""

from __future__ import annotations

import pytest

from agentbox.policy.redaction import Redactor

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


# One sample per detector family, plus case and non-ASCII variants: the prefilters must
# never change what the regexes alone would find.
SAMPLES = [
    f"key={AWS}",
    "aws_secret_key = 'wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEYab'",
    "mailchimp 0123456789abcdef0123456789abcdef-us12 end",
    "bot 123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsawabc",
    "xoxb-123456789012-1234567890123-abcdefABCDEF",
    "https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX",
    "SK" + "0123456789abcdef" * 2,
    "SG." + "a" * 22 + "." + "b" * 43,
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl",
    "//registry.npmjs.org/:_authToken=abcdef12-3456-7890-abcd-ef1234567890",
    "https://admin:hunter2hunter2@db.internal.test/x",
    "DefaultEndpointsProtocol=https;AccountKey=" + "a" * 86 + "==",
    "glpat-" + "a" * 20,
    "sk-" + "a" * 20 + "T3BlbkFJ" + "b" * 20,
    "pypi-AgEIcHlwaS5vcmc" + "A" * 70,
    "sq0csp-" + "a" * 43,
    "AKC" + "a" * 12 + " ",
    " AP6" + "b" * 10 + " ",
    "PASSWORD=" + "a" * 30,
    "cloudant_pa\u017fs = 'abcdefghijklmnopqrstuvwx'",  # U+017F matches "s" case-insensitively
    "CLOUDANT_PASSWORD = 'ABCDEFGHIJKLMNOPQRSTUVWX'",
    "\u0131bm_cloud_\u0131am_key: " + "A" * 44,  # U+0131 matches "i" case-insensitively
    "XOXB-123456789012-1234567890123-abcdefABCDEF",
    KEY,
    "x" * 1024,
]


@pytest.mark.parametrize("text", SAMPLES)
def test_prefilters_never_hide_a_match(redactor: Redactor, text: str) -> None:
    brute = {
        (d.kind, m.start(), m.end())
        for d in redactor.detectors
        for m in d.pattern.finditer(text)
        if m.end() > m.start()
    }
    found = {(f.kind, f.start, f.end) for f in redactor.findings(text)}
    assert found == brute
