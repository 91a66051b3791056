"""The steps of the run engine, one module per phase's step (and the preflight, the
directory set-up, the classifier and the cleanup every kind shares). Each step takes
the run's state; ``ale.runs.lifecycle`` is the one driver that sequences them, by
``ale.phases.kind_steps``."""
