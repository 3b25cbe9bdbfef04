"""The stated maxima of sizes a user gives (imports nothing: the CLI checks them before torch is imported).

Every size that would allocate or spawn in proportion to its value is bounded here and checked where it
enters, before any allocation: a typo such as ``--layers 0-1000000000`` is refused at once, never
expanded.
"""

from __future__ import annotations

__all__ = ["MAX_LAYER_INDEX", "MAX_NULLS"]

#: The largest layer index accepted anywhere (``layers=``, ``--layers``): checked before a range is
#: expanded (the deepest models have a few hundred layers; whether a layer exists is then checked
#: against the model).
MAX_LAYER_INDEX = 65_535

#: The largest number of scramble draws per head accepted (the Haar pools of a layer hold
#: ``2 · nulls · d_head²`` float64 values: 100,000 draws at d_head 128 is 26 GB).
MAX_NULLS = 100_000
