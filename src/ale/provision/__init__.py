"""Provisioning a task's software before the seal.

What a task needs (its card's ``software`` list, its variant's ``input/runtime_env/``
manifests, an ``environment`` block in ale's own cards, an operator's overlay) is
resolved here into a ``SoftwareSpec`` (``ale.sandbox.software``), which the sandbox
layer builds into a content-cached image on the trusted side, before any run.
"""
