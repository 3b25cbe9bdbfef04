"""A deprecated keyword, as a script run by python shows it (a subprocess: the integration tier)."""

from __future__ import annotations

import os


def test_a_deprecated_keyword_is_shown_under_the_default_warning_filters():
    """A script run as python does (no -W, no pytest filters): Python shows a DeprecationWarning only when
    __main__ triggers it, so it must be attributed to the script's line (it was core/kwargs.py: silent)."""
    import subprocess
    import sys

    code = (
        "import torch, tl_idempotence as tli\n"
        "O = torch.randn(16, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))\n"
        "tli.orientation_scramble((O, O.T.contiguous()), n_draws=4)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "<string>:3: DeprecationWarning: orientation_scramble(n_draws=...) is deprecated" in out.stderr
