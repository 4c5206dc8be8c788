"""Playing a step's episodes: the runner (:mod:`.runner`), which env and task each episode plays (:mod:`.env_config`,
:mod:`.scheduler`), a dataset job's reward scorers (:mod:`.scoring`) and asynchronous rollouts (:mod:`.producer`)."""
