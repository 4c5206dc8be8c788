"""What this machine's CPU computes natively, read from ``/proc/cpuinfo`` (Linux).

The SDK's launch flags (``--bf16``) and the trainer service (``rollout.dtype: auto``, ``strategy.bf16`` on the
CPU) ask the same question here, so both read one copy of the check.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["BF16_CPU_FLAGS", "CPUINFO", "cpu_has_bf16"]

#: /proc/cpuinfo flags of native bf16 arithmetic (AVX512-BF16 dot products, AMX bf16 tiles).
BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})

CPUINFO = Path("/proc/cpuinfo")
"""Where the CPU's flags are read (tests pass their own file)."""


def cpu_has_bf16(cpuinfo: Path = CPUINFO) -> bool:
    """Whether the CPU computes bf16 natively: a ``flags`` line of ``cpuinfo`` names ``avx512_bf16`` or
    ``amx_bf16``. False where the file is missing or unreadable (macOS, Windows: fp32 there)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return False
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags" and BF16_CPU_FLAGS & set(value.split()):
            return True
    return False
