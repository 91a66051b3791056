"""A task that asks nothing and grades nothing: measures the harness's own cost."""

import cua_bench as cb


@cb.tasks_config
def load():
    return [cb.Task(description="Do nothing.", task_id="noop", metadata={})]


@cb.evaluate_task
async def evaluate(cfg, session):
    return [0.0]
