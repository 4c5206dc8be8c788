"""The trainer service: its jobs, one thread each (:mod:`.jobs`), the gRPC adapter (:mod:`.servicer`) and the
``MARTI_TRAINER_*`` settings (:mod:`.settings`)."""
