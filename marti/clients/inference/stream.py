"""A streamed ``generate``: :class:`CompletionStream` (sync) and :class:`AsyncCompletionStream` (``grpc.aio``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc

from marti.api.inference.v1 import inference_pb2 as pb
from marti.codec.inference import StreamAssembler
from marti.errors import InternalError
from marti.rpc.client.calls import rpc_errors
from marti.types.inference import CompletionDelta, InferenceResult


class CompletionStream:
    """A streamed ``generate`` (sync): iterate it for :class:`CompletionDelta` events.

    Every token of completion 0 comes first, then its final event, then completion 1, and so on. The header is
    read when the stream is opened, so :attr:`agent`, :attr:`prompt_token_ids` and :attr:`n` are set at once.

    Attributes:
        agent: The agent that served it.  prompt_token_ids: The prompt as the model saw it.
        n: Completions that follow.
    """

    def __init__(self, call: Any) -> None:
        self._call = call
        try:
            with rpc_errors():
                first = next(call)
        except StopIteration:
            raise InternalError("the GenerateStream stream ended before its header") from None
        self._asm = StreamAssembler(first)
        self.agent, self.prompt_token_ids, self.n = self._asm.agent, self._asm.prompt_token_ids, self._asm.n

    def __iter__(self) -> Iterator[CompletionDelta]:
        with rpc_errors():
            for msg in self._call:
                yield self._asm.delta(msg)

    def collect(self) -> InferenceResult:
        """Read the rest of the stream and assemble it into the result ``generate`` would return.

        Raises:
            InternalError: The stream ended before every completion's final event.
        """
        return self._asm.result(list(self))

    def cancel(self) -> None:
        """Stop reading: cancel the call (idempotent)."""
        self._call.cancel()

    def __enter__(self) -> CompletionStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()


class AsyncCompletionStream:
    """A streamed ``generate`` (``grpc.aio``): ``async for`` it for :class:`CompletionDelta` events.

    Built by :meth:`AsyncInferenceClient.generate_stream`, which reads the header first; see
    :class:`CompletionStream` for the order of events and the attributes.
    """

    def __init__(self, call: Any, header: pb.GenerateStreamResponse) -> None:
        self._call = call
        self._asm = StreamAssembler(header)
        self.agent, self.prompt_token_ids, self.n = self._asm.agent, self._asm.prompt_token_ids, self._asm.n

    @classmethod
    async def open(cls, call: Any) -> AsyncCompletionStream:
        """Read the header of ``call`` and return the stream.

        Raises:
            The call's error as a :class:`MartiError`; InternalError when it ends before its header.
        """
        with rpc_errors():
            first = await call.read()
        if first is grpc.aio.EOF:
            raise InternalError("the GenerateStream stream ended before its header")
        return cls(call, first)

    async def __aiter__(self) -> AsyncIterator[CompletionDelta]:
        while True:
            with rpc_errors():
                msg = await self._call.read()
            if msg is grpc.aio.EOF:
                return
            yield self._asm.delta(msg)

    async def collect(self) -> InferenceResult:
        """See :meth:`CompletionStream.collect`."""
        return self._asm.result([d async for d in self])

    def cancel(self) -> None:
        """Stop reading: cancel the call (idempotent)."""
        self._call.cancel()

    async def __aenter__(self) -> AsyncCompletionStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cancel()
