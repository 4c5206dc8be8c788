"""``python -m benchmarks.trainer``: the bench (:func:`benchmarks.trainer.cli.main`), also our side's child process
(``--_ours SPEC OUT``: one side in a fresh process, as the bench starts it)."""

from benchmarks.trainer.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
