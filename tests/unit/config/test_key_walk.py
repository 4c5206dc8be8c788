"""Every documented config key changes what a job does.

Walks the keys of docs/config.md's generated KEYS block (``config_reference_markdown``). Each key is covered in
at least one of three ways, and :func:`test_every_key_is_covered` fails for a key that is covered in none:

- **built**: set to a non-default value (:data:`VALUES`, else :func:`_other_value`), on top of the settings it
  needs to apply (:data:`CONTEXT`, applied to both sides; a key with two consumers that need different settings
  is walked once under each), the key must change the output of *each* builder it is mapped to
  (:func:`builders_of`: :data:`KEY_BUILDERS`, else :data:`SECTION_BUILDERS`). A builder runs the trainer's own
  code on the config and reports what that code built or did, never the raw config:

  - ``learner``: algorithm settings, the optimizer settings of a policy's and a critic's train engine (LR
    schedule length and warmup), the policy layout, vLLM engine count and kwargs, every agent's sampling
    parameters;
  - ``engine``: the rollout engine :func:`~services.trainer.rollout.engines.generation.build_rollout_engine` builds on a CPU and
    a CUDA actor (engine constructors recorded, not run);
  - ``placement``: the Ray actors, their placement-group bundles and concurrency
    (:class:`~services.trainer.ray.runtime.RayRuntime`), the ``ray.init`` kwargs, the resolved device;
  - ``env``: the env name and config the loop's ``_make_env`` / ``_make_task_env`` hand to ``marti.make``, and
    the return scaling of ``reward_alloc``;
  - ``services``: the addresses and token ``marti train`` resolves (:func:`~services.trainer.job.cli.train_cli.service_addresses`,
    with the embedded stack recorded, not started) and the reconnect backoff of the loop;
  - ``episodes``: the seeds and tasks the loop's training rollouts and evaluations play, its run directory, and
    the episode runner it builds: run id, roles, every agent's chat prompt, the speakers of six turns, role
    parsers and scripts, the credited rewards of a fixed episode;
  - ``curriculum`` / ``allocation``: the loop's curriculum steps (levels, success rates, the env difficulty) and
    priority allocation (shares, cut batches) over six steps of fixed episodes;
  - ``gateway``: the gateway the loop starts (limits, bind address; server and backend recorded) and its
    linger wait;
  - ``run``: a whole :meth:`~services.trainer.job.run.loop.TrainingLoop.run` against fakes (Ray runtime, store tables,
    resource monitor, wandb; no env, no model): steps run, evaluations, checkpoints saved and kept, steps
    logged, loggers opened, the tables' staleness bounds, the items each update takes and its deadline, the
    asynchronous producer, whether the gateway started.
- **effect test**: a key whose effect no builder shows (inside a model update, a loaded model or DeepSpeed
  engine, or the config check of ``num_agents``) names in :data:`EFFECT_TESTS` the test that fails when the key
  does nothing; :func:`test_each_effect_test_exists` checks that the test exists (the new ones are in
  tests/unit/config/test_key_effects.py, the others beside the code they exercise).
- **container**: a section key, or a list of sections (``agents``, ``gateway``, ``workflow.roles``,
  ``agents.N.sampling``): covered by its child keys, each of which must be covered (checked).

Besides, :func:`test_builders_give_the_same_output_twice` checks that no builder's output changes by itself (an
object id, a temporary path, a clock), which would let every key pass, and
:func:`test_the_tables_name_only_documented_keys` that the tables name no key the docs do not list.

There is no list of accepted-but-inert keys: a key that changes none of its builders' output fails here.

The builders are in tests/unit/config/key_walk_builders.py; the keys and the tables (:data:`KEY_BUILDERS`,
:data:`SECTION_BUILDERS`, :data:`EFFECT_TESTS`, :data:`CONTEXT`, :data:`VALUES`) in
tests/unit/config/key_walk_tables.py; this module walks them.
"""

from __future__ import annotations

import copy
import json
import re
import types
import typing
from pathlib import Path
from typing import Any

import pytest

from marti.config import TrainConfig, config_from_dict
from tests.unit.config.key_walk_builders import BUILDERS
from tests.unit.config.key_walk_tables import (
    BASE,
    CONTAINERS,
    CONTEXT,
    EFFECT_TESTS,
    KEY_BUILDERS,
    KEYS,
    SECTION_BUILDERS,
    VALUES,
    builders_of,
)

ROOT = Path(__file__).resolve().parents[3]


# ---------------------------------------------------------------------------------------------- values
def _other_value(cfg: TrainConfig, key: str) -> Any:
    """A valid non-default value for ``key`` (from its type)."""
    node: Any = cfg
    for part in key.split(".")[:-1]:
        if part == "N":
            node = node[0]
            continue
        node = getattr(node, part)
    leaf = key.split(".")[-1]
    info = type(node).model_fields[leaf]
    current = getattr(node, leaf)
    tp = info.annotation
    union = typing.get_origin(tp) in (typing.Union, types.UnionType)
    args = [a for a in typing.get_args(tp) if a is not type(None)] if union else [tp]
    base = args[0]
    if typing.get_origin(base) is typing.Annotated:
        base = typing.get_args(base)[0]
    if typing.get_origin(base) is typing.Literal:
        return next(v for v in typing.get_args(base) if v != current)
    if base is bool:
        return not current
    if base is int:
        return 1 if current in (None, 0) else (0 if leaf.endswith("stage") else current + 1)
    if base is float:
        if leaf == "dual_clip":
            return 3.0
        return 0.5 if current in (None, 0.0, 1.0) else current / 2
    if typing.get_origin(base) is list and typing.get_args(base)[0] is str:
        return ["q_proj"] if current != ["q_proj"] else ["v_proj"]
    if base is str:
        return "another-model"
    return None


def _set(raw: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(raw)
    node: Any = out
    parts = key.replace(".N.", ".0.").split(".")
    for part in parts[:-1]:
        node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
    node[parts[-1]] = copy.deepcopy(value)
    return out


def _contexts(key: str) -> list[dict[str, Any]]:
    """The settings ``key`` is walked under (one or several, see :data:`CONTEXT`)."""
    found = CONTEXT.get(key, {})
    return found if isinstance(found, list) else [found]


def _with(raw: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    for key, value in settings.items():
        raw = _set(raw, key, value)
    return raw


_CACHE: dict[tuple[str, str], str] = {}


def _built(builder: str, raw: dict[str, Any]) -> str:
    """``BUILDERS[builder]`` of the config ``raw`` (cached: the base configs repeat)."""
    key = (builder, json.dumps(raw, sort_keys=True))
    if key not in _CACHE:
        _CACHE[key] = BUILDERS[builder](config_from_dict(raw))
    return _CACHE[key]


# ---------------------------------------------------------------------------------------------- the tests
def test_the_walk_sees_every_section():
    assert len(KEYS) > 150 and "algorithm.normalize_reward" in KEYS and "policy.ema" in KEYS
    assert {"agents", "gateway", "workflow.roles", "agents.N.sampling", "tasks"} <= set(CONTAINERS)


@pytest.mark.parametrize("key", KEYS)
def test_every_key_is_covered(key):
    covered = key in CONTAINERS or key in EFFECT_TESTS or builders_of(key)
    assert covered, (
        f"{key}: no builder, effect test or child key covers it; map it in KEY_BUILDERS or EFFECT_TESTS"
    )


def _children(key: str) -> list[str]:
    """The keys one level below ``key`` (``agents`` -> ``agents.N.name``, ..., ``agents.N.sampling``)."""
    out = []
    for k in KEYS:
        rest = k[len(key) + 1 :] if k.startswith(key + ".") else None
        rest = rest[2:] if rest and rest.startswith("N.") else rest
        if rest and "." not in rest:
            out.append(k)
    return out


@pytest.mark.parametrize("key", CONTAINERS)
def test_container_keys_are_covered_by_their_children(key):
    children = _children(key)
    assert children, f"{key}: a container without child keys"
    for child in children:
        assert child in CONTAINERS or child in EFFECT_TESTS or builders_of(child), f"{child} is not covered"


def test_the_tables_name_only_documented_keys():
    named = [*KEY_BUILDERS, *EFFECT_TESTS, *CONTEXT, *VALUES]
    assert sorted(k for k in named if k not in KEYS) == []
    assert all(
        name in BUILDERS for names in [*SECTION_BUILDERS.values(), *KEY_BUILDERS.values()] for name in names
    )


@pytest.mark.parametrize("key", sorted(EFFECT_TESTS))
def test_each_effect_test_exists(key):
    path, name = EFFECT_TESTS[key].split("::")
    body = (ROOT / path).read_text()
    match = re.search(rf"^def {name}\(.*?(?=^def |\Z)", body, re.M | re.S)
    assert match, f"{key}: {EFFECT_TESTS[key]} does not exist"
    assert key in KEYS


WALKED = [(k, i) for k in KEYS if builders_of(k) for i in range(len(_contexts(k)))]


@pytest.mark.parametrize(("key", "case"), WALKED, ids=[f"{k}" + (f"-{i}" if i else "") for k, i in WALKED])
def test_keys_change_what_their_builders_produce(key, case):
    context = _contexts(key)[case]
    raw_base = _with(BASE, context)
    value = VALUES[key] if key in VALUES else _other_value(config_from_dict(raw_base), key)
    assert value is not None, f"{key}: no generic non-default value; give one in VALUES"
    raw = _set(raw_base, key, value)
    unchanged = [b for b in builders_of(key) if _built(b, raw) == _built(b, raw_base)]
    assert not unchanged, (
        f"{key}={value!r} (with {context}): no change in what {', '.join(unchanged)} produce(s)"
    )


@pytest.mark.parametrize("builder", sorted(BUILDERS))
def test_builders_give_the_same_output_twice(builder):
    """A builder whose output held an object id, a temporary path or a time would see every key change it."""
    contexts = {
        json.dumps(c, sort_keys=True): c for k, _ in WALKED if builder in builders_of(k) for c in _contexts(k)
    }
    for context in contexts.values():
        raw = _with(BASE, context)
        assert BUILDERS[builder](config_from_dict(raw)) == BUILDERS[builder](config_from_dict(raw)), context
