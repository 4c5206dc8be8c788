"""The job's command lines: ``marti train`` (:mod:`.train_cli`) and ``marti eval`` (:mod:`.eval_cli`)."""
