"""Host TextArena games (the ``textarena`` package) as turn-based PettingZoo parallel envs for LLM agents.

Env id ``textarena-v1``, config ``game`` (a TextArena env id such as ``TicTacToe-v0``), ``num_players``,
``kwargs`` and limits. The mapping:

* agents ``player_0 .. player_{n-1}`` are TextArena player ids ``0 .. n-1``;
* ``acting_agents`` is ``[player_<current player id>]``; only that agent's action is read, the others send
  ``""`` (or nothing);
* the acting agent's observation is TextArena's observation string for it (the game prompt and the
  transcript that player saw, as built by TextArena's default ``LLMObservationWrapper``); the other agents get
  the last string TextArena showed them followed by a line naming whose turn it is;
* actions are text passed to ``env.step`` unchanged (TextArena games read bracketed moves such as ``[4]``);
  TextArena applies each game's own rule for invalid moves (most two-player games end with a loss for the
  player who made it, some allow retries);
* rewards are 0 until the game ends, then TextArena's final rewards from ``env.close()`` (for two-player games
  +1 win, -1 loss, 0 draw); every agent terminates at the end; ``max_turns`` truncates;
* infos carry ``acting_agent``, ``is_acting``, ``turn``, ``game`` and, at the end, TextArena's per-player game
  info (``role``, ``invalid_move``, ``reason``, ``turn_count``).

Observations are printable ASCII (other characters become ``?``) and keep the most recent
``max_observation_chars`` characters, so they always lie in the observation space.

Games that need data or services this machine cannot reach fail at ``make`` with
:class:`~marti.errors.FailedPreconditionError` naming the game and the cause (word games need NLTK corpora that
TextArena downloads at first use; ``Debate-v0`` needs an OpenRouter API key for its jury).
"""

from __future__ import annotations

import random
import re
from typing import Any

import gymnasium
from pettingzoo import ParallelEnv

from marti.env.config import ConfigField, ConfigSchema
from marti.env.registry import EnvSpec, Registry
from marti.errors import FailedPreconditionError, InvalidArgumentError, NotFoundError
from services.env_server.envs.text_base import text_space

_NON_PRINTABLE = re.compile(r"[^\t\n\x20-\x7e]")

FIELDS = (
    ConfigField("game", "str", "TicTacToe-v0", "TextArena env id, e.g. TicTacToe-v0, ConnectFour-v0, KuhnPoker-v0"),
    ConfigField("num_players", "int", 2, "number of players (the game checks its own range)", minimum=1, maximum=64),
    ConfigField("kwargs", "dict", None, "keyword arguments for the TextArena env constructor"),
    ConfigField("max_turns", "int", 200, "truncate after this many moves", minimum=1, maximum=100_000),
    ConfigField(
        "max_observation_chars", "int", 8192, "observation length limit (the newest text is kept)",
        minimum=256, maximum=1_000_000,
    ),
    ConfigField("max_action_chars", "int", 4096, "action text length limit", minimum=16, maximum=1_000_000),
)  # fmt: skip


def _textarena():
    try:
        import textarena
    except ImportError as e:
        raise FailedPreconditionError(f"textarena is not installed on the env server: {e}") from None
    return textarena


def make_game(game: str, kwargs: dict[str, Any] | None) -> Any:
    """Build a fresh TextArena env (with TextArena's default wrappers).

    Args:
        game: TextArena env id.
        kwargs: Constructor keyword arguments (``None`` for none).

    Returns:
        The TextArena env.

    Raises:
        NotFoundError: Unknown game id (the message names it).
        FailedPreconditionError: textarena is missing, or the game needs data or a service it cannot reach.
        InvalidArgumentError: The game rejects ``kwargs``.
    """
    ta = _textarena()
    from textarena.envs.registration import ENV_REGISTRY

    if game not in ENV_REGISTRY:
        raise NotFoundError(
            f"unknown TextArena game {game!r} (e.g. TicTacToe-v0, ConnectFour-v0, KuhnPoker-v0)"
        )
    try:
        return ta.make(env_id=game, **(kwargs or {}))
    except (LookupError, ImportError, OSError) as e:
        raise FailedPreconditionError(
            f"TextArena game {game!r} cannot run here: {type(e).__name__}: {str(e).strip()[:300]}"
        ) from None
    except (TypeError, ValueError, AssertionError) as e:
        cls = FailedPreconditionError if "api key" in str(e).lower() else InvalidArgumentError
        raise cls(f"TextArena game {game!r} rejected its setup: {type(e).__name__}: {e}") from None


class TextArenaParallelEnv(ParallelEnv):
    """A TextArena game as a turn-based PettingZoo ``ParallelEnv`` with text spaces (module docstring).

    Args:
        config: Validated config (:data:`FIELDS`).
        seed: Seed of the first ``reset`` without a seed; ``None`` draws one from the OS.

    Raises:
        NotFoundError, FailedPreconditionError, InvalidArgumentError: As :func:`make_game`, or when the game
            refuses ``num_players`` (checked by one reset at construction).
    """

    missing_action = ""

    def __init__(self, config: dict[str, Any], seed: int | None = None) -> None:
        self.config = config
        self.game_id = config["game"]
        self.num_players = config["num_players"]
        self.possible_agents = [f"player_{i}" for i in range(self.num_players)]
        self.metadata = {
            "name": f"textarena/{self.game_id}",
            "render_modes": ["ansi"],
            "is_parallelizable": True,
        }
        self._obs_space = text_space(config["max_observation_chars"], min_length=1)
        self._act_space = text_space(config["max_action_chars"], min_length=0)
        self._rng = random.Random(seed)
        self._first_seed = seed
        self.agents: list[str] = []
        self.acting_agents: list[str] = []
        self._game: Any = None
        self._seen: dict[str, str] = {}
        self.turn = 0
        self._start(self._rng.randrange(2**31))  # validates game, kwargs and num_players now

    def observation_space(self, agent: str) -> gymnasium.spaces.Text:
        """Printable text of at most ``max_observation_chars`` characters."""
        return self._obs_space

    def action_space(self, agent: str) -> gymnasium.spaces.Text:
        """Printable text of at most ``max_action_chars`` characters (empty allowed)."""
        return self._act_space

    def _start(self, seed: int) -> None:
        game = make_game(self.game_id, self.config["kwargs"])
        try:
            game.reset(num_players=self.num_players, seed=seed)
        except (AssertionError, ValueError) as e:
            raise InvalidArgumentError(
                f"TextArena game {self.game_id!r} refused num_players={self.num_players}: {e}"
            ) from None
        except LookupError as e:
            raise FailedPreconditionError(f"TextArena game {self.game_id!r} cannot run here: {e}") from None
        self._game = game
        self._seen = {a: "" for a in self.possible_agents}
        self.turn = 0
        self._pull()

    def _pull(self) -> None:
        pid, text = self._game.get_observation()
        actor = f"player_{pid}"
        self._seen[actor] = text if isinstance(text, str) else str(text)
        self.acting_agents = [actor]

    def _fit(self, text: str) -> str:
        limit = self.config["max_observation_chars"]
        clean = _NON_PRINTABLE.sub("?", text).strip()
        if len(clean) > limit:
            clean = "[...] " + clean[-(limit - 6) :]
        return clean or "(no observation)"

    def _observation(self, agent: str) -> str:
        if agent in self.acting_agents:
            return self._fit(self._seen[agent])
        if not self.acting_agents:
            tail = "The game is over."
        else:
            tail = f"It is {self.acting_agents[0]}'s turn; reply with an empty message."
        limit = self.config["max_observation_chars"] - len(tail) - 1
        seen = self._fit(self._seen[agent])[-max(limit, 0) :] if self._seen[agent] else ""
        return self._fit(f"{seen}\n{tail}" if seen else tail)

    def _infos(self) -> dict[str, dict[str, Any]]:
        acting = self.acting_agents[0] if self.acting_agents else ""
        return {
            a: {"acting_agent": acting, "is_acting": a == acting, "turn": self.turn, "game": self.game_id}
            for a in self.possible_agents
        }

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        """Start a new game.

        Args:
            seed: Game seed; ``None`` uses the construction seed for the first reset, then the env's stream.
            options: Ignored (PettingZoo API).

        Returns:
            ``(observations, infos)`` for every agent.
        """
        if seed is None and self._first_seed is not None:
            seed, self._first_seed = self._first_seed, None
        elif seed is not None:
            self._first_seed = None
        if seed is not None:
            self._rng = random.Random(seed)
        if self._game is not None:
            self._game = None
        self._start(self._rng.randrange(2**31))
        self.agents = list(self.possible_agents)
        return {a: self._observation(a) for a in self.agents}, self._infos()

    def step(self, actions: dict[str, str]) -> tuple[dict, dict, dict, dict, dict]:
        """Play the acting agent's move.

        Args:
            actions: Agent -> text; only the acting agent's entry is read (absent means ``""``).

        Returns:
            PettingZoo tuples keyed by the agents live before the step; ``agents`` is empty after the last.
        """
        live = list(self.agents)
        actor = self.acting_agents[0]
        done, _ = self._game.step(actions.get(actor, self.missing_action))
        self.turn += 1
        rewards = dict.fromkeys(live, 0.0)
        terms = dict.fromkeys(live, False)
        truncs = dict.fromkeys(live, False)
        infos = None
        if done or self.turn >= self.config["max_turns"]:
            final, game_info = self._game.close()
            self.acting_agents = []
            infos = self._infos()
            for pid, info in (game_info or {}).items():
                a = f"player_{pid}"
                if a in infos:
                    infos[a].update(
                        {k: v for k, v in info.items() if isinstance(v, str | int | float | bool)}
                    )
            for a in live:
                if done:
                    rewards[a] = float((final or {}).get(int(a.split("_")[1]), 0.0))
                    terms[a] = True
                else:
                    truncs[a] = True
            self.agents = []
        else:
            self._pull()
            infos = self._infos()
        return {a: self._observation(a) for a in live}, rewards, terms, truncs, {a: infos[a] for a in live}

    def render(self) -> str:
        """The acting agent's current observation text (``ansi``)."""
        return self._observation(self.acting_agents[0]) if self.acting_agents else "The game is over."

    def close(self) -> None:
        """Drop the game."""
        self._game = None


def make_textarena(config: dict[str, Any], seed: int | None) -> ParallelEnv:
    """Registry factory of ``textarena-v1``."""
    return TextArenaParallelEnv(config, seed)


def register(registry: Registry) -> None:
    """Register ``textarena-v1`` into ``registry`` (building an env needs the ``textarena`` package)."""
    registry.register(
        EnvSpec(
            "textarena",
            1,
            make_textarena,
            ConfigSchema(FIELDS),
            "TextArena text games (config 'game', e.g. TicTacToe-v0) for LLM agents: players player_0.., one "
            "acting per turn, bracketed text moves, TextArena's final rewards.",
            {"game": "TicTacToe-v0"},
        )
    )
