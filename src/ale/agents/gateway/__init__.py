"""The model gateway (``server``), its tool policy (``tools``), its record
(``record``), usage and cost (``usage``) and the harness's confinement
(``confine``, ``netns_relay``). See docs/agents.md, "The model gateway"."""
