"""One training run: the loop (:mod:`.loop`), what it reports when it ends (:mod:`.summary`), the run folder's
guard (:mod:`.run_dir`), checkpoints and RNG state (:mod:`.checkpoint`) and what ``marti train`` checks before
the run folder (:mod:`.prechecks`, :mod:`.prompt_lengths`)."""
