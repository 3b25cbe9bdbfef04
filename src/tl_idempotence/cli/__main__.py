"""``python -m tl_idempotence.cli``: the ``tl-idempotence`` console script."""

import sys

from . import console_main

if __name__ == "__main__":  # sweep's Dask workers re-import the main module: only run as the script
    sys.exit(console_main())
