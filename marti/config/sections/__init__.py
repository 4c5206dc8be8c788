"""The sections of the training config, one module each (``algorithm:``, ``dataset:``, ``reward:``,
``rollout:``, ``workflow:``, ``gateway:``), the problem-seed schedule and the checks of a dataset job's
team; :mod:`marti.config.schema` puts them together."""
