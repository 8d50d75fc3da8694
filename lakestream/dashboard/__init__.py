"""A live web dashboard over a pipeline's health, batch metrics and maintenance (`lakestream dashboard`)."""

from lakestream.dashboard.state import BatchLog, build_dashboard, collect_dashboard

__all__ = ["BatchLog", "build_dashboard", "collect_dashboard"]
