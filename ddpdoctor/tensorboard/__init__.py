"""ddpdoctor in TensorBoard: event files per rank, and a ``ddpdoctor`` dashboard plugin.

- ``discover``: find run directories under a TensorBoard logdir, and resolve a run name safely.
- ``capture_metrics``: rank metrics from the capture files alone (``ranks/rank<R>.json``), for when the trace
  metrics are not available.
- ``report``: the dashboard's JSON for one run (diagnosis output plus the tables its charts draw).
- ``events``: ``write_events(run_dir)``: scalars and findings as TensorBoard event files, one folder per rank.
- ``loader`` / ``plugin``: the TensorBoard plugin (entry point ``tensorboard_plugins: ddpdoctor``).
- ``server``: start TensorBoard on a run directory (``ddpdoctor view``).

Nothing here imports TensorBoard or torch at package import time.
"""
