"""Driver side: a batch's facts into one Iceberg snapshot per table. `tables` resolves the changes of every task
(the latest per key wins; the previous rows found through the index become deletion vectors) and commits them
with the table's offsets (`offsets`); `keyless` is the same for tables without a primary key; `rewrites` commits
compactions written beside the batches; `lineage` keeps a replaced row's `_row_id`."""
