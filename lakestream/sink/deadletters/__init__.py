"""Driver side: records that could not be written. `table` is the dead-letter table, committed with the offsets
the batch consumed; `replay` lists dead letters and produces them to their topic again after a fix."""
