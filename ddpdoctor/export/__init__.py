"""Exports of a run for other viewers: ``perfetto`` (one clock-aligned Chrome trace of every rank)."""
