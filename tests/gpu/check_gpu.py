"""One short GPU check of the trainer's model runtime: HF rollouts, vLLM rollouts and weight sync, DeepSpeed ZeRO.

Run on a CUDA machine from the repository root::

    python tests/gpu/check_gpu.py            # real checks on CUDA (a few minutes; vLLM part only if installed)
    python tests/gpu/check_gpu.py --dry-run  # same code paths on CPU (gloo, fp32), to check the script itself

Checks (each prints PASS, FAIL or SKIP with its numbers; the exit code is 1 if any FAILs):

1. ``hf_rollout``: the transformers engine generates on the device with the tiny model; its log-probabilities
   equal the policy's recomputation (raw, temperature 1); a synced update is tagged with its policy version and
   changes the samples. LoRA: adapters switch per agent on one base.
2. ``vllm_rollout``: only when vllm is importable: same checks on :class:`VLLMRolloutEngine`, including
   full-weight sync into vLLM (``load_weights``) and a LoRA adapter sync.
3. ``vllm_gateway``: only when vllm is importable: the inference gateway (HTTP, the official ``openai`` client)
   serves two agents of a :class:`VLLMRolloutEngine` (one full model, one LoRA adapter); greedy completions of
   token-id prompts carry the engine's own token ids and log-probs, a traced call is released with the engine's
   policy version, and an adapter sync changes the served agent's output. The dry run exercises the same code
   over the transformers engine on CPU.
4. ``worker_train``: the trainer's PolicyWorker on the device: generate, one PPO step (GAE critic, KL to the
   reference) on those samples, weight sync under a new policy version, and the same step with the reference
   and critic as separate workers (``ray.colocate_models: false``) giving the same statistics.
5. ``deepspeed_zero``: ZeRO stages 0-3 (nccl on CUDA, gloo on CPU; bf16 on CUDA) train a few steps with
   accumulation, the loss falls, and a checkpoint restores the weights bit for bit.

A JSON summary is written to ``$OUT/check_gpu.json`` when ``OUT`` is set, else next to nothing (stdout only).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

RESULTS: dict[str, dict] = {}


def record(name: str, status: str, **info: object) -> None:
    RESULTS[name] = {"status": status, **info}
    print(f"[{status}] {name} {json.dumps(info, default=str)}", flush=True)


def check_hf_rollout(device: str) -> None:
    from services.trainer.models.policy import AgentSpec, MultiAgentPolicy, PolicyLayout
    from services.trainer.rollout import HFRolloutEngine, SamplingParams

    t0 = time.perf_counter()
    for mode in ("per_agent", "lora"):
        policy = MultiAgentPolicy(
            PolicyLayout(mode=mode, agents=(AgentSpec("a", "tiny-llama"), AgentSpec("b", "tiny-llama"))),
            device=device,
        )
        engine = HFRolloutEngine.from_policy(policy, max_batch_size=16)
        params = SamplingParams(max_new_tokens=16, temperature=0.8, top_k=50, seed=0)
        prompts = [[5 + i, 6, 7, 8][: 2 + i % 3] for i in range(16)]
        t = time.perf_counter()
        gens = engine.generate("a", prompts, params)
        gen_s = time.perf_counter() - t
        worst = 0.0
        for g in gens[:4]:
            ids = torch.tensor([g.prompt_token_ids + g.response_token_ids], device=device)
            lp = policy.logprobs("a", ids, torch.ones_like(ids), torch.ones(1, len(g.response_token_ids)))
            worst = max(worst, float((lp[0].detach().cpu() - torch.tensor(g.response_logprobs)).abs().max()))
        with torch.no_grad():
            for p in policy.parameters("a"):
                p.add_(torch.randn_like(p) * 0.3)
        engine.update_weights("a", policy.state_for_sync("a"), policy.bump_version("a"))
        after = engine.generate("a", prompts[:2], SamplingParams(max_new_tokens=8, temperature=0.0))
        b_after = engine.generate("b", prompts[:2], SamplingParams(max_new_tokens=8, temperature=0.0))
        ok = worst < 2e-3 and after[0].policy_version == 1 and b_after[0].policy_version == 0
        record(
            f"hf_rollout[{mode}]",
            "PASS" if ok else "FAIL",
            device=device,
            max_logprob_diff=worst,
            tokens_per_s=round(sum(len(g.response_token_ids) for g in gens) / gen_s, 1),
            versions=(after[0].policy_version, b_after[0].policy_version),
        )
    RESULTS["hf_rollout_total_s"] = {"status": "INFO", "s": round(time.perf_counter() - t0, 2)}


def _vllm_two_agents():
    """A vLLM engine on CUDA serving the tiny model as agent ``a`` (full weights) and ``b`` (a LoRA adapter)."""
    from services.trainer.rollout.engines.vllm_engine import VLLMAgent, VLLMRolloutEngine

    lora_cfg = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
    return VLLMRolloutEngine(
        {"a": "tiny-llama", "b": VLLMAgent("tiny-llama", lora=True, lora_config=lora_cfg)},
        gpu_memory_utilization=0.2,
        max_model_len=512,
        dtype="float32",
    )


def check_vllm(device: str) -> None:
    from services.trainer.rollout import SamplingParams, vllm_available

    if not vllm_available():
        record("vllm_rollout", "SKIP", reason="vllm is not installed here")
        return
    if device != "cuda":
        from services.trainer.rollout.engines.vllm_engine import VLLMRolloutEngine  # import path check only

        record("vllm_rollout", "SKIP", reason="dry run: vllm needs CUDA", engine=VLLMRolloutEngine.__name__)
        return
    from services.trainer.models.loading import build_tiny_model, load_tokenizer
    from services.trainer.models.policy import AgentSpec, MultiAgentPolicy, PolicyLayout

    policy = MultiAgentPolicy(
        PolicyLayout(mode="per_agent", agents=(AgentSpec("a", "tiny-llama"),)), device=device
    )
    engine = _vllm_two_agents()
    prompts = [[5, 6, 7], [8, 9, 10, 11]]
    gens = engine.generate("a", prompts, SamplingParams(max_new_tokens=16, temperature=1.0, seed=0))
    worst = 0.0
    for g in gens:
        ids = torch.tensor([g.prompt_token_ids + g.response_token_ids], device=device)
        lp = policy.logprobs("a", ids, torch.ones_like(ids), torch.ones(1, len(g.response_token_ids)))
        worst = max(worst, float((lp[0].detach().cpu() - torch.tensor(g.response_logprobs)).abs().max()))
    new = build_tiny_model(load_tokenizer("tiny-llama"), seed=7).state_dict()
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    before = engine.generate("a", prompts, greedy)
    engine.update_weights("a", new, 1)
    after = engine.generate("a", prompts, greedy)
    lora_policy = MultiAgentPolicy(
        PolicyLayout(mode="lora", agents=(AgentSpec("b", "tiny-llama"),)), device=device
    )
    with torch.no_grad():
        for p in lora_policy.parameters("b"):
            p.add_(torch.randn_like(p) * 0.5)
    b0 = engine.generate("b", prompts, greedy)
    engine.update_weights("b", lora_policy.state_for_sync("b"), 1)
    b1 = engine.generate("b", prompts, greedy)
    ok = (
        worst < 5e-2
        and after[0].policy_version == 1
        and [g.response_logprobs for g in before] != [g.response_logprobs for g in after]
        and [g.response_logprobs for g in b0] != [g.response_logprobs for g in b1]
    )
    record(
        "vllm_rollout",
        "PASS" if ok else "FAIL",
        max_logprob_diff_vs_hf=worst,
        version=after[0].policy_version,
    )


def gateway_round_trip(engine, tokenizer, agents: tuple[str, str], sync) -> dict:
    """Serve ``engine`` through a real :class:`GatewayServer` and check it against the engine's own greedy output.

    Args:
        engine: A rollout engine serving both ``agents`` (one tokenizer for both).
        tokenizer: Their tokenizer (chat templates, decoding).
        agents: Two agent names of ``engine``.
        sync: ``sync(agent, version)``: pushes new weights of ``agent`` into ``engine`` at ``version``.

    Returns:
        The numbers recorded: ``ok`` plus what was compared.
    """
    import openai

    from services.gateway.core.gateway import Gateway
    from services.gateway.core.limits import GatewayLimits
    from services.gateway.server import GatewayServer
    from services.trainer.rollout import SamplingParams
    from services.trainer.rollout.serving.gateway_backend import EngineBackend

    released: list = []
    backend = EngineBackend(engine, dict.fromkeys(agents, tokenizer))
    server = GatewayServer(Gateway(backend, GatewayLimits(max_wait_ms=2), sink=released.append))
    http_url, _ = server.start()
    try:
        client = openai.OpenAI(base_url=http_url, api_key="none", max_retries=0, timeout=120)
        prompt = [5, 6, 7, 8]
        direct = {
            a: engine.generate(a, [prompt], SamplingParams(max_new_tokens=8, temperature=0.0))[0]
            for a in agents
        }
        served = {}
        for a in agents:
            r = client.completions.create(model=a, prompt=prompt, max_tokens=8, temperature=0.0, logprobs=1)
            served[a] = r.choices[0]
        same_ids = all(served[a].model_extra["token_ids"] == direct[a].response_token_ids for a in agents)
        worst = max(
            abs(x - y)
            for a in agents
            for x, y in zip(served[a].logprobs.token_logprobs, direct[a].response_logprobs, strict=True)
        )
        traced = openai.OpenAI(
            base_url=http_url.removesuffix("/v1") + "/episodes/gpu-check/v1", api_key="none", max_retries=0
        )
        traced.chat.completions.create(
            model=agents[0], messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        import httpx

        httpx.post(
            http_url.removesuffix("/v1") + "/v1/episodes/gpu-check/reward", json={"rewards": {agents[0]: 1.0}}
        ).raise_for_status()
        version = engine.policy_version(agents[0]) if hasattr(engine, "policy_version") else None
        sync(agents[1], 1)
        after = client.completions.create(
            model=agents[1], prompt=prompt, max_tokens=8, temperature=0.0, logprobs=1
        )
        changed = after.choices[0].logprobs.token_logprobs != served[agents[1]].logprobs.token_logprobs
    finally:
        server.stop()
    ok = same_ids and worst < 1e-3 and len(released) == 1 and changed
    return {"ok": ok, "same_ids": same_ids, "max_logprob_diff": worst, "released": len(released),
            "engine_version": version, "adapter_sync_changed_output": changed}  # fmt: skip


def check_vllm_gateway(device: str) -> None:
    from services.trainer.models.loading import build_tiny_model, load_tokenizer
    from services.trainer.rollout import vllm_available

    tok = load_tokenizer("tiny-llama")
    if device != "cuda":  # the dry run: the same round trip over the transformers engine
        from services.trainer.rollout.engines.hf import AgentModel, HFRolloutEngine

        models = {a: build_tiny_model(tok, seed=i) for i, a in enumerate(("a", "b"))}
        engine = HFRolloutEngine({a: AgentModel(m, tok) for a, m in models.items()}, max_model_len=256)

        def sync(agent: str, version: int) -> None:
            engine.update_weights(agent, build_tiny_model(tok, seed=11).state_dict(), version)

        got = gateway_round_trip(engine, tok, ("a", "b"), sync)
        record("vllm_gateway", "PASS" if got.pop("ok") else "FAIL", engine="hf (dry run)", **got)
        return
    if not vllm_available():
        record("vllm_gateway", "SKIP", reason="vllm is not installed here")
        return
    from services.trainer.models.policy import AgentSpec, MultiAgentPolicy, PolicyLayout

    engine = _vllm_two_agents()
    lora_policy = MultiAgentPolicy(
        PolicyLayout(mode="lora", agents=(AgentSpec("b", "tiny-llama"),)), device=device
    )

    def sync(agent: str, version: int) -> None:
        with torch.no_grad():
            for p in lora_policy.parameters(agent):
                p.add_(torch.randn_like(p) * 0.5)
        engine.update_weights(agent, lora_policy.state_for_sync(agent), version)

    got = gateway_round_trip(engine, tok, ("a", "b"), sync)
    record("vllm_gateway", "PASS" if got.pop("ok") else "FAIL", engine="vllm", **got)


def check_deepspeed(device: str) -> None:
    from services.trainer.models.loading import TinyModelConfig, build_tiny_model, load_tokenizer
    from services.trainer.strategy import OptimConfig
    from services.trainer.strategy.deepspeed_strategy import DeepSpeedStrategy

    tok = load_tokenizer("tiny-llama")
    cfg_small = TinyModelConfig(num_layers=2, hidden_size=64)
    ids = torch.randint(0, 1000, (4, 32), generator=torch.Generator().manual_seed(0)).to(device)
    bf16 = device == "cuda"
    work = Path(tempfile.mkdtemp(prefix="ds-check-"))
    for stage in (0, 1, 2, 3):
        t = time.perf_counter()
        model = build_tiny_model(tok, config=cfg_small).to(device).train()
        optim = OptimConfig(lr=1e-2, grad_accum_steps=2, total_steps=10, bf16=bf16)
        eng = DeepSpeedStrategy(zero_stage=stage).setup(model, list(model.parameters()), optim)
        losses = []
        for _ in range(8):
            loss = eng.model(input_ids=ids, labels=ids).loss
            losses.append(float(loss))
            eng.backward(loss)
            res = eng.step()
        eng.save_checkpoint(work / f"z{stage}", {"offset": 8})
        with eng.gathered():
            saved = {n: p.detach().clone() for n, p in eng.model.named_parameters()}
        other = build_tiny_model(tok, seed=3, config=cfg_small).to(device).train()
        eng2 = DeepSpeedStrategy(zero_stage=stage).setup(other, list(other.parameters()), optim)
        pos = eng2.load_checkpoint(work / f"z{stage}")
        with eng2.gathered():
            exact = all(torch.equal(saved[n], p) for n, p in eng2.model.named_parameters())
        ok = losses[-1] < losses[0] and exact and pos == {"offset": 8} and eng.global_step == 4
        record(
            f"deepspeed_zero[{stage}]",
            "PASS" if ok else "FAIL",
            device=device,
            bf16=bf16,
            loss_first=round(losses[0], 4),
            loss_last=round(losses[-1], 4),
            grad_norm=res.grad_norm,
            resume_exact=exact,
            seconds=round(time.perf_counter() - t, 2),
        )


def check_worker_train(device: str) -> None:
    """PolicyWorker generate -> train (GAE + KL) -> sync on ``device``; colocated and split layouts agree."""
    from marti.config import load_config
    from marti.types.trajectory import Trajectory, Turn
    from services.trainer.ray.model_workers import (
        CriticWorker,
        ReferenceWorker,
        critic_actor_config,
        reference_actor_config,
    )
    from services.trainer.ray.policy_worker import PolicyWorker, policy_actor_config

    root = Path(__file__).resolve().parents[2]
    overrides = [
        f"device={device}",
        "algorithm.advantage_estimator=gae",
        "algorithm.kl_coef=0.05",
        "rollout.max_new_tokens=8",
        "micro_train_batch_size=2",
    ]
    cfg = load_config(root / "examples" / "tiny.yaml", overrides)
    t0 = time.perf_counter()
    colocated = PolicyWorker(policy_actor_config(cfg), num_threads=4)
    chats = [[{"role": "user", "content": f"Allocate units to task_{i}."}] for i in range(4)]
    gens = colocated.generate("agent_1", chats)
    assert all(g.response_token_ids for g in gens), "empty generation"
    samples = [
        Trajectory(f"e{i}", "agent_1", group_id="0", episode_return=float(i % 2),
                   turns=[Turn(0, list(g.prompt_token_ids), list(g.response_token_ids))])
        for i, g in enumerate(gens)
    ]  # fmt: skip
    v0 = colocated.versions()["agent_1"]
    stats = [colocated.train("agent_1", samples) for _ in range(2)]  # KL is 0 until the policy moved once
    assert colocated.versions()["agent_1"] == v0 + 2, colocated.versions()
    assert all(math.isfinite(v) for st in stats for v in st.values()), stats
    assert "value_loss" in stats[-1] and stats[-1]["kl"] != 0.0, stats[-1]
    after = colocated.generate("agent_1", chats, greedy=True)
    split_cfg = load_config(root / "examples" / "tiny.yaml", [*overrides, "ray.colocate_models=false"])
    policy = PolicyWorker(policy_actor_config(split_cfg), num_threads=4)
    reference = ReferenceWorker(reference_actor_config(split_cfg, "agent_1"), num_threads=4)
    critic = CriticWorker(critic_actor_config(split_cfg, "agent_1"), num_threads=4)
    split_stats = []
    for _ in range(2):
        values = critic.values(samples)
        st, returns = policy.train(
            "agent_1",
            samples,
            ref_logprobs=reference.ref_logprobs(samples),
            old_values=values,
            return_returns=True,
        )
        st.update(critic.fit(samples, values, returns))
        split_stats.append(st)
    diffs = {k: abs(stats[-1][k] - split_stats[-1][k]) for k in ("policy_loss", "kl", "value_loss")}
    assert all(d < 1e-3 for d in diffs.values()), diffs
    record(
        "worker_train",
        "PASS",
        seconds=round(time.perf_counter() - t0, 1),
        policy_version=colocated.versions()["agent_1"],
        stats={
            k: round(v, 5)
            for k, v in stats[-1].items()
            if k in ("policy_loss", "kl", "value_loss", "grad_norm")
        },
        colocated_vs_split_abs_diff=diffs,
        greedy_after=[g.text[:40] for g in after[:2]],
    )


def main(argv: list[str] | None = None) -> int:
    """Run every check; returns 0 when none failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="run the same code paths on CPU")
    parser.add_argument(
        "--only", choices=["hf", "vllm", "vllm_gateway", "worker", "deepspeed"], action="append"
    )
    args = parser.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print("no CUDA device: run with --dry-run on CPU", file=sys.stderr)
        return 2
    device = "cpu" if args.dry_run else "cuda"
    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0]}
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
    record("environment", "INFO", **info)
    checks = {
        "hf": check_hf_rollout,
        "vllm": check_vllm,
        "vllm_gateway": check_vllm_gateway,
        "worker": check_worker_train,
        "deepspeed": check_deepspeed,
    }
    for name, fn in checks.items():
        if args.only and name not in args.only:
            continue
        try:
            fn(device)
        except Exception as exc:  # a crash in one check must not hide the others
            record(name, "FAIL", error=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc()[-2000:])
    out = os.environ.get("OUT")
    if out:
        Path(out, "check_gpu.json").write_text(json.dumps(RESULTS, indent=2, default=str))
    failed = [k for k, v in RESULTS.items() if v["status"] == "FAIL"]
    print(f"{sum(v['status'] == 'PASS' for v in RESULTS.values())} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
