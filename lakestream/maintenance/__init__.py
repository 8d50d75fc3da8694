"""Table maintenance: policy-driven compaction, delete rewrites, snapshot expiry, orphan and manifest cleanup."""

from lakestream.maintenance.actions import MaintenanceResult
from lakestream.maintenance.runner import InlineMaintenance, maintain_table, maintain_tables, plan_table, watch

__all__ = ["InlineMaintenance", "MaintenanceResult", "maintain_table", "maintain_tables", "plan_table", "watch"]
