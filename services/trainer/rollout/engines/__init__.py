"""Rollout engines: the :class:`~.base.RolloutEngine` interface, its implementations (transformers ``generate``,
the static-cache decode loop, vLLM, the model-free instant engine, a pool of engines), their helpers (sampling
dtype, shared-prompt prefill) and how an actor builds its engine and samples turns (:mod:`.generation`)."""
