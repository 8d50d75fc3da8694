import java.math.BigDecimal;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import lakestream.capture.SchemaCachingJsonConverter;
import org.apache.kafka.connect.data.Date;
import org.apache.kafka.connect.data.Decimal;
import org.apache.kafka.connect.data.Schema;
import org.apache.kafka.connect.data.SchemaBuilder;
import org.apache.kafka.connect.data.Struct;
import org.apache.kafka.connect.errors.DataException;
import org.apache.kafka.connect.json.JsonConverter;

/** Compares SchemaCachingJsonConverter with JsonConverter (schemas on) byte for byte; prints OK or fails. */
public final class ConverterCheck {
  public static void main(String[] args) {
    Map<String, String> config = Map.of("schemas.enable", "true", "replace.null.with.default", "false");
    JsonConverter reference = new JsonConverter();
    reference.configure(config, false);
    SchemaCachingJsonConverter converter = new SchemaCachingJsonConverter();
    converter.configure(config, false);

    Schema row = SchemaBuilder.struct().name("p.public.t.Value").optional()
        .field("id", Schema.INT32_SCHEMA)
        .field("name", Schema.OPTIONAL_STRING_SCHEMA)
        .field("note", SchemaBuilder.string().optional().defaultValue("dflt").build())
        .field("amount", Decimal.builder(2).optional().build())
        .field("day", Date.builder().optional().build())
        .field("tags", SchemaBuilder.array(Schema.STRING_SCHEMA).optional().build())
        .field("attrs", SchemaBuilder.map(Schema.STRING_SCHEMA, Schema.OPTIONAL_INT64_SCHEMA).optional().build())
        .field("ratio", Schema.OPTIONAL_FLOAT64_SCHEMA)
        .build();
    Schema envelope = SchemaBuilder.struct().name("p.public.t.Envelope").version(2)
        .field("before", row).field("after", row).field("op", Schema.STRING_SCHEMA)
        .field("ts_ms", Schema.OPTIONAL_INT64_SCHEMA).build();
    Schema wider = SchemaBuilder.struct().name("p.public.t.Envelope").version(2)
        .field("after", row).field("op", Schema.STRING_SCHEMA).field("extra", Schema.OPTIONAL_BOOLEAN_SCHEMA).build();

    int checked = 0;
    for (int i = 0; i < 50; i++) {
      Struct after = new Struct(row).put("id", i).put("name", i % 3 == 0 ? null : "Zoë ☃ \"q\" " + i)
          .put("note", i % 4 == 0 ? null : "n" + i).put("amount", new BigDecimal(i * 7 + ".25"))
          .put("day", new java.util.Date(86_400_000L * i)).put("tags", i % 2 == 0 ? List.of("a", "b" + i) : null)
          .put("attrs", Map.of("k", (long) i)).put("ratio", i % 5 == 0 ? Double.NaN : i / 3.0);
      Struct value = new Struct(envelope).put("after", after).put("op", i % 2 == 0 ? "c" : "u").put("ts_ms", 1000L + i);
      if (i % 7 == 0) {
        value.put("before", after);
      }
      check(reference, converter, "topic.a", envelope, value);
      check(reference, converter, "topic.b", envelope, value);
      // the same topic with another schema (a table changed), then back
      check(reference, converter, "topic.a", wider, new Struct(wider).put("after", after).put("op", "r").put("extra", true));
      checked += 3;
    }
    // keys, nulls and tombstones
    Schema key = SchemaBuilder.struct().name("p.public.t.Key").field("id", Schema.INT32_SCHEMA).build();
    check(reference, converter, "topic.a", key, new Struct(key).put("id", 1));
    check(reference, converter, "topic.a", null, null);
    check(reference, converter, "topic.a", envelope, null);  // refused by both: the envelope is required
    check(reference, converter, "topic.a", Schema.OPTIONAL_STRING_SCHEMA, null);
    check(reference, converter, "topic.a", Schema.OPTIONAL_STRING_SCHEMA, "plain");
    System.out.println("OK " + (checked + 5));
  }

  private static void check(JsonConverter reference, SchemaCachingJsonConverter converter, String topic, Schema schema,
      Object value) {
    byte[] want;
    try {
      want = reference.fromConnectData(topic, schema, value);
    } catch (DataException e) {
      try {
        converter.fromConnectData(topic, schema, value);
      } catch (DataException expected) {
        return;  // refused alike
      }
      throw new AssertionError("JsonConverter refuses " + topic + " (" + e.getMessage() + "), the caching one did not");
    }
    byte[] got = converter.fromConnectData(topic, schema, value);
    if (!Arrays.equals(want, got)) {
      throw new AssertionError("differs for " + topic + ":\n want " + text(want) + "\n got  " + text(got));
    }
  }

  private static String text(byte[] b) {
    return b == null ? "null" : new String(b, StandardCharsets.UTF_8);
  }
}
