"""The marti trainer: multi-agent RL for teams of LLM agents.

Sub-packages: ``algo`` (pure-torch advantage estimators and losses), and the rollout, strategy, Ray and loop
modules built on top of it.
"""
