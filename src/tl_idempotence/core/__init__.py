"""Layer 1 — per-layer head factors, options, records and files: what every layer above shares.

Imports torch, numpy and jaxtyping (nothing of the layers above; the closure maths is :mod:`tl_idempotence.maths`).

Modules: :mod:`.heads` (``LayerHeads``, ``ModelInfo``, ``HeadSource``, ``kv_layout``), :mod:`.factors` (ranks,
principal coordinates), :mod:`.random` (seeded Haar sampling), :mod:`.options` (argument checks,
``ReportOptions``), :mod:`.kwargs` (unknown-keyword errors, torch-free), :mod:`.files` (sha256,
atomic writes, the package's code sha256), :mod:`.progress` (progress bars), :mod:`.results`
(the result mixin), :mod:`.outputs` (the output registry), :mod:`.readings` (headline sentences), :mod:`.paper`
(the paper's figures).
"""
