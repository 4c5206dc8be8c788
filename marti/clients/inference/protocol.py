"""What the sync and async inference clients share: the service's names, the token lookup and
:func:`open_channel` (the request builders and response decoding are :mod:`marti.codec.inference`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import grpc

from marti.rpc.client.channel import check_token, make_channel
from marti.rpc.client.transport import LoopBoundChannel

SERVICE = "marti.api.inference.v1.InferenceService"
#: Methods safe to retry on UNAVAILABLE (Generate records calls and ReportReward ends episodes: never retried).
IDEMPOTENT_METHODS = ((SERVICE, "ListModels"), (SERVICE, "GetStats"))
#: The gateway's own token variable, read before ``MARTI_TOKEN``.
TOKEN_ENV = "MARTI_GATEWAY_TOKEN"
#: Default deadline of each call, seconds (a generate call may wait in the gateway's queue and for its batch).
DEFAULT_INFERENCE_TIMEOUT_S = 120.0


def _token(token: str | None) -> str | None:
    """The token to send: ``token``, else ``MARTI_GATEWAY_TOKEN``; None lets the channel read ``MARTI_TOKEN``."""
    if token is not None:
        return token
    value = os.environ.get(TOKEN_ENV)
    if value:
        check_token(value, TOKEN_ENV)
        return value
    return None


def open_channel(
    address: str,
    *,
    token: str | None = None,
    tls_ca_file: str | None = None,
    aio: bool = False,
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.Channel | LoopBoundChannel:
    """Open a channel to an inference gateway, to share between clients through their ``channel=`` argument.

    Args:
        address: ``host:port`` of the gateway's gRPC endpoint.
        token: Bearer token; ``None`` reads ``MARTI_GATEWAY_TOKEN``, then ``MARTI_TOKEN``; ``""`` sends none.
        tls_ca_file: PEM CA file; enables TLS.
        aio: True for a channel of ``grpc.aio`` calls (for :class:`AsyncInferenceClient`), bound lazily to
            whichever event loop uses it (:class:`~marti.rpc.client.transport.LoopBoundChannel`).
        options: Extra grpc channel arguments.

    Returns:
        The channel; the caller closes it after the clients using it.

    Raises:
        InvalidArgumentError: The token (given or from the environment) is not printable ASCII.
    """
    return make_channel(
        address,
        token=_token(token),
        tls_ca_file=tls_ca_file,
        aio=aio,
        idempotent_methods=IDEMPOTENT_METHODS,
        options=options,
    )
