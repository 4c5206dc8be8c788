"""marti-agent: open infrastructure for training teams of LLM agents with reinforcement learning."""

__version__ = "0.1.0"
