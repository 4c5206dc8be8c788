"""The job story, in folders by role: :mod:`.cli` (``marti train`` / ``marti eval``), :mod:`.service` (the
trainer service's jobs, gRPC adapter and settings), :mod:`.run` (the training loop, the run folder, checkpoints,
the run summary and the checks before a run) and :mod:`.connections` (service addresses and token, the job's
channels and clients, reconnects, the hosted inference gateway). A folder imports only the ones after it in
that list, and ``cli`` and ``service`` not each other (the layers contract in pyproject.toml, ``lint-imports``)."""
