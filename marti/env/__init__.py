"""Environments: :func:`marti.make` (:mod:`marti.env.make`), the env registry, typed env configs, the input
guard around any env and the Gymnasium single-agent view."""
