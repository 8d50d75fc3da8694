package lakestream.capture;

import io.debezium.engine.ChangeEvent;
import io.debezium.engine.DebeziumEngine;
import java.nio.ByteBuffer;
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
   * length -1 for null (a tombstone's value). Keys and values arrive as bytes (JsonByteArray, Avro) and are
   * copied once, into an array sized up front; a String (the Json format) is encoded as UTF-8.
   */
  static byte[] pack(List<ChangeEvent<Object, Object>> records) {
    Map<String, Integer> topicIndex = new HashMap<>();
    int n = records.size();
    int[] topicOf = new int[n];
    byte[][] keys = new byte[n][];
    byte[][] values = new byte[n][];
    long size = 4;
    for (int i = 0; i < n; i++) {
      ChangeEvent<Object, Object> record = records.get(i);
      String topic = record.destination();
      Integer index = topicIndex.get(topic);
      if (index == null) {
        index = topicIndex.size();
        topicIndex.put(topic, index);
      }
      topicOf[i] = index;
      keys[i] = bytesOf(record.key());
      values[i] = bytesOf(record.value());
      size += 12 + (keys[i] == null ? 0 : keys[i].length) + (values[i] == null ? 0 : values[i].length);
    }
    byte[][] topics = new byte[topicIndex.size()][];
    topicIndex.forEach((topic, index) -> topics[index] = topic.getBytes(StandardCharsets.UTF_8));
    for (byte[] topic : topics) {
      size += 4 + topic.length;
    }
    if (size > Integer.MAX_VALUE - 16) {
      throw new IllegalStateException("a batch of " + n + " change events packs to " + size
          + " bytes, over 2 GiB: lower max.batch.size");
    }
    ByteBuffer out = ByteBuffer.allocate((int) size);  // big-endian
    out.putInt(topics.length);
    for (byte[] topic : topics) {
      putField(out, topic);
    }
    for (int i = 0; i < n; i++) {
      out.putInt(topicOf[i]);
      putField(out, keys[i]);
      putField(out, values[i]);
    }
    return out.array();
  }

  private static byte[] bytesOf(Object value) {
    if (value == null) {
      return null;
    }
    return value instanceof byte[] ? (byte[]) value : value.toString().getBytes(StandardCharsets.UTF_8);
  }

  private static void putField(ByteBuffer out, byte[] bytes) {
    if (bytes == null) {
      out.putInt(-1);
      return;
    }
    out.putInt(bytes.length);
    out.put(bytes);
  }
}
