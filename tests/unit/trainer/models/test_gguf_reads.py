"""``gguf_reads_once``: one ``GGUFReader`` per file and one tensor-name map per architecture while a conversion
runs, the library's own functions back afterwards (a tiny GGUF file written with gguf-py's writer)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from services.trainer.models.gguf_reads import gguf_reads_once


@pytest.fixture
def tiny_gguf(tmp_path):
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(2)
    writer.add_tensor("token_embd.weight", np.arange(12, dtype=np.float32).reshape(3, 4))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_file_is_parsed_once_within_the_block_and_anew_outside(tiny_gguf):
    reader_cls = gguf.GGUFReader
    with gguf_reads_once():
        first = gguf.GGUFReader(tiny_gguf)
        assert gguf.GGUFReader(str(tiny_gguf)) is first  # same file, as a str or a Path
        assert first.tensors[0].name == "token_embd.weight"
        assert np.array_equal(first.tensors[0].data.reshape(3, 4), np.arange(12).reshape(3, 4))
    assert gguf.GGUFReader is reader_cls
    assert gguf.GGUFReader(tiny_gguf) is not first


def test_tensor_name_maps_are_built_once_per_architecture():
    with gguf_reads_once():
        a = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is a
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 3) is not a
        assert a.get_name("model.layers.1.self_attn.q_proj") == "blk.1.attn_q"
    assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is not a  # the library's own again


def test_nested_blocks_share_the_outer_memos_and_restore_on_error(tiny_gguf):
    reader_cls, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with pytest.raises(RuntimeError), gguf_reads_once():
        outer = gguf.GGUFReader(tiny_gguf)
        with gguf_reads_once():
            assert gguf.GGUFReader(tiny_gguf) is outer
        raise RuntimeError("the conversion failed")
    assert gguf.GGUFReader is reader_cls and gguf.get_tensor_name_map is name_map
