"""``rollout.engine: vllm`` on a machine where vLLM cannot run is refused before the job starts a service
(``services/trainer/job/run/prechecks.py::check_vllm_engine``), naming the keys."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from marti.config import load_config
from marti.errors import InvalidArgumentError
from services.trainer.job.run.prechecks import check_vllm_engine
from tests.refused_runs import train_over_an_old_run

ROOT = Path(__file__).resolve().parents[5]
TINY = ROOT / "examples" / "tiny.yaml"


@pytest.mark.parametrize(
    "device, said", [("auto", "device=auto resolves to the CPU"), ("cuda", "device=cuda finds")]
)
def test_vllm_without_cuda_is_refused_naming_the_keys(device, said):
    cfg = load_config(TINY, ["rollout.engine=vllm", f"device={device}"])
    with pytest.raises(InvalidArgumentError, match=f"rollout.engine=vllm needs a CUDA device, but {said}"):
        check_vllm_engine(cfg, has_cuda=False, vllm_installed=True)


def test_vllm_without_the_package_is_refused_and_other_engines_pass():
    cfg = load_config(TINY, ["rollout.engine=vllm", "device=auto"])
    with pytest.raises(
        InvalidArgumentError, match="rollout.engine=vllm but the vllm package is not installed"
    ):
        check_vllm_engine(cfg, has_cuda=True, vllm_installed=False)
    check_vllm_engine(cfg, has_cuda=True, vllm_installed=True)
    for engine in ("auto", "hf", "hf_static"):
        check_vllm_engine(
            load_config(TINY, [f"rollout.engine={engine}"]), has_cuda=False, vllm_installed=False
        )


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a machine without CUDA")
def test_marti_train_refuses_vllm_on_a_cpu_machine_before_the_run_folder(tmp_path):
    job = {
        "training_name": "t",
        "agents": [{"name": "a", "pretrain_model": "tiny-llama", "role": "solver"}],
        "rollout": {"engine": "vllm"},
    }
    proc = train_over_an_old_run(tmp_path, job)
    assert "rollout.engine=vllm needs a CUDA device, but device=auto resolves to the CPU" in proc.stderr
    assert "Traceback" not in proc.stderr
