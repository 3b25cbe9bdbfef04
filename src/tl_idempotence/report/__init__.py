"""Layer 6 — the report: the per-layer loop over the analyses, its summary and paper table,
resume parts and the save format (parquet + JSON)."""
