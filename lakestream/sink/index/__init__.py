"""Driver side (the key encoding in `keys` is shared with the executors): the table indexes that turn an upsert
or a delete into a deletion vector on the row's current position.

- `contract`: the `TableIndex` Protocol every index implements, and their shared parts;
- `disk`: `DiskKeyIndex`, the index of keyed tables (sorted bucket files, memory-mapped, under an overlay);
- `memory`: `KeyIndex`, a key → location map in memory (the building block of `keyless`, a re-snapshot's mirror);
- `keyless`: `KeylessIndex`, the multiset index of tables without a primary key;
- `store`: the keyed index made durable beside the table with every commit;
- `scan`, `diff`, `refresh`: the rebuild scan, the refresh by diff, and the one refresh policy with its cap.
"""
