"""Layer 4 — every route from a model or a file to per-layer head factors (``LayerHeads``).

Modules: :mod:`.tl` (TransformerLens models), :mod:`.checkpoint` (safetensors / GGUF files
and ``transformers`` models, streamed layer by layer), :mod:`.architectures` (where each
architecture keeps its attention O/V tensors), :mod:`.layouts` (the V/O tensor layouts, each
one object), :mod:`.stores` and :mod:`.gguf_store` (tensor stores), :mod:`.zoo` (the offline
model zoo), :mod:`.lineage` (a small seeded training lineage), :mod:`.dispatch`
(:func:`~tl_idempotence.sources.dispatch.head_source`: any model -> a HeadSource).
Sources produce factors and never compute a metric.
"""
