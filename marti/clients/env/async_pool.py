"""The ``grpc.aio`` pool of env servers (:class:`AsyncEnvPool`, also ``marti.aio.EnvPool``): the placement,
pinning and errors of :class:`~.pool.EnvPool` with awaitable calls."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from marti.errors import (
    MartiError,
)
from marti.plumbing.arguments import checked

from .addresses import resolve_env_servers
from .async_client import AsyncEnvClient
from .placement import _common_envs, _PoolBase, _Tries, name_server
from .types import SessionInfo, StepResult


class AsyncEnvPool(_PoolBase):
    """``grpc.aio`` twin of :class:`EnvPool` (same placement, pinning and errors; awaitable calls; no streams
    or envs). ``batch_step`` calls the servers concurrently.

    Args:
        addresses: As for :class:`EnvPool`.
        token: Bearer token; ``None`` reads ``MARTI_ENV_TOKEN``, then ``MARTI_TOKEN``.
        tls_ca_file: CA file for TLS.
        timeout_s: Per-call deadline, seconds.
        deltas: Ask for delta results.

    Raises:
        InvalidArgumentError, UnavailableError: As for :class:`EnvPool`.
    """

    def __init__(
        self,
        addresses: str | Sequence[str],
        *,
        token: str | None = None,
        tls_ca_file: str | None = None,
        timeout_s: float | None = None,
        deltas: bool = True,
    ) -> None:
        self.addresses = resolve_env_servers(addresses)
        self.clients = tuple(
            AsyncEnvClient(a, token=token, tls_ca_file=tls_ca_file, timeout_s=timeout_s, deltas=deltas)
            for a in self.addresses
        )
        self._init_routes()

    async def _routed(self, session_id: str, fn: Callable[[AsyncEnvClient], Any]) -> Any:
        i = self._routes.server(session_id)
        try:
            return await fn(self.clients[i])
        except MartiError as e:
            raise self._routes.failed(session_id, i, e) from None

    async def list_envs(self) -> list[dict[str, Any]]:
        """See :meth:`EnvPool.list_envs`."""

        async def one(a: str, c: AsyncEnvClient) -> list[dict[str, Any]]:
            try:
                return await c.list_envs()
            except MartiError as e:
                raise name_server(e, a) from None

        listings = await asyncio.gather(
            *(one(a, c) for a, c in zip(self.addresses, self.clients, strict=True))
        )
        return _common_envs(listings)

    @checked
    async def create_session(
        self, env_id: str, config: Mapping[str, Any] | None = None, seed: int | None = None
    ) -> SessionInfo:
        """See :meth:`EnvPool.create_session`."""
        tries = _Tries(self._placement, self.addresses)
        for i in tries:
            try:
                info = await self.clients[i].create_session(env_id, config, seed)
            except BaseException as e:
                if not tries.failed(i, e):
                    raise
                continue
            tries.succeeded(i)
            self._routes.add(info.session_id, i)
            return info
        assert tries.last is not None
        raise tries.last

    @checked
    async def reset(
        self,
        session_id: str,
        seed: int | None = None,
        options: Mapping[str, Any] | None = None,
        request_id: str | None = None,
    ) -> StepResult:
        """See :meth:`EnvPool.reset`."""
        return await self._routed(session_id, lambda c: c.reset(session_id, seed, options, request_id))

    @checked(own=("actions",))
    async def step(
        self, session_id: str, actions: Mapping[str, Any], request_id: str | None = None
    ) -> StepResult:
        """See :meth:`EnvPool.step`."""
        return await self._routed(session_id, lambda c: c.step(session_id, actions, request_id))

    @checked(own=("steps",))
    async def batch_step(
        self, steps: Sequence[tuple[str, Mapping[str, Any]]]
    ) -> list[StepResult | MartiError]:
        """See :meth:`EnvPool.batch_step`; the servers' calls are in flight together."""
        groups = self._routes.split(steps)
        out: list[Any] = [None] * len(steps)

        async def one(i: int, idx: list[int]) -> None:
            part = [steps[k] for k in idx]
            try:
                results: list[StepResult | MartiError] = await self.clients[i].batch_step(part)
            except MartiError as e:
                results = [e] * len(idx)
            self._routes.settle(i, idx, steps, results, out)

        await asyncio.gather(*(one(i, idx) for i, idx in groups.items()))
        return out

    @checked
    async def close_session(self, session_id: str) -> bool:
        """See :meth:`EnvPool.close_session`."""
        i = self._routes.drop(session_id)
        if i is None:
            return False
        try:
            return await self.clients[i].close_session(session_id)
        except MartiError as e:
            raise name_server(e, self.addresses[i]) from None

    async def close(self) -> None:
        """Close every server's channel."""
        for c in self.clients:
            await c.close()

    async def __aenter__(self) -> AsyncEnvPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
