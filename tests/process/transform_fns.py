"""Python transforms used by the tests (shipped to the executors with SparkContext.addPyFile)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc


def flag_round_amounts(batch: pa.Table) -> pa.Table:
    """Rows whose amount is a multiple of 10, with a flag; an amount of 13 is refused (raises)."""
    amounts = batch.column("amount")
    if pc.any(pc.equal(amounts, 13)).as_py():
        raise ValueError("unlucky amount 13")
    keep = pc.equal(pc.cast(amounts, pa.int64()), pc.multiply(pc.divide(pc.cast(amounts, pa.int64()), 10), 10))
    out = batch.filter(keep).select(["id", "amount", "_kafka_offset"])
    return out.append_column("round", pa.array([True] * out.num_rows, pa.bool_()))
