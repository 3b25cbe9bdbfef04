"""Layer 1 — the closure maths on per-layer head factors (SPEC sections 1-3).

Imports torch, numpy and jaxtyping (and nothing of the layers above).

Modules: :mod:`.heads` (``LayerHeads``, ``ModelInfo``, ``HeadSource``, ``kv_layout``),
:mod:`.closure` (Gram products, α, P, ``Closure``), :mod:`.factors` (ranks, principal
coordinates), :mod:`.random` (seeded Haar sampling), :mod:`.options` (argument checks,
``ReportOptions``), :mod:`.kwargs` (unknown-keyword errors, torch-free), :mod:`.files` (sha256,
atomic writes, the package's code sha256), :mod:`.progress` (progress bars), :mod:`.results`
(the result mixin).
"""
