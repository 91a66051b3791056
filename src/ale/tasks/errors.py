"""The error every task-loading step raises (the task process raises the same)."""

from ale.tasks.runtime._ale_task_worker.importer import TaskError

__all__ = ["TaskError"]
