"""moto's in-process mock (``mock_aws``) for kinesumer's aiobotocore clients.

moto intercepts every botocore request through a ``before-send`` handler it adds to botocore's
built-in handlers, and answers with botocore's :class:`~botocore.awsrequest.AWSResponse`, whose
``content`` is bytes. aiobotocore awaits ``content`` (its own ``AioAWSResponse``), hence the
``TypeError: object bytes can't be used in 'await' expression`` a user meets without this
module (aio-libs/aiobotocore#1320, getmoto/moto#8694).

:func:`adapt_session` swaps moto's handler, in one aiobotocore session, for one that asks moto
and wraps its answer in an awaitable response. kinesumer's client factory calls it only when
moto's module is already loaded (:func:`kinesumer.aws.clients.moto_loaded`): this module
imports moto, and is imported only then. While no mock is active, moto's handler answers None
and the request goes to the network as it would without moto.
"""

from __future__ import annotations

from typing import Any

from aiobotocore.awsrequest import AioAWSResponse
from moto.core.models import botocore_stubber

from ..errors import InProcessMockUnsupportedError

#: Operations whose answer is an HTTP/2 event stream: moto's in-process mock cannot carry them.
STREAMING_OPERATIONS = frozenset({"before-send.kinesis.SubscribeToShard"})


class _BufferedBody:
    """The body of a mocked answer, read the way aiobotocore reads aiohttp's (awaited)."""

    def __init__(self, body: bytes) -> None:
        self._body = body

    async def read(self, amount: int = -1) -> bytes:
        body, self._body = self._body, b""
        return body


def enhanced_fan_out_unsupported() -> InProcessMockUnsupportedError:
    return InProcessMockUnsupportedError(
        "enhanced fan-out (SubscribeToShard) streams events over HTTP/2, which moto's in-process "
        "mock_aws cannot carry, and moto serves no SubscribeToShard in server mode either (the "
        "local_aws fixture of the kinesumer.testing plugin): test enhanced fan-out against a "
        "kinesis-mock endpoint (LocalStack, or the kinesis-local npm package), and test the "
        "rest with enhanced_fan_out=False under mock_aws or local_aws"
    )


def _awaitable_answer(event_name: str, request: Any, **kwargs: Any) -> AioAWSResponse | None:
    if not botocore_stubber.enabled:
        return None
    if event_name in STREAMING_OPERATIONS:
        raise enhanced_fan_out_unsupported()
    answer = botocore_stubber(event_name, request, **kwargs)
    if answer is None:
        return None  # not a URL moto mocks: it goes to the network
    body = answer.raw.read() if answer.raw is not None else b""
    return AioAWSResponse(answer.url, answer.status_code, answer.headers, _BufferedBody(body))


def adapt_session(session: Any) -> None:
    """In the aiobotocore ``session``, answer with moto's mock in a form aiobotocore awaits."""
    session.unregister("before-send", botocore_stubber)
    session.register("before-send", _awaitable_answer)


def mock_active() -> bool:
    """Whether a ``mock_aws`` (decorator, context manager or ``start()``) is active now."""
    return bool(botocore_stubber.enabled)
