"""Layer 5 — the paper's analyses, each a per-layer function of a ``LayerContext`` (SPEC 4-8).

:mod:`.base` defines the contract (``LayerContext`` -> ``LayerResult``) and the list of
report analyses; :mod:`.closure`, :mod:`.scramble`, :mod:`.mismatch`, :mod:`.search`,
:mod:`.algebra` implement it. :mod:`.orientation` holds what the orientation-only
controls share. These are weight-only; the forward-pass probes (activation returns, attention
patterns, ablations) are the sibling layer :mod:`tl_idempotence.probes`.
"""
