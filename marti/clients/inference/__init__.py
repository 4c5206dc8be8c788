"""Typed clients of the inference gateway (``marti.api.inference.v1.InferenceService``).

* :class:`InferenceClient` (sync) and :class:`AsyncInferenceClient` (``grpc.aio``): ``generate`` (``n``
  completions of a chat conversation, raw text or token ids, with their exact token ids and log-probabilities),
  ``generate_stream`` (the same, token by token), ``models``, ``report_reward`` (ends an episode: its recorded
  calls become training data), ``stats``.
* :func:`report_reward`: one report over a channel of its own, for a process that only scores episodes.

Pass the same ``episode_id`` to every ``generate`` call of an episode (and a ``group_id`` per problem) and report
the episode's rewards once it ends. Clients return :mod:`marti.types.inference` types, never protos, and every gRPC
error becomes the matching :class:`marti.errors.MartiError` subclass: ``NotFoundError`` (unknown model),
``InvalidArgumentError`` (bad request, prompt too long), ``ResourceExhaustedError`` (overloaded: retry later),
``FailedPreconditionError`` (episode already reported), ``UnauthenticatedError`` (missing or wrong token).

The bearer token is ``token`` when given (``""`` sends none), else ``MARTI_GATEWAY_TOKEN``, else ``MARTI_TOKEN``.

Modules (the broker package's layout): :mod:`.protocol` (service names, token lookup, :func:`open_channel`),
:mod:`.stream` (streamed ``generate``), :mod:`.sync_client` and :mod:`.async_client`; the result types are
:mod:`marti.types.inference`'s and the request builders :mod:`marti.codec.inference`'s.
"""

from __future__ import annotations

from .async_client import AsyncInferenceClient, report_reward_async
from .protocol import DEFAULT_INFERENCE_TIMEOUT_S, IDEMPOTENT_METHODS, SERVICE, TOKEN_ENV, open_channel
from .stream import AsyncCompletionStream, CompletionStream
from .sync_client import InferenceClient, report_reward

__all__ = [
    "DEFAULT_INFERENCE_TIMEOUT_S",
    "IDEMPOTENT_METHODS",
    "SERVICE",
    "TOKEN_ENV",
    "AsyncCompletionStream",
    "AsyncInferenceClient",
    "CompletionStream",
    "InferenceClient",
    "open_channel",
    "report_reward",
    "report_reward_async",
]
