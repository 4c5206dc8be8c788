"""The ``marti`` command: its subcommands (:mod:`marti.command.main`), the local stack of ``marti up``,
``marti top`` and the OpenRLHF-style launch flags of ``marti train``."""
