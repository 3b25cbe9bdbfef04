"""``python -m tl_idempotence``: the ``tl-idempotence`` command line (:func:`tl_idempotence.cli.console_main`)."""

import sys

from .cli import console_main

if __name__ == "__main__":  # sweep's Dask workers re-import the main module: only run as the script
    sys.exit(console_main())
