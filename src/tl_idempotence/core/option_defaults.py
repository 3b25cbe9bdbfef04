"""The defaults of the general options, in one place (imports nothing: the CLI reads them before torch).

The report's options (:data:`~tl_idempotence.core.option_specs.GENERAL_OPTIONS`) and every standalone function
taking the same parameter (``closure``, ``orientation_scramble``, ``mismatch``, ``constructive_search``,
``shared_value_algebra``, ``activation_returns``) read them here, so ``help()`` on each shows the same value.
"""

from __future__ import annotations

__all__ = ["DEFAULT_COMPUTE_DTYPE", "DEFAULT_DEVICE", "DEFAULT_THRESHOLD"]

#: P threshold of a "closed" head, in [0, 1] (SPEC 3; the paper's 0.9).
DEFAULT_THRESHOLD = 0.9

#: dtype of the ``d_model``-long Gram products, by name (``torch.float64``; the ``d_head``-sized algebra is
#: float64 whatever is chosen).
DEFAULT_COMPUTE_DTYPE = "float64"

#: where the products and the controls run (results are CPU float64 wherever they run).
DEFAULT_DEVICE = "cpu"
