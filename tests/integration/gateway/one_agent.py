"""What the gateway tests' scripted backends share: one agent ``a``, always at policy version 0."""

from __future__ import annotations


class OneAgent:
    """Mixin for a test :class:`~services.gateway.core.backend.InferenceBackend` serving agent ``a`` only, at
    version 0 (the only resident one), with a context of ``context`` tokens."""

    context = 100_000

    def agents(self) -> list[str]:
        """``["a"]``."""
        return ["a"]

    def versions(self) -> dict[str, int]:
        """``{"a": 0}``."""
        return {"a": 0}

    def resident_versions(self, agent: str) -> list[int]:
        """``[0]``."""
        return [0]

    def max_model_len(self, agent: str) -> int:
        """:attr:`context`."""
        return self.context
