"""``python -m benchmarks.scale``: the bench (:func:`benchmarks.scale.cli.main`), or with ``--paced-worker`` first,
one client process of its paced phase (:func:`benchmarks.scale.paced_worker.worker_main`)."""

import sys

from benchmarks.scale.cli import main
from benchmarks.scale.paced_worker import worker_main

if __name__ == "__main__":
    raise SystemExit(worker_main() if sys.argv[1:2] == ["--paced-worker"] else main())
