"""The request side of one ``Sample`` stream: credits and acks the client sends, read by a background task."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from marti.api.experience.v1 import experience_service_pb2 as spb


class SampleStream:
    """Reads a ``Sample`` request stream after its first request: adds each request's ``num_samples`` to
    :attr:`credits` and counts its ``ack``.

    Args:
        requests: The request iterator, its first request already read.
        credits: The first request's ``num_samples``.
    """

    def __init__(self, requests: AsyncIterator[spb.SampleRequest], credits: int) -> None:
        self.credits = credits
        self.done = False  # the client closed its side (or the stream broke)
        self._acks = 0
        self._changed = asyncio.Event()
        self._reader = asyncio.ensure_future(self._read(requests))

    async def _read(self, requests: AsyncIterator[spb.SampleRequest]) -> None:
        try:
            async for req in requests:
                self.credits += req.num_samples
                self._acks += req.ack
                self._changed.set()
        finally:
            self.done = True
            self._changed.set()

    async def _wait_change(self) -> None:
        self._changed.clear()
        await self._changed.wait()

    async def wait_credits(self) -> bool:
        """Wait until there are credits (True) or the client closed its side with none left (False)."""
        while self.credits <= 0:
            if self.done:
                return False
            await self._wait_change()
        return True

    async def wait_ack(self, timeout_s: float) -> bool:
        """Consume one ack: True once it came, False when the client closed its side first or ``timeout_s``
        seconds passed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._acks <= 0:
            remaining = deadline - loop.time()
            if self.done or remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wait_change(), remaining)
        self._acks -= 1
        return True

    async def close(self) -> None:
        """Stop reading."""
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader
