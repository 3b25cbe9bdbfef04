"""``python -m tl_idempotence``: the ``tl-idempotence`` command line (:func:`tl_idempotence.cli.console_main`)."""

import sys

from .cli import console_main

sys.exit(console_main())
