"""The sync inference client (:class:`InferenceClient`) and :func:`report_reward` over a channel of its own."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import grpc

from marti.api.inference.v1 import inference_pb2 as pb
from marti.api.inference.v1 import inference_service_pb2_grpc as sgrpc
from marti.codec.inference import (
    generate_request,
    models_from_proto,
    receipt_from_proto,
    report_request,
    result_from_proto,
)
from marti.plumbing.arguments import checked
from marti.rpc.client.calls import call
from marti.rpc.client.guard import ClientChannel
from marti.types.inference import ChatMessages, InferenceResult, ModelInfo, RewardReceipt

from .protocol import DEFAULT_INFERENCE_TIMEOUT_S, open_channel
from .stream import CompletionStream


class InferenceClient:
    """Synchronous client of the inference gateway.

    Args:
        address: ``host:port`` of the gateway's gRPC endpoint.
        token: Bearer token; ``None`` reads ``MARTI_GATEWAY_TOKEN``, then ``MARTI_TOKEN``; ``""`` sends none.
        tls_ca_file: PEM CA file; enables TLS.
        timeout_s: Default deadline of each call, seconds.
        channel: An open channel to use instead of dialing (from :func:`open_channel`; ``token`` and
            ``tls_ca_file`` are then ignored); not closed by :meth:`close`.

    Raises:
        InvalidArgumentError: The token (given or from the environment) is not printable ASCII; raised at
            construction, before any rpc.
    """

    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        tls_ca_file: str | None = None,
        timeout_s: float = DEFAULT_INFERENCE_TIMEOUT_S,
        channel: grpc.Channel | None = None,
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._own_channel = channel is None
        self.channel = channel or open_channel(address, token=token, tls_ca_file=tls_ca_file)
        self.channel = ClientChannel(self.channel, f"the inference client of {address or 'its channel'}")
        self.stub = sgrpc.InferenceServiceStub(self.channel)

    @checked
    def generate(
        self,
        model: str,
        messages: ChatMessages | None = None,
        *,
        text: str | None = None,
        token_ids: Sequence[int] | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int = 0,
        stop: str | Sequence[str] = (),
        seed: int | None = None,
        n: int = 1,
        episode_id: str = "",
        group_id: str = "",
        idempotency_key: str = "",
        timeout_s: float | None = None,
    ) -> InferenceResult:
        """Sample ``n`` completions of one prompt with an agent's policy.

        Args:
            model: An agent id (its current policy) or ``agent@VERSION`` (a resident version; see :meth:`models`).
            messages: A chat conversation (``[{"role": ..., "content": ...}]``, the agent's chat template is
                applied; ``content`` a string, a list of ``{"type": "text", "text": ...}`` parts joined with
                newlines, or None in an assistant message; any other key set, such as ``tool_calls``, is an
                InvalidArgumentError: this call has no tools); or
            text: Raw text (no special tokens added); or
            token_ids: Token ids of the agent's tokenizer. Exactly one of the three.
            max_tokens: Most tokens per completion (None: 64, or the room the context leaves after the
                prompt when that is less).
            temperature: >= 0, 0 is greedy (None: 1).  top_p: In (0, 1] (None: 1).  top_k: 0 disables it.
            stop: Stop strings (the text is cut before the first match).
            seed: Makes sampling reproducible for equal requests.
            n: Completions to sample, >= 1 (the gateway caps it).
            episode_id: Your episode id: the call is recorded for training until you report the episode.
            group_id: Your group (problem) id of the episode.
            idempotency_key: Your key of this call within the episode: a retry with the same key, while the
                episode is open, gets the first call's answer (same call ids), recorded once. A traced call whose
                deadline passed or that was cancelled before its answer is not recorded.
            timeout_s: Deadline of this call, seconds (default: the client's).

        Returns:
            The completions with their exact token ids, log-probabilities, call ids and policy versions.

        Raises:
            NotFoundError: Unknown model or non-resident version.
            InvalidArgumentError: A bad argument, or the prompt plus ``max_tokens`` exceeds the model's context.
            ResourceExhaustedError: The gateway is overloaded (retry later).
            FailedPreconditionError: ``episode_id`` was already reported.
            UnauthenticatedError: Missing or wrong token.  DeadlineExceededError, UnavailableError.
        """
        req = generate_request(
            model, messages, text=text, token_ids=token_ids, max_tokens=max_tokens, temperature=temperature,
            top_p=top_p, top_k=top_k, stop=stop, seed=seed, n=n, episode_id=episode_id, group_id=group_id,
            idempotency_key=idempotency_key,
        )  # fmt: skip
        return result_from_proto(call(self.stub.Generate, req, timeout_s or self.timeout_s))

    def generate_stream(
        self,
        model: str,
        messages: ChatMessages | None = None,
        *,
        timeout_s: float | None = None,
        **kwargs: Any,
    ) -> CompletionStream:
        """Like :meth:`generate`, token by token: returns a :class:`CompletionStream` of
        :class:`CompletionDelta` events (the gateway sends them once the completions are generated).

        Args:
            model, messages, timeout_s: As :meth:`generate` (the deadline covers the whole stream).
            **kwargs: The other keyword arguments of :meth:`generate`.

        Raises:
            As :meth:`generate`, when opening the stream.
        """
        req = generate_request(model, messages, **kwargs)
        call = self.stub.GenerateStream(
            pb.GenerateStreamRequest(request=req), timeout=timeout_s or self.timeout_s
        )
        return CompletionStream(call)

    def models(self) -> list[ModelInfo]:
        """Every servable model name: each agent, then each resident ``agent@VERSION``."""
        return models_from_proto(call(self.stub.ListModels, pb.ListModelsRequest(), self.timeout_s))

    @checked
    def report_reward(
        self,
        episode_id: str,
        rewards: Mapping[str, float],
        *,
        call_rewards: Mapping[str, float] | None = None,
        group_id: str = "",
        group_size: int = 0,
        failed: bool = False,
        timeout_s: float | None = None,
    ) -> RewardReceipt:
        """End an episode: its recorded calls become training data with these rewards.

        Args:
            episode_id: The ``episode_id`` its ``generate`` calls carried.
            rewards: Per trained agent, its return (an agent left out gets the sum of its call rewards, or 0).
            call_rewards: Per call id (:attr:`Completion.call_id`), a reward for that call.
            group_id: The episode's group, when its calls carried none (then it must be a group the calls of
                another episode carried: one no call carried is refused, :class:`~marti.errors.NotFoundError`);
                ``""`` = the calls' group (or, without one, a group of its own). It never overrides a group the
                calls carried: naming another one is refused (:class:`~marti.errors.FailedPreconditionError`,
                both ids named).
            group_size: Episodes in the group; > 0 holds this one until the whole group reported.
            failed: The episode failed: drop it with its group (never trained).
            timeout_s: Deadline of this call, seconds.

        Returns:
            How many episodes this report released and dropped, how many of the released ones the gateway had
            not inserted into training yet when it answered (``queued``; inserted in the background), and which
            agents' calls are already past their staleness bound (``stale``, :class:`~marti.types.inference.StaleCalls`:
            training will drop them; empty when none is).

        Raises:
            InvalidArgumentError: Empty episode id, an agent that is not trained, an unknown call id, a
                non-finite reward.
            FailedPreconditionError: The episode was already reported (or abandoned), or ``group_id`` differs
                from the group its calls carried.
            ResourceExhaustedError: The gateway's backlog of episodes waiting to be inserted is full
                (``gateway.max_backlog_episodes``); nothing changed, report again later.
            NotFoundError: No call of the episode was recorded, or ``group_id`` names a group no call carried.
            InternalError: The gateway could not store the episode.
        """
        req = report_request(episode_id, rewards, call_rewards, group_id, group_size, failed)
        return receipt_from_proto(call(self.stub.ReportReward, req, timeout_s or self.timeout_s))

    def stats(self) -> dict[str, float]:
        """The gateway's counters (calls, released, dropped, open episodes, batches, ...; see the proto)."""
        return dict(call(self.stub.GetStats, pb.GetStatsRequest(), self.timeout_s).counters)

    def close(self) -> None:
        """Close the channel (when this client dialed it); later calls raise the closed-client
        ``FailedPreconditionError``."""
        self.channel.mark_closed()
        if self._own_channel:
            self.channel.close()

    def __enter__(self) -> InferenceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@checked
def report_reward(
    address: str,
    episode_id: str,
    rewards: Mapping[str, float],
    *,
    token: str | None = None,
    tls_ca_file: str | None = None,
    timeout_s: float = DEFAULT_INFERENCE_TIMEOUT_S,
    **kwargs: Any,
) -> RewardReceipt:
    """Report one episode's rewards to the gateway at ``address`` over a channel of its own (``marti.report_reward``).

    Args:
        address: ``host:port`` of the gateway.  episode_id, rewards: See :meth:`InferenceClient.report_reward`.
        token: Bearer token (``None``: ``MARTI_GATEWAY_TOKEN``, then ``MARTI_TOKEN``).
        tls_ca_file: PEM CA file; enables TLS.  timeout_s: Deadline, seconds.
        **kwargs: ``call_rewards``, ``group_id``, ``group_size``, ``failed``.

    Raises:
        As :meth:`InferenceClient.report_reward`.
    """
    with InferenceClient(address, token=token, tls_ca_file=tls_ca_file, timeout_s=timeout_s) as client:
        return client.report_reward(episode_id, rewards, **kwargs)
