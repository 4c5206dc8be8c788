"""The GPU paths as pytest tests (marker ``gpu``; skipped without CUDA): each runs one check of check_gpu.py.

``python tests/gpu/check_gpu.py`` runs the same checks as one script with a JSON summary (what the lent device
runs); ``pytest -m gpu tests/gpu`` runs them here on a CUDA machine. The vLLM test also skips when vllm is not
installed (the ``gpu`` extra).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from . import check_gpu

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _passes(check) -> None:
    """Run one check on CUDA; every result it records must be PASS (a check records one or more)."""
    check_gpu.RESULTS.clear()
    check("cuda")
    assert check_gpu.RESULTS, "the check recorded nothing"
    assert all(r["status"] == "PASS" for r in check_gpu.RESULTS.values()), check_gpu.RESULTS


def test_hf_rollout_logprobs_versions_and_lora_switching_on_cuda():
    _passes(check_gpu.check_hf_rollout)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed (the gpu extra)")
def test_vllm_rollouts_and_weight_sync_on_cuda():
    _passes(check_gpu.check_vllm)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed (the gpu extra)")
def test_the_gateway_serves_vllm_agents_with_the_engines_ids_and_logprobs_on_cuda():
    _passes(check_gpu.check_vllm_gateway)


def test_policy_worker_train_and_split_models_on_cuda():
    _passes(check_gpu.check_worker_train)


def test_deepspeed_zero_stages_on_cuda():
    _passes(check_gpu.check_deepspeed)
