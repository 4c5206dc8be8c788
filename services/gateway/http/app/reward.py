"""The reward route (``POST /v1/episodes/{episode_id}/reward``, also under the traced prefixes): its body, which
refuses unknown keys, and its handlers (see :mod:`services.gateway.http`, "Where things are")."""

from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import ConfigDict, Field, StrictBool, StrictInt, field_validator

from marti.errors import InvalidArgumentError
from services.gateway.core.gateway import Gateway
from services.gateway.http.common.context import EPISODE_HEADER, GROUP_HEADER, check_path, read_header
from services.gateway.http.common.errors import request_error
from services.gateway.http.common.protocol import _Body, _Float, _Str


class RewardRequest(_Body):
    """Body of ``POST /v1/episodes/{episode_id}/reward`` (see :meth:`Gateway.report`); unknown keys are refused
    (400 naming them), so a typo never trains as reward 0 or as a group of one, and so is an empty ``group_id``
    (400 naming it; leave it out, or send null, for no group), as an empty ``X-Marti-Group`` header is."""

    model_config = ConfigDict(extra="forbid")

    rewards: dict[_Str, _Float] = Field(default_factory=dict)
    call_rewards: dict[_Str, _Float] | None = None
    group_id: _Str | None = None
    group_size: StrictInt | None = 0
    failed: StrictBool | None = False

    @field_validator("group_id")
    @classmethod
    def _group_id_not_empty(cls, v: str | None) -> str | None:
        if v == "":
            raise ValueError(
                "group_id is empty; send the group's id, or leave group_id out (or null) for an episode without "
                "a group"
            )
        return v


async def report(gateway: Gateway, request: Request, episode_id: str, body: RewardRequest) -> JSONResponse:
    """Report one episode (both reward routes; ``X-Marti-Episode`` and ``X-Marti-Group`` headers, when sent, as
    :func:`_with_headers` reads them): 200 ``{"episode_id", "released", "dropped"}``, 202 with
    ``"queued"`` when released episodes were not inserted within ``gateway.report_wait_s``; ``"stale"`` (see
    :class:`~marti.types.inference.StaleCalls`) when calls of the released episodes are already past
    their agent's staleness bound."""
    check_path(request)
    body = _with_headers(request, episode_id, body)
    try:
        released = await gateway.report(
            episode_id,
            dict(body.rewards),
            call_rewards=dict(body.call_rewards) if body.call_rewards else None,
            group_id=body.group_id or "",
            group_size=body.group_size or 0,
            failed=bool(body.failed),
        )
    except InvalidArgumentError as exc:
        if getattr(exc, "param", None) is None and exc.message.startswith(("episode_id ", "group_id ")):
            exc.param = exc.message.split(" ", 1)[0]  # type: ignore[attr-defined]
        raise
    out: dict[str, Any] = {"episode_id": episode_id, "released": len(released.episodes)}
    out["dropped"] = released.dropped
    if released.stale:
        out["stale"] = [dataclasses.asdict(s) for s in released.stale]
    if released.queued:  # accepted, inserted in the background: 202 with the count (a 200 body has none)
        return JSONResponse({**out, "queued": released.queued}, status_code=202)
    return JSONResponse(out)


def _with_headers(request: Request, episode_id: str, body: RewardRequest) -> RewardRequest:
    """``body`` with the group of an ``X-Marti-Group`` header (the header a client sends with its calls, read
    here too rather than ignored) when the body gives none.

    Raises:
        InvalidArgumentError: An ``X-Marti-Episode`` header naming another episode than the path, or an
            ``X-Marti-Group`` header naming another group than the body (naming the header).
    """
    episode = read_header(request, EPISODE_HEADER)
    if episode and episode != episode_id:
        raise request_error(
            f"header {EPISODE_HEADER} names episode {episode!r} but the report is for episode {episode_id!r} "
            "(the path): send the report to its own episode's path",
            EPISODE_HEADER,
        )
    group = read_header(request, GROUP_HEADER)
    if group and body.group_id and body.group_id != group:
        raise request_error(
            f"header {GROUP_HEADER} names group {group!r} but the body names group_id {body.group_id!r}",
            GROUP_HEADER,
        )
    return body.model_copy(update={"group_id": group}) if group else body


async def report_under_prefix(
    gateway: Gateway, request: Request, prefix_episode: str, episode_id: str, body: RewardRequest
) -> JSONResponse:
    """The reward route under a traced ``base_url``: the prefix's episode must be ``episode_id``; its group (when
    the prefix has one) is the report's ``group_id``.

    Raises:
        InvalidArgumentError: The prefix and the report name different episodes, or different groups.
    """
    group = request.path_params.get("prefix_group", "")
    if prefix_episode != episode_id:
        raise request_error(
            f"the base URL names episode {prefix_episode!r} but the report is for episode {episode_id!r}; "
            "post a report under its own episode's prefix, or to /v1/episodes/{episode_id}/reward",
            "episode_id",
        )
    if group and body.group_id and body.group_id != group:
        raise request_error(
            f"the base URL names group {group!r} but the body names group_id {body.group_id!r}",
            "group_id",
        )
    if group:
        body = body.model_copy(update={"group_id": group})
    return await report(gateway, request, episode_id, body)
