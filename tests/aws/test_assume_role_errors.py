"""What a failed ``sts:AssumeRole`` is to a member (kinesumer.aws.clients.role_not_assumed):
worth trying again (TransientAWSError: readers pause and retry with backoff) or a verdict
(AccountAccessError: the member fails). Built from botocore's own exceptions, no AWS; and
STS's endpoint answering what is not STS's (a proxy's page with HTTP 200) through a local
fault proxy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import (
    ClientError,
    ConnectTimeoutError,
    CredentialRetrievalError,
    EndpointConnectionError,
    MetadataRetrievalError,
    NoCredentialsError,
    PartialCredentialsError,
    UnauthorizedSSOTokenError,
)
from botocore.parsers import ResponseParserError
from support.faultproxy import Fault, FaultProxy

from kinesumer import AccountAccess, AccountAccessError, Config, TransientAWSError
from kinesumer.aws import RequestStats, clients
from kinesumer.aws.retry import MalformedAnswer

B = "111111111111"
ROLE_B = f"arn:aws:iam::{B}:role/orders-reader"
BASE: dict[str, Any] = {"app": "app", "dynamodb_table": "state", "region": "us-east-1"}


def sts_error(code: str, status: int) -> ClientError:
    meta = {"HTTPStatusCode": status}
    return ClientError(
        {"Error": {"Code": code, "Message": code}, "ResponseMetadata": meta}, "AssumeRole"
    )


TRANSIENT: list[tuple[str, BaseException, str]] = [
    ("throttled", sts_error("Throttling", 400), "STS kept failing"),
    ("sts-500", sts_error("InternalFailure", 500), "STS kept failing"),
    ("sts-503-unknown-code", sts_error("SomethingNew", 503), "STS kept failing"),
    (
        "unreachable",
        EndpointConnectionError(endpoint_url="https://sts.us-east-1.amazonaws.com"),
        "STS kept failing",
    ),
    (
        "connect-timeout",
        ConnectTimeoutError(endpoint_url="https://sts.us-east-1.amazonaws.com"),
        "STS kept failing",
    ),
    ("retries-spent", TransientAWSError("sts.AssumeRole kept failing"), "STS kept failing"),
    (
        "ecs-credentials",
        CredentialRetrievalError(provider="container-role", error_msg="read timeout"),
        "own credentials could not be fetched",
    ),
    (
        "imds",
        MetadataRetrievalError(error_msg="169.254.169.254 timed out"),
        "own credentials could not be fetched",
    ),
    (
        "proxy-page",
        ResponseParserError("Unable to parse response (syntax error), invalid XML received"),
        "not STS's",
    ),
    ("no-credentials-in-answer", MalformedAnswer("no Credentials"), "not STS's"),
]

#: (case, error, what the message tells to check)
PERMANENT: list[tuple[str, BaseException, str]] = [
    ("role-refused", sts_error("AccessDenied", 403), "trust policy"),
    ("region-disabled", sts_error("RegionDisabledException", 403), "trust policy"),
    ("bad-request", sts_error("ValidationError", 400), "trust policy"),
    ("caller-key-unknown", sts_error("InvalidClientTokenId", 403), "own credentials were refused"),
    ("caller-token-expired", sts_error("ExpiredToken", 400), "own credentials were refused"),
    ("wrong-secret", sts_error("SignatureDoesNotMatch", 403), "own credentials were refused"),
    ("no-credentials", NoCredentialsError(), "trust policy"),
    ("partial-credentials", PartialCredentialsError(provider="env", cred_var="x"), "trust"),
    ("sso-expired", UnauthorizedSSOTokenError(), "trust policy"),
]


@pytest.mark.parametrize(("case", "error", "says"), TRANSIENT, ids=[c[0] for c in TRANSIENT])
def test_what_heals_is_transient_not_a_refused_role(
    case: str, error: BaseException, says: str
) -> None:
    verdict = clients.role_not_assumed(Config(**BASE, role_arn=ROLE_B), ROLE_B, error)
    assert isinstance(verdict, TransientAWSError)
    assert not isinstance(verdict, AccountAccessError)
    assert says in str(verdict) and "the role itself was not refused" in str(verdict)
    assert ROLE_B in str(verdict) and B in str(verdict)


@pytest.mark.parametrize(("case", "error", "says"), PERMANENT, ids=[c[0] for c in PERMANENT])
def test_a_refusal_or_the_callers_own_credentials_refused_is_permanent(
    case: str, error: BaseException, says: str
) -> None:
    verdict = clients.role_not_assumed(Config(**BASE, role_arn=ROLE_B), ROLE_B, error)
    assert isinstance(verdict, AccountAccessError)
    assert (verdict.account, verdict.role_arn, verdict.action) == (B, ROLE_B, "sts:AssumeRole")
    assert says in str(verdict)


def test_a_refusal_names_the_setting_that_gave_the_role() -> None:
    refused = sts_error("AccessDenied", 403)
    by_role = clients.role_not_assumed(Config(**BASE, role_arn=ROLE_B), ROLE_B, refused)
    assert "check Config.role_arn" in str(by_role)
    accounts = {B: AccountAccess(role_arn=ROLE_B)}
    by_account = clients.role_not_assumed(Config(**BASE, accounts=accounts), ROLE_B, refused)
    assert f"check Config.accounts[{B!r}]" in str(by_account)


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b"<html><body>Proxy login required</body></html>", "text/html"),
        (b"<html><body>Proxy login<br></body></html>", "text/html"),
        (b"<AssumeRoleResponse><AssumeRoleResult/></AssumeRoleResponse>", "text/xml"),
    ],
    ids=["xhtml-page", "html-page", "xml-without-credentials"],
)
async def test_an_sts_endpoint_answering_what_is_not_sts_is_transient(
    fault_proxy: Callable[[str], FaultProxy], body: bytes, content_type: str
) -> None:
    """A 200 answer that is not an AssumeRole answer (a proxy's page; XML without
    credentials) reaches the member as TransientAWSError, never as an unnamed parser error or
    a KeyError from a credential refresh."""
    proxy = fault_proxy("http://127.0.0.1:9")  # every AssumeRole is answered by the proxy
    proxy.add_rule(Fault.answer(body, content_type), service="sts", operation="AssumeRole")
    config = Config(**BASE, sts_endpoint=proxy.url, accounts={B: AccountAccess(role_arn=ROLE_B)})
    session = clients.assumed_role_session(config, RequestStats(), "m1", (ROLE_B, None))
    with pytest.raises(TransientAWSError, match="not STS's") as err:
        await clients.assume_now(session, B, ROLE_B)
    assert not isinstance(err.value, AccountAccessError)
