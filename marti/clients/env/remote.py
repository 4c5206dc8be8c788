"""The remote PettingZoo env that ``marti.make(address=...)`` returns (:class:`RemoteParallelEnv`)."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import grpc
import gymnasium
from pettingzoo import ParallelEnv

from marti.env.guard import (
    check_agent,
    closed_error,
)
from marti.errors import (
    BatchTooLargeError,
    InvalidArgumentError,
    MartiError,
    ResourceExhaustedError,
    SessionLostError,
    UnavailableError,
)
from marti.plumbing.arguments import checked

from .protocol import check_env_list
from .stream import SessionStream
from .sync_client import EnvClient
from .types import SessionInfo, StepResult

logger = logging.getLogger("marti.env.client")
#: Per channel, the ``max_batch_steps`` its env server refused a ``BatchStep`` with (learned by
#: :meth:`RemoteParallelEnv.step_batch`, which keeps later batches on that channel under it).
_BATCH_LIMITS: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


class RemoteParallelEnv(ParallelEnv):
    """A PettingZoo ``ParallelEnv`` backed by one env-server session (see module docstring).

    Build it with :meth:`create` (what ``marti.make(address=...)`` calls).

    Losing the session: sessions live in the server's memory, so a server restart (or, with the stream
    transport, a dropped stream, or with either transport, the idle reaper) loses them. The channel
    reconnects by itself and the stream transport opens a new stream; the env then carries on like this:

    * ``step`` on a lost session raises :class:`~marti.errors.SessionLostError` (a ``NotFoundError``), whose
      message says to call ``reset()``; every later ``step`` does the same until then;
    * ``reset`` on a lost session (known lost, or found lost by that very reset) creates a new session with
      the same env id (resolved ``name-vN``), config and creation seed, as ``marti.make`` did, then resets
      it with the given ``seed`` and ``options``. :attr:`session_id` changes; spaces and agents are the same.
      While the server is still away, ``reset`` raises ``UnavailableError`` and may be called again.

    Fork: with the stream transport (the default) the session lives on a stream of the process that made the
    env, which a forked child cannot use; there ``step``, ``reset`` and ``step_batch`` raise
    :class:`~marti.errors.FailedPreconditionError` at once (naming the parent's pid) and ``close`` only marks
    the child's copy closed (the session stays the parent's). Make a new env in the child, or make the env
    with ``transport="unary"``; two processes stepping one session interleave its steps.

    Args:
        client: The client (closed with the env when ``own_client``).
        info: The session.
        stream: The bidi stream the session lives on, or ``None`` to use unary calls.
        own_client: Close the client in :meth:`close`.
        config: The env config the session was created with (used to re-create a lost session).
        seed: The creation seed (used to re-create a lost session).
    """

    def __init__(
        self,
        client: EnvClient,
        info: SessionInfo,
        stream: SessionStream | None = None,
        own_client: bool = True,
        *,
        config: Mapping[str, Any] | None = None,
        seed: int | None = None,
    ) -> None:
        self.client = client
        self.session = info
        self.session_id = info.session_id
        self.env_id = info.env_id
        self._config = dict(config or {})
        self._seed = seed
        self._generation = stream.generation if stream is not None else 0
        self._lost: str | None = None
        self.possible_agents = [a.agent for a in info.agents]
        self.roles = {a.agent: a.role for a in info.agents}
        self._obs_spaces = {a.agent: a.observation_space for a in info.agents}
        self._act_spaces = {a.agent: a.action_space for a in info.agents}
        self.agents: list[str] = []
        self.acting_agents: list[str] = []
        self.metadata: dict[str, Any] = {"name": info.env_id, "render_modes": [], "metrics": info.metrics}
        self._own_client = own_client
        self._stream = stream
        self._closed = False
        #: Called once when the env is closed (an :class:`~marti.clients.env.EnvPool` frees its place).
        self.on_close: Callable[[], None] | None = None
        #: Set by an :class:`~marti.clients.env.EnvPool`: called with the error when a lost session cannot
        #: be re-created because its server is unreachable or full; it moves the env to another server of the
        #: pool (:meth:`adopt`) or raises.
        self.relocate: Callable[[MartiError], None] | None = None

    @classmethod
    def create(
        cls,
        address: str | None,
        env_id: str,
        *,
        config: Mapping[str, Any] | None = None,
        seed: int | None = None,
        token: str | None = None,
        tls_ca_file: str | None = None,
        timeout_s: float | None = None,
        transport: str = "stream",
        channel: grpc.Channel | None = None,
    ) -> RemoteParallelEnv:
        """Dial ``address`` (or use ``channel``) and create a session of ``env_id``.

        Args:
            address: ``host:port`` (only a label when ``channel`` is given; then it may be None).
            env_id: Env id.
            config: Env config.
            seed: Seed of the first reset without a seed.
            token: Bearer token; ``None`` reads ``MARTI_ENV_TOKEN``, then ``MARTI_TOKEN``.
            tls_ca_file: CA file for TLS.
            timeout_s: Per-call deadline, seconds.
            transport: ``"stream"`` (default: the session lives on a bidi stream and closes with it, so a
                client that disappears leaks nothing) or ``"unary"``; on both the server reaps a session unused for
                its idle timeout.
            channel: An open channel to the server (see :func:`open_channel`), shared with other envs and
                clients; the env never closes it. ``None`` dials a channel of its own, closed with the env.

        Raises:
            InvalidArgumentError: Bad transport, no address nor channel, unknown config key (named) or bad
                value.
            NotFoundError, ResourceExhaustedError, UnavailableError: From the server.
        """
        if transport not in ("stream", "unary"):
            raise InvalidArgumentError(f"transport must be 'stream' or 'unary', got {transport!r}")
        if address is None and channel is None:
            raise InvalidArgumentError("a remote env needs an address or a channel")
        client = EnvClient(
            address or "<channel>", token=token, tls_ca_file=tls_ca_file, timeout_s=timeout_s, channel=channel
        )
        stream = None
        try:
            if transport == "stream":
                stream = client.stream()
                info = stream.create_session(env_id, config, seed)
            else:
                info = client.create_session(env_id, config, seed)
        except BaseException:
            if stream is not None:
                stream.close()
            client.close()
            raise
        return cls(client, info, stream, config=config, seed=seed)

    def observation_space(self, agent: str) -> gymnasium.Space:
        """The agent's observation space (decoded once; the same object on every call).

        Raises:
            InvalidArgumentError: ``agent`` is not one of ``possible_agents`` (named), as in-process.
        """
        return self._obs_spaces[check_agent(agent, self.possible_agents)]

    def action_space(self, agent: str) -> gymnasium.Space:
        """The agent's action space (decoded once; the same object on every call).

        Raises:
            InvalidArgumentError: ``agent`` is not one of ``possible_agents`` (named), as in-process.
        """
        return self._act_spaces[check_agent(agent, self.possible_agents)]

    @property
    def session_lost(self) -> bool:
        """True once the env knows its session is gone (see the class docstring); ``reset()`` clears it."""
        return self._lost is not None

    def _lost_error(self, why: str) -> SessionLostError:
        return SessionLostError(
            f"the {self.env_id} session {self.session_id!r} is lost ({why}); call reset() to start a new "
            "session with the same env id, config and seed",
            session_id=self.session_id,
        )

    def _check_stream(self) -> None:
        """Mark the session lost when the stream it lived on broke (the server closed it with the stream)."""
        stream = self._stream
        if (
            stream is not None
            and self._lost is None
            and (stream.broken or stream.generation != self._generation)
        ):
            self._lost = "its session stream broke: the env server restarted or the connection dropped"

    def _refusal(self) -> MartiError | None:
        """The error a step of this env raises before sending anything (closed, or its session known lost), or
        ``None`` when a step may be sent."""
        if self._closed:
            return closed_error(self.env_id)
        self._check_stream()
        if self._lost is not None:
            return self._lost_error(self._lost)
        return None

    def _guarded(self, stream_fn: Any, unary_fn: Any) -> StepResult:
        """Run one session call, turning every way of losing the session into :class:`SessionLostError`.

        Raises:
            FailedPreconditionError: The env is closed.
        """
        if self._closed:
            raise closed_error(self.env_id)
        if self._stream is not None and self._stream.forked:
            raise self._stream._forked_error()
        refused = self._refusal()
        if refused is not None:
            raise refused
        try:
            return stream_fn() if self._stream is not None else unary_fn()
        except SessionLostError as e:
            self._lost = f"the env server does not know it: {e.message}"
            raise self._lost_error(self._lost) from e
        except MartiError as e:
            self._check_stream()
            if self._lost is not None:
                raise self._lost_error(f"{self._lost}; {type(e).__name__}: {e.message}") from e
            raise

    def _recreate(self) -> None:
        """Create a new session like the lost one (same resolved env id, config and creation seed)."""
        if self._stream is not None:
            info = self._stream.create_session(self.env_id, self._config, self._seed)
            self._generation = self._stream.generation
        else:
            info = self.client.create_session(self.env_id, self._config, self._seed)
        self.session = info
        self.session_id = info.session_id
        self.agents, self.acting_agents = [], []
        self._lost = None

    def adopt(self, other: RemoteParallelEnv) -> None:
        """Take over ``other``'s client, stream and session (a fresh one of the same env id, config and seed, on
        another server): this env carries on there and ``other`` must not be used again. The old stream is
        closed, and the old client too when this env owned it."""
        old_stream, old_client, old_owned = self._stream, self.client, self._own_client
        self.client, self._stream, self._own_client = other.client, other._stream, other._own_client
        self._generation = other._generation
        self.session = other.session
        self.session_id = other.session_id
        self.agents, self.acting_agents = [], []
        self._lost = None
        other._closed = True  # its client and stream are this env's now
        try:
            if old_stream is not None:
                old_stream.close()
        except MartiError:
            pass
        if old_owned:
            old_client.close()

    @checked
    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        """Reset the remote env; returns ``(observations, infos)``.

        A lost session (server restart, broken stream, idle reaping) is re-created first, with the same env
        id, config and creation seed, then reset with ``seed`` and ``options`` (see the class docstring). An
        env made by an :class:`~marti.clients.env.EnvPool` whose server cannot be reached (or is full)
        re-creates it on another server of the pool instead.

        Raises:
            UnavailableError: The server cannot be reached (the env stays usable: call ``reset`` again).
            FailedPreconditionError: The env is closed.
        """

        def once() -> StepResult:
            return self._guarded(
                lambda: self._stream.reset(self.session_id, seed, options),
                lambda: self.client.reset(self.session_id, seed, options),
            )

        try:
            r = once()
        except UnavailableError as e:
            if self.relocate is None:
                raise
            self.relocate(e)  # the server is away: a new episode may as well start on another one
            r = once()
        except SessionLostError:
            try:
                self._recreate()
            except (UnavailableError, ResourceExhaustedError) as e:
                if self.relocate is None:
                    raise
                self.relocate(e)
            r = once()
        self.agents, self.acting_agents = r.agents, r.acting_agents
        return r.observations, r.infos

    @checked(own=("actions",))
    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        """Step the remote env; returns PettingZoo ``(observations, rewards, terminations, truncations, infos)``.

        Raises:
            InvalidArgumentError, FailedPreconditionError: Bad input (the session survives), or the env is
                closed (FailedPreconditionError).
            SessionLostError: The server no longer has the session (restart, broken stream, idle reaping);
                call ``reset()`` to carry on in a new session.
        """
        r = self._guarded(
            lambda: self._stream.step(self.session_id, actions),
            lambda: self.client.step(self.session_id, actions),
        )
        self.agents, self.acting_agents = r.agents, r.acting_agents
        return r.as_tuple()

    @staticmethod
    def step_batch(
        envs: Sequence[RemoteParallelEnv], actions: Sequence[Mapping[str, Any]], max_batch: int = 256
    ) -> list[tuple[dict, dict, dict, dict, dict] | MartiError]:
        """Step several remote envs of one server in ``BatchStep`` calls (one round trip per ``max_batch``).

        The call goes through one channel, so the envs must share it (``marti.make(..., channel=ch)``;
        :func:`marti.env.make.step_many` batches the envs of each channel). Each env ends as after its own ``step``
        (``agents`` and ``acting_agents`` updated); a step that fails leaves its env (and session) as it was. An
        env whose own ``step`` would fail before sending anything (closed: ``FailedPreconditionError``; its
        session known lost: ``SessionLostError``) gets that error in its slot and nothing is sent for it.

        Args:
            envs: Remote envs on one channel, each at most once.
            actions: One action dict per env.
            max_batch: Most steps per ``BatchStep`` call (the server's ``max_batch_steps`` is 4096 by default). A
                call the server refuses for its count alone (``BatchTooLargeError`` naming its ``max_batch_steps``,
                nothing stepped) is sent again in parts under its limit, and later calls on the channel keep under
                it (a warning is logged once per channel).

        Returns:
            Per env, in order: its PettingZoo step tuple, or the :class:`MartiError` of its step alone.

        Raises:
            InvalidArgumentError: ``envs`` is not a list of remote envs, ``actions`` not a list of the same length,
                ``max_batch`` not an int >= 1, or an env is on another channel than the first (each named; nothing
                is sent).
            FailedPreconditionError: In a forked child, an env whose session lives on its parent's stream
                (nothing is sent).
            UnavailableError, DeadlineExceededError, ...: The whole call failed (server away, deadline).
        """
        check_env_list(envs, actions, RemoteParallelEnv)
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise InvalidArgumentError(f"max_batch must be an int >= 1, got {max_batch!r}")
        for i, env in enumerate(envs):
            if env.client.channel.inner is not envs[0].client.channel.inner:
                raise InvalidArgumentError(
                    f"envs[{i}] ({env.client.address}) is not on the channel of envs[0] ({envs[0].client.address}):"
                    " step_batch sends one BatchStep on one channel, and a server that did not make a session "
                    "answers that it does not know it; make the envs on one channel (marti.make(..., channel=ch)) or "
                    "call marti.env.make.step_many, which batches the envs of each channel"
                )
        for env in envs:
            if env._stream is not None and env._stream.forked:
                raise env._stream._forked_error()
        out: list[tuple[dict, dict, dict, dict, dict] | MartiError | None] = [env._refusal() for env in envs]
        # the envs a step may be sent for; the others fail as their own step does
        live = [i for i, refused in enumerate(out) if refused is None]
        if not live:
            return out  # every slot holds its env's error
        client = envs[live[0]].client
        lo = 0
        while lo < len(live):
            chunk = live[lo : lo + min(max_batch, _BATCH_LIMITS.get(client.channel.inner, max_batch))]
            steps = [(envs[i].session_id, actions[i]) for i in chunk]
            try:
                results = client.batch_step(steps)
            except BatchTooLargeError as refused:  # nothing of it was stepped: send it again in parts
                if not 0 < refused.max_batch_steps < len(chunk):
                    raise
                _learn_batch_limit(client, refused.max_batch_steps)
                continue
            lo += len(chunk)
            for i, r in zip(chunk, results, strict=True):
                env = envs[i]
                if isinstance(r, SessionLostError):
                    env._lost = f"the env server does not know it: {r.message}"
                    lost = env._lost_error(env._lost)
                    lost.__cause__ = r
                    out[i] = lost
                elif isinstance(r, MartiError):
                    out[i] = r
                else:
                    env.agents, env.acting_agents = r.agents, r.acting_agents
                    out[i] = r.as_tuple()
        return out  # every slot is filled

    def render(self) -> None:
        """Remote envs do not render."""
        return None

    def close(self) -> None:
        """Close the session and, when owned, the channel (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._stream is not None:
                self._stream.close()
            else:
                self.client.close_session(self.session_id)
        except MartiError:
            pass
        if self._own_client:
            self.client.close()
        if self.on_close is not None:
            self.on_close()


def _learn_batch_limit(client: EnvClient, limit: int) -> None:
    """Keeps ``step_batch`` calls on ``client``'s channel at most ``limit`` steps a ``BatchStep`` from now on."""
    if _BATCH_LIMITS.get(client.channel.inner) != limit:
        logger.warning(
            "env server %s takes at most %d steps a BatchStep (max_batch_steps); step_batch sends at most that "
            "many from now on",
            client.address or "(its channel)",
            limit,
        )
    _BATCH_LIMITS[client.channel.inner] = limit
