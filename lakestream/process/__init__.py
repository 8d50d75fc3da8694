"""Stream processing over the typed changes of a batch: transforms, rules, windows."""
