"""Reports over an experiment: aggregation (numbers) and rendering (JSON, CSV, HTML)."""

from ale.report.aggregate import (
    AgentSummary,
    ItemRow,
    Report,
    RunRow,
    aggregate,
    bootstrap_ci,
    load_report,
    pass_at_k,
    tier_of,
)
from ale.report.render import to_csv, to_html, to_json, write_html

__all__ = [
    "AgentSummary",
    "ItemRow",
    "Report",
    "RunRow",
    "aggregate",
    "bootstrap_ci",
    "load_report",
    "pass_at_k",
    "tier_of",
    "to_csv",
    "to_html",
    "to_json",
    "write_html",
]
