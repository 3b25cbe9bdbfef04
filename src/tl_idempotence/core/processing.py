"""The weight-processing flags, defined once (SPEC 10: always record what weights were measured).

Sources record them in ``ModelInfo.processing`` / ``summary["processing"]``; comparisons and trajectories
key on :data:`T_PROCESSING`; the views phrase them. Imports nothing (the CLI and the zoo use it torch-free).
"""

from __future__ import annotations

__all__ = ["PROCESSING_FLAGS", "T_PROCESSING"]

#: TransformerLens's weight-processing flags as a report's ``summary["processing"]`` records them.
PROCESSING_FLAGS = ("fold_ln", "center_writing_weights", "center_unembed", "fold_value_biases")
#: What changes an attention head's T (``center_unembed`` touches only the unembedding), with ``raw`` first:
#: what compared models and the checkpoints of a trajectory must agree on.
T_PROCESSING = ("raw", "fold_ln", "center_writing_weights", "fold_value_biases")
