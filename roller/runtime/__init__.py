"""Running on a device: the ``Runner`` and ``Device`` contracts the backends implement, and the executor that
runs a planned graph with its data kept on the device."""
