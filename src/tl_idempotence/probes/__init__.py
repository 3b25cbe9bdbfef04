"""Layer 5 (beside :mod:`tl_idempotence.analyses`) — forward-pass probes: they run a model on text.

:mod:`.tokens` (real text as token windows), :mod:`.activations` (activation-level
returns, SPEC 8), :mod:`.attention` (attention patterns of flagged heads: the data behind the views),
:mod:`.ablation` (loss change when flagged heads are ablated, against matched random head sets).
They import ``core``, ``sources`` and ``errors`` only; the weight-only analyses never import them, nor
they the analyses (the layering test forbids imports sideways between the two).
"""
