package lakestream.capture;

import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.kafka.connect.data.Schema;
import org.apache.kafka.connect.data.SchemaAndValue;
import org.apache.kafka.connect.json.JsonConverter;
import org.apache.kafka.connect.json.JsonSerializer;
import org.apache.kafka.connect.storage.Converter;

/**
 * Kafka Connect's JsonConverter with schemas, writing the same bytes, without rendering each event's schema.
 *
 * <p>With {@code schemas.enable}, JsonConverter looks the schema's JSON up in a cache keyed by the schema
 * (a deep hash of every field, per event) and serializes it again for every event: about 6× the bytes
 * of the payload. Debezium hands the same {@link Schema} object to every event of a table until the
 * table changes, so the rendered bytes are kept per topic, for that object. The envelope is then the
 * cached bytes around the payload, which a JsonConverter without schemas renders:
 * {@code {"schema":<schema>,"payload":<payload>}} — JsonConverter's own serialization of the envelope.
 */
public final class SchemaCachingJsonConverter implements Converter {
  private static final byte[] HEAD = "{\"schema\":".getBytes(StandardCharsets.UTF_8);
  private static final byte[] MIDDLE = ",\"payload\":".getBytes(StandardCharsets.UTF_8);

  private final JsonConverter withSchemas = new JsonConverter();
  private final JsonConverter payloadOnly = new JsonConverter();
  private final JsonSerializer serializer = new JsonSerializer();  // as JsonConverter's own (no features)
  private final Map<String, Object[]> lastSchema = new ConcurrentHashMap<>();  // topic → {schema, its bytes}

  @Override
  public void configure(Map<String, ?> configs, boolean isKey) {
    Map<String, Object> on = new HashMap<>(configs);
    on.put("schemas.enable", "true");
    withSchemas.configure(on, isKey);
    Map<String, Object> off = new HashMap<>(configs);
    off.put("schemas.enable", "false");
    payloadOnly.configure(off, isKey);
  }

  @Override
  public byte[] fromConnectData(String topic, Schema schema, Object value) {
    if (schema == null || value == null) {
      return withSchemas.fromConnectData(topic, schema, value);
    }
    Object[] cached = lastSchema.get(topic);
    if (cached == null || cached[0] != schema) {
      // the schema's JSON alone, as JsonConverter renders it inside the envelope
      byte[] rendered = serializer.serialize(topic, withSchemas.asJsonSchema(schema));
      cached = new Object[] {schema, rendered};
      if (lastSchema.size() < 10_000) {
        lastSchema.put(topic, cached);
      }
    }
    byte[] schemaBytes = (byte[]) cached[1];
    byte[] payload = payloadOnly.fromConnectData(topic, schema, value);
    byte[] out = new byte[HEAD.length + schemaBytes.length + MIDDLE.length + payload.length + 1];
    int at = 0;
    System.arraycopy(HEAD, 0, out, at, HEAD.length);
    at += HEAD.length;
    System.arraycopy(schemaBytes, 0, out, at, schemaBytes.length);
    at += schemaBytes.length;
    System.arraycopy(MIDDLE, 0, out, at, MIDDLE.length);
    at += MIDDLE.length;
    System.arraycopy(payload, 0, out, at, payload.length);
    out[out.length - 1] = '}';
    return out;
  }

  @Override
  public SchemaAndValue toConnectData(String topic, byte[] value) {
    return withSchemas.toConnectData(topic, value);
  }
}
