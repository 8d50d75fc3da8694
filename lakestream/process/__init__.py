"""Stream processing over the typed changes of a batch: transforms (with reference tables for enrichment),
derived tables kept current by key, rules, windows."""
