"""ddpdoctor in TensorBoard: event files per rank, and a ``ddpdoctor`` dashboard plugin.

- ``discover``: find run directories under a TensorBoard logdir, and resolve a run name safely.
- ``report``: the dashboard's JSON for one run (the pipeline's diagnosis plus the tables its charts draw).
- ``events``: ``write_events(run_dir)``: scalars and findings as TensorBoard event files, one folder per rank.
- ``loader`` / ``plugin``: the TensorBoard plugin (entry point ``tensorboard_plugins: ddpdoctor``).
- ``server``: start TensorBoard on a run directory (``ddpdoctor view``).

Nothing here imports TensorBoard or torch at package import time.
"""
