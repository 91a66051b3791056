"""The run record: evidence, signing, the run folder layout, and `ale verify`."""
