"""Per-stream transforms: SQL (DuckDB) or a Python callable over a table's typed changes, Arrow in and Arrow out.

- `apply` (executors, inside the write task): a transform (`Derived`) run over one input table's changes, its output
  fitted to its own table's schema, a failing transform re-run on halves until the failing rows are alone.
- `reference` (both sides): reference tables a SQL transform joins; the driver reads them and ships them to the tasks
  as a broadcast (`ReferenceCache`, `ReferenceData`), the tasks register them as DuckDB views.

The driver-side stages that run between the write job and the commits (alerts, windows, derived tables) live in
`lakestream.process`.
"""
