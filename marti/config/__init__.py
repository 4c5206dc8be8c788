"""The training config: the YAML schema of ``marti train`` (ARCHITECTURE.md section 7).

One frozen pydantic v2 model, :class:`TrainConfig`, describes a whole training job. Every section forbids
unknown keys, so a typo is an :class:`~marti.errors.InvalidArgumentError` that names the dotted key path
(``unknown key 'algorithm.kl_coeff' (did you mean 'kl_coef'?)``). The documented seed format
(``multi_agent_collaboration.yaml`` of the design) loads exactly as written; YAML 1.1 reads ``2e-5`` as a
string, so numeric strings are accepted wherever a number is expected.

The package has one module per job:

- :mod:`marti.config.schema`: :class:`TrainConfig` and the sections it holds (each field documented);
- :mod:`marti.config.section`: the sections' base class; :mod:`marti.config.sections`: one module per section
  (``algorithm``, ``dataset``, ``reward``, ``rollout``, ``workflow``, ``gateway``) and the seed schedule;
- :mod:`marti.config.load`: YAML loading, dotted overrides, error messages;
- :mod:`marti.config.docs`: the key reference embedded in ``docs/config.md``;
- :mod:`marti.config.unread`: refusing settings the rest of the config leaves unread.

Every documented key has a consumer (``tests/unit/config/test_key_walk.py`` fails on a key nothing reads).

Every public name is re-exported here, so ``from marti.config import X`` works for all of them.

Models are only recorded here, never looked up: the trainer's model loader names a missing model.

Typical use::

    cfg = load_config("examples/resource_allocation.yaml", ["algorithm.kl_coef=0.01", "agents.0.role=planner"])
    cfg.run_dir            # Path("runs/resource_allocation")
    cfg.sampling_for("agent_2").temperature
"""

from __future__ import annotations

from marti.config.docs import config_reference_markdown
from marti.config.load import (
    apply_overrides,
    config_from_dict,
    config_from_text,
    dump_config,
    load_config,
    raw_config_from_text,
    unset_keys,
)
from marti.config.schema import (
    AgentConfig,
    EnvironmentConfig,
    OutputConfig,
    PolicyConfig,
    RayConfig,
    RolloutConfig,
    SamplingConfig,
    SamplingOverrides,
    ServicesConfig,
    StrategyConfig,
    TrainConfig,
    VllmConfig,
    parse_byte_size,
)
from marti.config.sections.algorithm import (
    GROUP_BY_MODES,
    GROUP_ESTIMATORS,
    KL_ESTIMATORS,
    LOSS_AGG_MODES,
    TURN_REWARD_MODES,
    AlgorithmConfig,
)
from marti.config.sections.dataset import DatasetConfig
from marti.config.sections.gateway import ExternalConfig, GatewayConfig
from marti.config.sections.seeds import DEFAULT_EVAL_SEED_START
from marti.config.sections.workflow import (
    AllocationConfig,
    BudgetConfig,
    CurriculumConfig,
    RewardAllocConfig,
    TaskConfig,
    WorkflowConfig,
    WorkflowRoleConfig,
)

__all__ = [
    "DEFAULT_EVAL_SEED_START",
    "GROUP_BY_MODES",
    "GROUP_ESTIMATORS",
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
    "TURN_REWARD_MODES",
    "WorkflowRoleConfig",
    "WorkflowConfig",
    "TaskConfig",
    "CurriculumConfig",
    "DatasetConfig",
    "AllocationConfig",
    "AgentConfig",
    "AlgorithmConfig",
    "BudgetConfig",
    "EnvironmentConfig",
    "ExternalConfig",
    "GatewayConfig",
    "OutputConfig",
    "PolicyConfig",
    "RayConfig",
    "RewardAllocConfig",
    "RolloutConfig",
    "SamplingConfig",
    "SamplingOverrides",
    "ServicesConfig",
    "StrategyConfig",
    "TrainConfig",
    "VllmConfig",
    "apply_overrides",
    "unset_keys",
    "config_from_dict",
    "config_from_text",
    "raw_config_from_text",
    "config_reference_markdown",
    "dump_config",
    "load_config",
    "parse_byte_size",
]
