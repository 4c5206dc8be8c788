"""``python -m marti``: the ``marti`` command (:func:`marti.command.main.main`), for an environment whose scripts folder is not
on ``PATH``."""

import sys

from marti.command.main import main

if __name__ == "__main__":
    sys.exit(main())
