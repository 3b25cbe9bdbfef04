"""``python -m tl_idempotence.cli``: the ``tl-idempotence`` console script."""

import sys

from . import console_main

sys.exit(console_main())
