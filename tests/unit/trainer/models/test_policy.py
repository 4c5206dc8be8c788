"""Multi-agent policies on tiny models: modes, frozen agents, logprobs, references, persistence."""

from __future__ import annotations

import pytest
import torch

from marti.errors import FailedPreconditionError, InvalidArgumentError, NotFoundError
from services.trainer.models.loading import (
    TinyModelConfig,
    build_tiny_model,
    count_parameters,
    load_tokenizer,
)
from services.trainer.models.policy import AgentSpec, MultiAgentPolicy, PolicyLayout


def _cfg(mode, *agents, **kw):
    return PolicyLayout(mode=mode, agents=tuple(agents), **kw)


def _batch():
    """Two left-padded sequences (B=2, T=8) whose last A=3 tokens are the response."""
    ids = torch.tensor([[0, 0, 5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16, 17, 18]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1], [1] * 8])
    return ids, mask, torch.ones(2, 3)


def _reference_logprobs(model, ids, mask, num_actions):
    """Independent reference: each row alone, without padding, full log_softmax."""
    rows = []
    for r in range(ids.shape[0]):
        seq = ids[r][mask[r].bool()].unsqueeze(0)
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=seq).logits[0].float(), -1)
        n = seq.shape[1]
        rows.append(
            torch.stack(
                [logp[n - num_actions - 1 + j, seq[0, n - num_actions + j]] for j in range(num_actions)]
            )
        )
    return torch.stack(rows)


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"mode": "nope", "agents": (AgentSpec("a", "tiny-llama"),)}, "mode"),
        ({"mode": "shared", "agents": ()}, "at least one agent"),
        (
            {"mode": "shared", "agents": (AgentSpec("a", "tiny-llama"), AgentSpec("a", "tiny-llama"))},
            "unique",
        ),
        ({"mode": "shared", "agents": (AgentSpec("a.b", "tiny-llama"),)}, "a.b"),
        ({"mode": "lora", "agents": (AgentSpec("a", "tiny-llama"), AgentSpec("b", "other"))}, "other"),
    ],
)
def test_config_errors_name_the_problem(kwargs, word):
    with pytest.raises(InvalidArgumentError) as err:
        PolicyLayout(**kwargs)
    assert word in str(err.value)


def test_per_agent_allows_heterogeneous_models_and_frozen_agents(tmp_path):
    tok = load_tokenizer("tiny-llama")
    other = build_tiny_model(
        tok, seed=5, config=TinyModelConfig(num_layers=1, hidden_size=32, intermediate_size=64)
    )
    other.save_pretrained(tmp_path / "small")
    tok.save_pretrained(tmp_path / "small")
    pol = MultiAgentPolicy(
        _cfg(
            "per_agent",
            AgentSpec("a", "tiny-llama"),
            AgentSpec("b", str(tmp_path / "small"), is_tuning=False),
        )
    )
    assert pol.trainable_agents == ["a"] and pol.model("a") is not pol.model("b")
    assert pol.model("b").config.num_hidden_layers == 1
    assert pol.parameters("b") == [] and len(pol.parameters("a")) > 0
    ids, mask, am = _batch()
    lp_b = pol.logprobs("b", ids, mask, am)
    assert not lp_b.requires_grad and lp_b.shape == (2, 3)
    assert torch.allclose(lp_b, _reference_logprobs(pol.model("b"), ids, mask, 3), atol=1e-4)
    assert torch.equal(pol.ref_logprobs("b", ids, mask, am), lp_b)


def test_logprobs_match_reference_with_left_padding_and_carry_grad():
    pol = MultiAgentPolicy(_cfg("per_agent", AgentSpec("a", "tiny-llama")))
    ids, mask, am = _batch()
    lp, ent = pol.logprobs("a", ids, mask, am, return_entropy=True)
    assert lp.requires_grad and lp.shape == ent.shape == (2, 3)
    assert torch.allclose(lp.detach(), _reference_logprobs(pol.model("a"), ids, mask, 3), atol=1e-4)
    vocab = pol.model("a").config.vocab_size
    assert bool((ent > 0).all()) and bool((ent <= torch.log(torch.tensor(float(vocab))) + 1e-4).all())
    lp.sum().backward()
    assert all(p.grad is not None for p in pol.parameters("a") if p.dim() == 2)


@pytest.mark.parametrize("width", [0, 8, 9])
def test_action_width_must_be_inside_the_sequence(width):
    pol = MultiAgentPolicy(_cfg("per_agent", AgentSpec("a", "tiny-llama")))
    ids, mask, _ = _batch()
    with pytest.raises(InvalidArgumentError):
        pol.logprobs("a", ids, mask, torch.ones(2, width))
    with pytest.raises(NotFoundError):
        pol.logprobs("zz", ids, mask, torch.ones(2, 3))


def test_reference_stays_frozen_while_the_policy_trains():
    pol = MultiAgentPolicy(_cfg("per_agent", AgentSpec("a", "tiny-llama")))
    ids, mask, am = _batch()
    ref0 = pol.ref_logprobs("a", ids, mask, am)
    assert torch.allclose(ref0, pol.logprobs("a", ids, mask, am).detach())
    opt = torch.optim.SGD(pol.parameters("a"), lr=1.0)
    pol.logprobs("a", ids, mask, am).sum().backward()
    opt.step()
    assert not torch.allclose(pol.logprobs("a", ids, mask, am).detach(), ref0)
    assert torch.equal(pol.ref_logprobs("a", ids, mask, am), ref0)


def test_shared_mode_one_model_role_prompts_and_versions():
    pol = MultiAgentPolicy(
        _cfg(
            "shared",
            AgentSpec("planner", "tiny-llama", role="You plan."),
            AgentSpec("critic", "tiny-llama", is_tuning=False),
        )
    )
    assert pol.model("planner") is pol.model("critic")
    assert pol.unit_of("planner") == pol.unit_of("critic") == "shared"
    assert pol.chat("planner", [{"role": "user", "content": "go"}])[0] == {
        "role": "system",
        "content": "You plan.",
    }
    assert pol.chat("critic", [{"role": "user", "content": "go"}]) == [{"role": "user", "content": "go"}]
    assert pol.bump_version("planner") == 1 and pol.version("critic") == 1
    ids, mask, am = _batch()
    assert not pol.logprobs("critic", ids, mask, am).requires_grad
    assert pol.logprobs("planner", ids, mask, am).requires_grad


def test_lora_mode_keeps_one_base_copy_and_separate_adapters():
    pol = MultiAgentPolicy(
        _cfg(
            "lora",
            AgentSpec("a", "tiny-llama"),
            AgentSpec("b", "tiny-llama"),
            AgentSpec("c", "tiny-llama", is_tuning=False),
        )
    )
    model = pol.model("a")
    assert pol.model("b") is model and pol.model("c") is model
    base_params = sum(p.numel() for n, p in model.named_parameters() if "lora_" not in n)
    tok = load_tokenizer("tiny-llama")
    assert base_params == count_parameters(build_tiny_model(tok))  # exactly one base copy
    pa, pb = pol.parameters("a"), pol.parameters("b")
    assert pa and pb and not {id(p) for p in pa} & {id(p) for p in pb} and pol.parameters("c") == []
    assert count_parameters(model, trainable_only=True) == sum(p.numel() for p in pa + pb)
    ids, mask, am = _batch()
    pol.logprobs("a", ids, mask, am).sum().backward()
    assert all(p.grad is not None for p in pa if ".lora_A." in _name(model, p))
    assert all(p.grad is None for p in pb)
    ref = pol.ref_logprobs("a", ids, mask, am)
    with torch.no_grad():
        for p in pa:
            p.add_(torch.randn_like(p))
    assert not torch.allclose(pol.logprobs("a", ids, mask, am).detach(), ref, atol=1e-4)
    assert torch.allclose(
        pol.logprobs("b", ids, mask, am).detach(), ref, atol=1e-5
    )  # b's adapter is still zero
    assert torch.equal(pol.ref_logprobs("a", ids, mask, am), ref)  # base without adapter


def _name(model, param):
    return next(n for n, p in model.named_parameters() if p is param)


@pytest.mark.parametrize("mode", ["per_agent", "shared", "lora"])
def test_save_and_load_round_trip(mode, tmp_path):
    agents = (AgentSpec("a", "tiny-llama"), AgentSpec("b", "tiny-llama"))
    pol = MultiAgentPolicy(_cfg(mode, *agents))
    with torch.no_grad():
        for a in pol.trainable_agents:
            for p in pol.parameters(a):
                p.add_(torch.randn_like(p) * 0.1)
    pol.bump_version("a")
    ids, mask, am = _batch()
    expected = {a: pol.logprobs(a, ids, mask, am).detach() for a in pol.agent_ids}
    pol.save(tmp_path / "ckpt")
    fresh = MultiAgentPolicy(_cfg(mode, *agents))
    assert not torch.allclose(fresh.logprobs("a", ids, mask, am).detach(), expected["a"])
    fresh.load(tmp_path / "ckpt")
    for a in pol.agent_ids:
        assert torch.allclose(fresh.logprobs(a, ids, mask, am).detach(), expected[a], atol=1e-6)
    assert fresh.version("a") == 1
    other = MultiAgentPolicy(_cfg("per_agent" if mode != "per_agent" else "shared", *agents))
    with pytest.raises(FailedPreconditionError):
        other.load(tmp_path / "ckpt")
    with pytest.raises(NotFoundError):
        fresh.load(tmp_path / "missing")


def test_lora_alpha_is_not_rounded_on_its_way_to_the_adapters():
    """``policy.lora_alpha`` is a float key: 2.5 with rank 4 scales the update by 0.625 (it was cut to int 2)."""
    from marti.config import load_config
    from services.trainer.ray.policy_worker import policy_layout

    cfg = load_config("examples/tiny.yaml", ["policy.lora_alpha=2.5", "policy.lora_r=4"])
    layout = policy_layout(cfg)
    assert layout.lora.alpha == 2.5
    model = MultiAgentPolicy(layout).model("agent_1")
    scalings = [m.scaling["agent0"] for m in model.modules() if isinstance(getattr(m, "scaling", None), dict)]
    assert scalings and all(s == pytest.approx(2.5 / 4) for s in scalings)


def test_full_weights_save_and_load_under_zero3_with_tied_embeddings(tmp_path):
    """``per_agent`` under ZeRO-3 (CPU, gloo): the gathered weights are views of a flat buffer, where
    safetensors' ``save_model`` refused the tied head and embedding; a checkpoint now round-trips them."""
    from services.trainer.strategy.base import OptimConfig
    from services.trainer.strategy.deepspeed_strategy import DeepSpeedStrategy

    def zero3(seed):
        pol = MultiAgentPolicy(
            _cfg("per_agent", AgentSpec("a", "tiny-llama"), keep_reference=False, seed=seed)
        )
        opt = OptimConfig(lr=1e-2, total_steps=2)
        return pol, DeepSpeedStrategy(zero_stage=3).setup(pol.model("a"), pol.parameters("a"), opt)

    pol, eng = zero3(0)
    assert pol.model("a").config.tie_word_embeddings
    with eng.gathered():
        pol.save(tmp_path)
        saved = {n: p.detach().clone() for n, p in pol.model("a").named_parameters()}
    other, eng2 = zero3(5)
    with eng2.gathered(modify=True):
        other.load(tmp_path)
    with eng2.gathered():
        got = dict(other.model("a").named_parameters())
        assert saved.keys() == got.keys() and all(torch.equal(saved[n], got[n]) for n in saved)


def test_a_weights_file_that_does_not_fit_the_model_is_refused(tmp_path):
    from services.trainer.models.weights_file import load_weights, save_weights

    save_weights(torch.nn.Linear(2, 2), tmp_path / "w.safetensors")
    with pytest.raises(
        FailedPreconditionError, match=r"missing \['0.weight', '0.bias'\], unexpected \['bias'"
    ):
        load_weights(torch.nn.Sequential(torch.nn.Linear(2, 2)), tmp_path / "w.safetensors", "cpu")


def test_lora_sync_state_is_pefts_state_dict_read_from_the_live_adapter(tmp_path, monkeypatch):
    import peft

    pol = MultiAgentPolicy(_cfg("lora", AgentSpec("a", "tiny-llama"), AgentSpec("b", "tiny-llama")))
    model = pol.model("a")
    for agent, adapter in (("a", "agent0"), ("b", "agent1")):
        want = peft.get_peft_model_state_dict(model, adapter_name=adapter)
        got = pol.state_for_sync(agent)
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
        assert not any(v.requires_grad for v in got.values())
    before = {k: v.clone() for k, v in pol.state_for_sync("a").items()}

    def no_walk(*args, **kwargs):
        raise AssertionError("peft's state dict walked again")

    monkeypatch.setattr(peft, "get_peft_model_state_dict", no_walk)
    with torch.no_grad():  # an optimizer step writes the adapter in place
        for p in pol.parameters("a"):
            p.add_(1.0)
    after = {k: v.clone() for k, v in pol.state_for_sync("a").items()}
    assert all(torch.equal(after[k], before[k] + 1.0) for k in before)
    monkeypatch.undo()
    pol.save(tmp_path / "ckpt")  # a checkpoint load writes into the same parameters
    with torch.no_grad():
        for p in pol.parameters("a"):
            p.zero_()
    pol.load(tmp_path / "ckpt")
    monkeypatch.setattr(peft, "get_peft_model_state_dict", no_walk)
    restored = pol.state_for_sync("a")
    assert all(torch.equal(restored[k], after[k]) for k in after)
