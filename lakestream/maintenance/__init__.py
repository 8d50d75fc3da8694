"""Table maintenance: policy-driven compaction, delete rewrites, snapshot expiry, orphan and manifest cleanup."""
from lakestream.maintenance.actions import MaintenanceResult
from lakestream.maintenance.runner import maintain_table, maintain_tables, maybe_maintain, plan_table, watch

__all__ = ["MaintenanceResult", "maintain_table", "maintain_tables", "maybe_maintain", "plan_table", "watch"]
