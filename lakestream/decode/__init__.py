"""Decoding Kafka records into typed changes: Debezium envelopes (JSON or Avro) and plain JSON events. Executor side,
inside the write task; fresh reads (`lakestream.read.fresh`) run the same decoder on the driver.

- `records`: one raw record into a routed change (`RecordDecoder`), or a `DecodeError` with the reason.
- `vectorized`: a run of one topic's Debezium records straight into the table's Arrow schema, with `native` (a Rust
  parser of schemas-on payloads, `payloads_rs/`) where it is built.
- `envelope`: the Debezium envelope and plain events; `avro`: Confluent's wire format and its Schema Registry;
  `types`: Kafka Connect field schemas as column types, and values in their typed form; `columns`: one Arrow column
  from typed values, strictly (the write task's conversion builds its columns here too).
"""
