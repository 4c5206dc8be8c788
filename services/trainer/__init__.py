"""The marti trainer: multi-agent RL for teams of LLM agents, in folders by role.

- ``job``: the job story (the training loop, the trainer service's jobs, run folders, checkpoints, the CLIs);
- ``ray``: the Ray runtime and its actors (policy, rollout, reference and critic workers);
- ``rollout``: playing episodes and generating turns (the episode runner, rollout engines, task scheduling);
- ``learn``: the learner (experience batches, ``learn.algo``'s pure-torch estimators and losses, critics, EMA);
- ``models``: model loading and the multi-agent policies;
- ``data``: the experience data path through the store;
- ``strategy``: training strategies (torch, DeepSpeed);
- ``observe``: metrics, progress, reports and the resource monitor.
"""
