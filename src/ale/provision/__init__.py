"""Provisioning a task's software before the seal.

What a task needs (its card's ``software`` list, its variant's ``input/runtime_env/``
manifests, an ``environment`` block in ale's own cards, an operator's overlay) is
resolved here into a ``SoftwareSpec`` (``ale.sandbox.software``), which the sandbox
layer builds into a content-cached image on the trusted side, before any run.

- ``catalogue``: ``catalogue.json`` (free-form names → Debian 12 packages, PyPI
  requirements, a check command; what nothing provides, with why), ``load_catalogue``;
- ``sources``: the ``environment`` block, the ``runtime_env`` manifests, the overlay
  (``load_overlay``), each validated;
- ``needs``: ``resolve_needs(task_dir, input_dir=, overlay=)`` → ``Provisioning``
  (``spec`` or ``image``, ``needs`` with origins, ``missing`` with why, ``declared``);
  ``software_summary`` is ``ale task list --json``'s ``software`` field.
"""
