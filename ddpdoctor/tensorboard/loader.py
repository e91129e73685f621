"""The ``tensorboard_plugins`` entry point: imports ``ddpdoctor.tensorboard.plugin`` when TensorBoard starts.

In its own module, as TensorBoard asks of loaders, so a broken import cannot break TensorBoard itself.
"""

from __future__ import annotations

from tensorboard.plugins import base_plugin


class DDPDoctorLoader(base_plugin.TBLoader):
    """Creates the ``ddpdoctor`` dashboard plugin (imported here, when TensorBoard asks for it)."""

    def load(self, context: base_plugin.TBContext) -> base_plugin.TBPlugin | None:
        from ddpdoctor.tensorboard.plugin import DDPDoctorPlugin

        return DDPDoctorPlugin(context)
