"""Read a GGUF file once per conversion, not once per transformers call.

Converting the real base model (:func:`services.trainer.models.loading.load_model` on a GGUF) makes transformers
call ``load_gguf_checkpoint`` for the config, the weights and the tokenizer, and each call opens a new
``gguf.GGUFReader``, which parses every metadata field of the file in Python (SmolLM2-135M's 49,152-token
vocabulary: about 4 s per open under a profiler on a 2-core Xeon, 2026-12-06). Mapping the weight names then
rebuilds gguf-py's ``TensorNameMap`` for every submodule of the model (397 times for SmolLM2-135M). Both are pure
functions of their arguments, so :func:`gguf_reads_once` memoises them while a conversion runs: on that machine
the first load of SmolLM2-135M-Instruct (empty cache, tokenizer included) took 19 s before and 9-10 s after, the
cache files byte-identical (docs/models.md).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Iterator
from typing import Any

_PATCH_LOCK = threading.RLock()


@contextlib.contextmanager
def gguf_reads_once() -> Iterator[None]:
    """Within the block, ``gguf.GGUFReader(path, mode)`` returns one reader per (absolute path, mode) and
    ``gguf.get_tensor_name_map(arch, n_blocks)`` one map per argument pair; both are put back on exit.

    transformers imports both names from ``gguf`` at call time (``from gguf import GGUFReader``), so the
    memoised versions are the ones its GGUF loading uses. The block holds a lock: one conversion at a time per
    process, and nested blocks share the outer one's memos. A reader is read-only (``mode='r'`` maps the file
    read-only), so sharing it between the config, weights and tokenizer reads returns what separate readers do.

    Raises:
        ImportError: the ``gguf`` package is not installed (transformers needs it to read a GGUF anyway).
    """
    import gguf

    with _PATCH_LOCK:
        if getattr(gguf.GGUFReader, "_marti_memoised", False):  # nested: the outer block's memos serve
            yield
            return
        reader_cls, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
        readers: dict[tuple[str, str], Any] = {}

        def reader_once(path: os.PathLike[str] | str, mode: str = "r") -> Any:
            key = (os.path.abspath(os.fspath(path)), mode)
            if key not in readers:
                readers[key] = reader_cls(path, mode)
            return readers[key]

        reader_once._marti_memoised = True  # type: ignore[attr-defined]
        gguf.GGUFReader = reader_once
        gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(name_map)
        try:
            yield
        finally:
            gguf.GGUFReader, gguf.get_tensor_name_map = reader_cls, name_map
