"""Models: model and tokenizer loading (:mod:`.loading`) and the multi-agent policies (:mod:`.policy`)."""
