package lakestream.capture;

import io.debezium.engine.ChangeEvent;
import io.debezium.engine.DebeziumEngine;
import java.io.ByteArrayOutputStream;
import java.io.DataOutputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * Hands Debezium's batches to Python in one call each, instead of one JPype call per record and field.
 *
 * <p>The batch is packed into one byte array (layout in {@link #pack}); Python produces it to Kafka and
 * returns only once Kafka acknowledged every record. Offsets are marked processed after that, so capture
 * stays at-least-once. An exception from Python propagates: the batch is not marked and the engine stops.
 */
public final class CaptureBatchConsumer implements DebeziumEngine.ChangeConsumer<ChangeEvent<Object, Object>> {

  /** Implemented in Python (a JPype proxy). */
  public interface Publisher {
    void publish(byte[] packed, int records) throws Exception;
  }

  private final Publisher publisher;

  public CaptureBatchConsumer(Publisher publisher) {
    this.publisher = publisher;
  }

  @Override
  public void handleBatch(
      List<ChangeEvent<Object, Object>> records, DebeziumEngine.RecordCommitter<ChangeEvent<Object, Object>> committer)
      throws InterruptedException {
    if (records.isEmpty()) {
      committer.markBatchFinished();
      return;
    }
    byte[] packed = pack(records);
    try {
      publisher.publish(packed, records.size());
    } catch (RuntimeException e) {
      throw e;
    } catch (Exception e) {
      throw new IllegalStateException("publishing a batch of change events failed: " + e.getMessage(), e);
    }
    for (ChangeEvent<Object, Object> record : records) {
      committer.markProcessed(record);
    }
    committer.markBatchFinished();
  }

  @Override
  public boolean supportsTombstoneEvents() {
    return true;
  }

  /**
   * Layout, all integers big-endian int32: the number of distinct topics, then each topic as length +
   * UTF-8 bytes; then per record its topic's index, the key and the value, each as length + bytes, with
   * length -1 for null (a tombstone's value). String keys and values (JSON) are UTF-8; byte[] (Avro) as is.
   */
  static byte[] pack(List<ChangeEvent<Object, Object>> records) {
    Map<String, Integer> topicIndex = new HashMap<>();
    int[] topicOf = new int[records.size()];
    for (int i = 0; i < records.size(); i++) {
      String topic = records.get(i).destination();
      Integer index = topicIndex.get(topic);
      if (index == null) {
        index = topicIndex.size();
        topicIndex.put(topic, index);
      }
      topicOf[i] = index;
    }
    String[] topics = new String[topicIndex.size()];
    topicIndex.forEach((topic, index) -> topics[index] = topic);
    ByteArrayOutputStream buffer = new ByteArrayOutputStream(records.size() * 512);
    DataOutputStream out = new DataOutputStream(buffer);
    try {
      out.writeInt(topics.length);
      for (String topic : topics) {
        writeField(out, topic);
      }
      for (int i = 0; i < records.size(); i++) {
        ChangeEvent<Object, Object> record = records.get(i);
        out.writeInt(topicOf[i]);
        writeField(out, record.key());
        writeField(out, record.value());
      }
    } catch (IOException e) {
      throw new IllegalStateException(e);  // a ByteArrayOutputStream does not throw
    }
    return buffer.toByteArray();
  }

  private static void writeField(DataOutputStream out, Object value) throws IOException {
    if (value == null) {
      out.writeInt(-1);
      return;
    }
    byte[] bytes = value instanceof byte[] ? (byte[]) value : value.toString().getBytes(StandardCharsets.UTF_8);
    out.writeInt(bytes.length);
    out.write(bytes);
  }
}
