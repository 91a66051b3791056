"""The qemu provider: ale-built Linux guests under QEMU (see ``sandbox.py``)."""
