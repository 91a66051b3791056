"""The error every task-loading step raises."""


class TaskError(ValueError):
    """A task folder is malformed: the message names the file and what is wrong."""
