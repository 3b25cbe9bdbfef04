"""Layer 1 — the closure maths on per-layer head factors (SPEC sections 1-3). Imports torch only.

Modules: :mod:`.heads` (``LayerHeads``, ``ModelInfo``, ``HeadSource``, ``kv_layout``),
:mod:`.closure` (Gram products, α, P, ``Closure``), :mod:`.factors` (ranks, principal
coordinates), :mod:`.random` (seeded Haar sampling), :mod:`.options` (argument checks,
``ReportOptions``), :mod:`.files` (sha256, atomic writes), :mod:`.results` (the result mixin).
"""
