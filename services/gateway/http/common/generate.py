"""One HTTP generation, whatever the route: resolve the model, render the prompt, size ``max_tokens``, generate
through the :class:`~services.gateway.core.gateway.Gateway` (a client that disconnects cancels its call).

The completion route renders raw text or ids; the chat routes (chat completions, Responses, Anthropic messages,
through :mod:`services.gateway.http.common.chat_service`) render chat messages with tools.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable

from fastapi import Request

from marti.errors import CancelledError, InvalidArgumentError, MartiError
from marti.types.inference import SamplingParams
from services.gateway.core.gateway import Gateway, Served
from services.gateway.http.common.context import (
    EPISODE_HEADER,
    GROUP_HEADER,
    IDEMPOTENCY_HEADER,
    episode_context,
    read_header,
)
from services.gateway.http.common.errors import request_error
from services.gateway.http.common.protocol import SampledRequest

#: Renders a request's prompt for the resolved agent and the call's episode: ``(agent, episode_id) -> token ids``.
Render = Callable[[str, str], Awaitable[list[int]]]


@dataclasses.dataclass(frozen=True)
class Sizing:
    """How a route names and sizes its output.

    Attributes:
        max_tokens: The request's limit on generated tokens, or None for ``default`` (or the room left).
        param: The field that carries it (``max_tokens``, ``max_completion_tokens``, ``max_output_tokens``).
        default: ``max_tokens`` when absent, or the room the model's context has left when that is less.
        prompt_param: The field that carries the prompt, named in errors about it (``messages``, ``prompt``).
        extra_stop: Stop strings the route adds to the request's own (one tool call at most: the call's end).
        extra_stop_why: Why the route adds them, said in the error when they take the stop strings over
            ``gateway.max_stop``.
    """

    max_tokens: int | None
    param: str
    default: int
    prompt_param: str
    extra_stop: tuple[str, ...] = ()
    extra_stop_why: str = ""


def _core_param(message: str, prompt_param: str, max_tokens_param: str) -> str | None:
    """The request field an InvalidArgumentError of the gateway core is about, read from its message (the core
    does not know the OpenAI field names); None when the message does not say reliably."""
    if message.startswith(("n must", "n is ")):
        return "n"
    # the prompt plus max_tokens exceed the context: max_tokens is the knob (a prompt alone that fills the
    # context is refused by the adapter itself, naming the prompt)
    if " and max_tokens is " in message:
        return max_tokens_param
    if message.startswith(("the prompt", "prompt token")):
        return prompt_param
    if "(gateway.max_stop" in message:  # max_stop and max_stop_chars
        return "stop"
    for key in ("episode_id", "group_id", "idempotency_key"):
        if message.startswith(f"{key} "):
            return key
    return None


#: The gateway core's id arguments -> the header that carries each (when the path does not).
_ID_HEADERS = {"episode_id": EPISODE_HEADER, "group_id": GROUP_HEADER, "idempotency_key": IDEMPOTENCY_HEADER}


def _name_param(exc: MartiError, request: Request, prompt_param: str, max_tokens_param: str) -> None:
    """Set ``exc.param`` (the request field) on a core error: read from its message when it has none (400s);
    an id argument of the core (``episode_id``, ``group_id``, ``idempotency_key``) becomes the header that
    carried it when the path did not (``X-Marti-Group``, ``Idempotency-Key``)."""
    param = getattr(exc, "param", None)
    if param is None and isinstance(exc, InvalidArgumentError):
        param = _core_param(exc.message, prompt_param, max_tokens_param)
    if param in _ID_HEADERS and not request.path_params.get(param):
        param = _ID_HEADERS[param]
    if param is not None:
        exc.param = param  # type: ignore[attr-defined]


async def serve_prompt(
    gateway: Gateway, request: Request, body: SampledRequest, render: Render, size: Sizing
) -> Served:
    """Resolve ``body.model``, render the prompt, size ``max_tokens`` and generate ``body.n`` choices.

    Raises:
        InvalidArgumentError: A bad request (``param`` set to the field when the message names one), or a chat
            template that refused the messages (naming ``size.prompt_param``).
        NotFoundError: Unknown model.  CancelledError: The client disconnected before its answer was ready.
        As :meth:`Gateway.generate` otherwise.
    """
    try:
        episode_id, group_id = episode_context(request)
        agent, _ = gateway.resolve(body.model)
        try:
            ids = await render(agent, episode_id)
        except Exception as exc:  # a chat template that refuses the conversation (jinja2's raise_exception)
            if type(exc).__module__.startswith("jinja2"):
                raise request_error(
                    f"the chat template of {agent!r} refused the messages: {exc}", size.prompt_param
                ) from exc
            raise
        max_tokens = size.max_tokens
        if max_tokens is None:
            room = gateway.backend.max_model_len(agent) - len(ids)
            if room <= 0:
                raise request_error(
                    f"the prompt has {len(ids)} tokens, which fills model {agent!r}'s context of "
                    f"{gateway.backend.max_model_len(agent)} tokens",
                    size.prompt_param,
                )
            max_tokens = min(size.default, room)
        sampling = body.sampling(max_tokens, size.param)
        extra = tuple(s for s in size.extra_stop if s not in sampling.stop)
        if extra:
            sampling = dataclasses.replace(sampling, stop=tuple(sampling.stop) + extra)
        try:
            return await _generate(gateway, request, body, ids, sampling, episode_id, group_id)
        except InvalidArgumentError as exc:
            added = _added_stops(exc, gateway, extra, size.extra_stop_why)
            if added is None:
                raise
            raise added from exc
    except MartiError as exc:
        _name_param(exc, request, size.prompt_param, size.param)
        raise


def _added_stops(
    exc: InvalidArgumentError, gateway: Gateway, extra: tuple[str, ...], why: str
) -> InvalidArgumentError | None:
    """None, or when the stop strings the route added (``extra``) took the request over ``gateway.max_stop``,
    a 400 naming ``stop`` that says the gateway added them, why, and how many the request may send."""
    if not extra or "(gateway.max_stop)" not in exc.message:
        return None
    room = gateway.limits.max_stop - len(extra)
    return request_error(
        f"{exc.message}, counting {list(extra)}, which the gateway added {why}; send at most {room} stop strings "
        "with this request",
        "stop",
    )


async def _generate(
    gateway: Gateway,
    request: Request,
    body: SampledRequest,
    ids: list[int],
    sampling: SamplingParams,
    episode_id: str,
    group_id: str,
) -> Served:
    """Generate through the gateway; the call is cancelled when the client disconnects (or this handler is)."""
    watcher = asyncio.ensure_future(_disconnect(request))

    async def gone() -> bool:
        return watcher.done() and not watcher.cancelled()

    work = asyncio.ensure_future(
        gateway.generate(
            body.model,
            ids,
            sampling,
            n=1 if body.n is None else body.n,
            episode_id=episode_id,
            group_id=group_id,
            idempotency_key=read_header(request, IDEMPOTENCY_HEADER),
            disconnected=gone,
        )
    )
    try:
        await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:  # the client went away, or this handler was cancelled (shutdown): the call is cancelled too
        watcher.cancel()
        if not work.done():
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
    if work.cancelled():
        raise CancelledError("the client disconnected before its answer was ready")
    return work.result()


async def _disconnect(request: Request) -> None:
    """Return once the client of ``request`` disconnects (its body was read already, so the next ASGI message
    is ``http.disconnect``)."""
    try:
        while (await request.receive())["type"] != "http.disconnect":
            pass
    except Exception:  # noqa: BLE001 - a transport that fails to receive has lost its client too
        return
