"""ale: run AI agents on benchmark tasks in sandboxes that are proven sealed."""

__version__ = "0.1.0"
