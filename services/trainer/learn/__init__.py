"""The learner: experience batches, advantages and losses (:mod:`.algo`), the policy update, critics, EMA and the
per-step training budget."""
