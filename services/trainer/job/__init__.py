"""The job story: the training loop, jobs of the trainer service, run folders, checkpoints and the CLIs."""
