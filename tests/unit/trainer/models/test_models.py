"""Model resolution and loading: aliases, offline errors, tiny model determinism, GGUF conversion cache."""

from __future__ import annotations

import pytest
import torch

from marti.errors import InvalidArgumentError, NotFoundError
from services.trainer.models import loading as models
from services.trainer.models.loading import (
    TinyModelConfig,
    build_tiny_model,
    count_parameters,
    load_model,
    load_tokenizer,
)
from services.trainer.models.resolve import SMOLLM2_ALIAS, model_cache_root, resolve_model, smollm2_gguf_path


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-llama")


def test_aliases_resolve_to_the_shipped_gguf_or_its_cache():
    for name in ("smollm2-135m-instruct", "HuggingFaceTB/SmolLM2-135M-Instruct", "SMOLLM2-135M-INSTRUCT"):
        r = resolve_model(name)
        assert r.kind in ("gguf", "hf_dir")
        assert r.cache_dir == model_cache_root() / SMOLLM2_ALIAS
    assert resolve_model("tiny-llama").kind == "tiny"
    assert smollm2_gguf_path().is_file()


def test_unknown_model_names_the_model_and_the_places_looked(tmp_path, monkeypatch):
    monkeypatch.setenv("MARTI_MODEL_CACHE", str(tmp_path / "cache"))
    with pytest.raises(NotFoundError) as err:
        resolve_model("acme/unknown-7b")
    msg = str(err.value)
    assert "acme/unknown-7b" in msg and "looked in" in msg and str(tmp_path / "cache") in msg
    with pytest.raises(NotFoundError):
        load_model(str(tmp_path / "missing.gguf"))


@pytest.mark.parametrize("bad", ["", "   "])
def test_empty_model_name_is_invalid(bad):
    with pytest.raises(InvalidArgumentError):
        resolve_model(bad)


def test_cache_root_follows_env(tmp_path, monkeypatch):
    monkeypatch.setenv("MARTI_MODEL_CACHE", str(tmp_path))
    assert model_cache_root() == tmp_path
    monkeypatch.delenv("MARTI_MODEL_CACHE")
    assert model_cache_root().parts[-3:] == ("marti", "models") or model_cache_root().name == "models"


def test_tokenizer_pads_left_and_has_chat_template(tok):
    assert tok.padding_side == "left"
    assert tok.pad_token_id is not None and tok.eos_token == "<|im_end|>"
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("<|im_start|>assistant\n")


def test_tiny_model_is_seeded_and_leaves_global_rng_alone(tok):
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a = build_tiny_model(tok, seed=0)
    assert torch.equal(torch.get_rng_state(), before)
    b = build_tiny_model(tok, seed=0)
    c = build_tiny_model(tok, seed=1)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(
        sa["model.layers.0.self_attn.q_proj.weight"], sc["model.layers.0.self_attn.q_proj.weight"]
    )
    assert a.config.num_hidden_layers == 2 and a.config.hidden_size == 64
    assert 3_000_000 < count_parameters(a) < 3_500_000  # 49,152 x 64 tied embedding dominates


@pytest.mark.parametrize(
    "cfg",
    [
        TinyModelConfig(num_layers=0),
        TinyModelConfig(hidden_size=60, num_attention_heads=8),
        TinyModelConfig(num_key_value_heads=3),
    ],
)
def test_tiny_model_rejects_bad_shapes(tok, cfg):
    with pytest.raises(InvalidArgumentError):
        build_tiny_model(tok, config=cfg)


def test_local_hf_folder_loads_same_weights(tok, tmp_path):
    model = build_tiny_model(tok, seed=3)
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    loaded = load_model(str(tmp_path / "m"))
    assert resolve_model(str(tmp_path / "m")).kind == "hf_dir"
    ref = model.state_dict()
    assert all(torch.equal(ref[k], v) for k, v in loaded.state_dict().items())
    assert load_tokenizer(str(tmp_path / "m")).padding_side == "left"
    # no hub kernels: nothing is fetched, and a train()/eval() switch does not re-kernelize the model
    assert loaded.use_kernels is False
    loaded.train(True)
    assert loaded.kernels_mode is None and loaded.training


@pytest.mark.slow
def test_gguf_converts_once_then_loads_from_the_cache(tmp_path, monkeypatch):
    import gguf

    monkeypatch.setenv("MARTI_MODEL_CACHE", str(tmp_path))
    assert resolve_model(SMOLLM2_ALIAS).kind == "gguf"
    opened, mapped = [], []
    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    monkeypatch.setattr(gguf, "GGUFReader", lambda *a, **k: opened.append(a) or reader(*a, **k))
    monkeypatch.setattr(gguf, "get_tensor_name_map", lambda *a: mapped.append(a) or name_map(*a))
    first = load_model(SMOLLM2_ALIAS)
    # the config, weight and tokenizer reads share one parse of the file and one tensor-name map (gguf_reads)
    assert len(opened) == 1 and len(mapped) == 1, (opened, mapped)
    weights = tmp_path / SMOLLM2_ALIAS / "model.safetensors"
    assert weights.is_file()
    assert (tmp_path / SMOLLM2_ALIAS / "tokenizer.json").is_file()
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct").kind == "hf_dir"
    written = weights.stat().st_mtime_ns

    def no_conversion(*args, **kwargs):
        raise AssertionError("the second load converted or saved again")

    monkeypatch.setattr(models, "_save_atomically", no_conversion)
    monkeypatch.setattr(models, "_tokenizer_from_gguf", no_conversion)
    second = load_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert weights.stat().st_mtime_ns == written  # read from the cache, not written again
    assert 134_000_000 < count_parameters(second) < 135_000_000
    assert first.use_kernels is False and second.use_kernels is False  # no hub kernels
    s1, s2 = first.state_dict(), second.state_dict()
    assert all(torch.equal(s1[k], s2[k]) for k in s2)


def test_max_positions_of_a_model_folder_come_from_its_config_json_without_transformers_config_classes(
    tmp_path,
):
    """A folder's ``config.json`` stating ``max_position_embeddings`` is read as JSON (no config class imported: a
    ``marti train`` driver checks every agent's reply length with it before anything starts); a folder whose
    config names its length otherwise (GPT-2's ``n_positions``) goes through ``AutoConfig``."""
    import json
    import subprocess
    import sys

    llama, gpt2 = tmp_path / "llama", tmp_path / "gpt2"
    for folder, config in ((llama, {"model_type": "llama", "max_position_embeddings": 777}),
                           (gpt2, {"model_type": "gpt2", "n_positions": 321})):  # fmt: skip
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))
    code = (
        "import sys\n"
        "from services.trainer.models.model_config import model_max_positions\n"
        f"print(model_max_positions({str(llama)!r}))\n"
        "print(sorted(m for m in sys.modules if m.startswith('transformers.models.')))\n"
        f"print(model_max_positions({str(gpt2)!r}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert out[0] == "777" and out[1] == "[]", out
    assert out[2] == "321", out


@pytest.mark.parametrize(
    "module", ["services.trainer.models.model_config", "services.trainer.models.loading"]
)
def test_importing_the_model_modules_turns_hub_access_off_before_transformers_loads(module):
    """No hub: the variables transformers and huggingface_hub read at their import are set by either module's import
    (docs/models.md), before transformers itself is imported; a value the user set is kept."""
    import os
    import subprocess
    import sys

    code = (
        "import os, sys\n"
        f"import {module}\n"
        "print(os.environ.get('HF_HUB_OFFLINE'), os.environ.get('TRANSFORMERS_OFFLINE'), 'transformers' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert run.stdout.split() == ["1", "1", "False"], run.stdout
    kept = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**env, "HF_HUB_OFFLINE": "0"},
    )
    assert kept.stdout.split()[0] == "0", kept.stdout
