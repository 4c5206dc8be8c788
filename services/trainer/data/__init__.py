"""The experience data path between the episode runner, the experience store and the learner."""
