"""The task process: a task folder's code in its own interpreter (standard library only).

``serve.py`` is its entry point, ``protocol.py`` the messages it exchanges with the
harness, ``importer.py`` how it imports the task. Nothing here imports the harness.
"""
