package lakestream.capture;

import io.debezium.spi.converter.CustomConverter;
import io.debezium.spi.converter.RelationalColumn;
import java.sql.Timestamp;
import java.time.Instant;
import java.time.LocalDate;
import java.time.LocalDateTime;
import java.time.OffsetDateTime;
import java.time.ZoneOffset;
import java.time.ZonedDateTime;
import java.util.Locale;
import java.util.Properties;
import org.apache.kafka.connect.data.SchemaBuilder;

/**
 * Zero dates in NOT NULL DATE, DATETIME and TIMESTAMP columns of a MariaDB/MySQL source
 * (`capture.database.zero_dates`).
 *
 * <p>The binlog client and the snapshot's JDBC reads hand Debezium a zero date ('0000-00-00', '2024-00-10') as
 * null (a zero TIMESTAMP as the epoch, which a TIMESTAMP cannot otherwise hold); for a column that may not be NULL
 * Debezium then writes the epoch (1970-01-01), which nothing downstream can tell from a real 1970-01-01. This
 * converter takes such columns over: a null value there (the epoch for a TIMESTAMP) can only be a zero date,
 * and it becomes NULL (mode {@code null}) or a sentinel the decoder turns into a dead letter (mode
 * {@code dead_letter}: the field's schema carries {@code lakestream.zero_date=dead_letter}). Every other value is
 * written as Debezium writes it: DATE as io.debezium.time.Date (days), DATETIME as io.debezium.time.MicroTimestamp,
 * TIMESTAMP as io.debezium.time.ZonedTimestamp (ISO-8601 in UTC). Nullable columns keep Debezium's own rule (a zero
 * date is NULL there).
 */
public final class ZeroDateConverter implements CustomConverter<SchemaBuilder, RelationalColumn> {
    public static final int ZERO_DAYS = Integer.MIN_VALUE;
    public static final long ZERO_MICROS = Long.MIN_VALUE;
    public static final String ZERO_TIMESTAMP = "0000-00-00T00:00:00Z";

    private boolean deadLetter;

    @Override
    public void configure(Properties props) {
        String mode = props.getProperty("mode", "null");
        if (!mode.equals("null") && !mode.equals("dead_letter")) {
            throw new IllegalArgumentException("zero date mode " + mode + ": use null or dead_letter");
        }
        deadLetter = mode.equals("dead_letter");
    }

    @Override
    public void converterFor(RelationalColumn column, ConverterRegistration<SchemaBuilder> registration) {
        if (column.isOptional()) {
            return;
        }
        String type = column.typeName().toUpperCase(Locale.ROOT);
        SchemaBuilder schema;
        CustomConverter.Converter convert;
        if (type.equals("DATE")) {
            schema = SchemaBuilder.int32().name("io.debezium.time.Date").version(1);
            convert = v -> v == null ? (deadLetter ? (Object) ZERO_DAYS : null) : (Object) (int) toDate(v).toEpochDay();
        } else if (type.equals("DATETIME")) {
            schema = SchemaBuilder.int64().name("io.debezium.time.MicroTimestamp").version(1);
            convert = v -> v == null ? (deadLetter ? (Object) ZERO_MICROS : null) : (Object) micros(toDateTime(v));
        } else if (type.equals("TIMESTAMP")) {
            schema = SchemaBuilder.string().name("io.debezium.time.ZonedTimestamp").version(1);
            // A TIMESTAMP counts seconds from the epoch and begins at 1970-01-01 00:00:01 UTC: the binlog holds a zero
            // TIMESTAMP as 0, the epoch itself.
            convert = v -> {
                Instant instant = v == null ? Instant.EPOCH : toInstant(v);
                return !instant.equals(Instant.EPOCH) ? instant.toString() : deadLetter ? ZERO_TIMESTAMP : null;
            };
        } else {
            return;
        }
        schema.optional();
        if (deadLetter) {
            schema.parameter("lakestream.zero_date", "dead_letter");
        }
        registration.register(schema, convert);
    }

    private static long micros(LocalDateTime t) {
        return t.toEpochSecond(ZoneOffset.UTC) * 1_000_000L + t.getNano() / 1_000;
    }

    private static LocalDate toDate(Object v) {
        if (v instanceof LocalDate) {
            return (LocalDate) v;
        }
        if (v instanceof java.sql.Date) {
            return ((java.sql.Date) v).toLocalDate();
        }
        if (v instanceof LocalDateTime) {
            return ((LocalDateTime) v).toLocalDate();
        }
        if (v instanceof Number) {
            return LocalDate.ofEpochDay(((Number) v).longValue());
        }
        return LocalDate.parse(v.toString().substring(0, 10));
    }

    private static LocalDateTime toDateTime(Object v) {
        if (v instanceof LocalDateTime) {
            return (LocalDateTime) v;
        }
        if (v instanceof Timestamp) {
            return ((Timestamp) v).toLocalDateTime();
        }
        if (v instanceof LocalDate) {
            return ((LocalDate) v).atStartOfDay();
        }
        return LocalDateTime.parse(v.toString().replace(' ', 'T'));
    }

    private static Instant toInstant(Object v) {
        if (v instanceof ZonedDateTime) {
            return ((ZonedDateTime) v).toInstant();
        }
        if (v instanceof OffsetDateTime) {
            return ((OffsetDateTime) v).toInstant();
        }
        if (v instanceof Instant) {
            return (Instant) v;
        }
        if (v instanceof Timestamp) {
            return ((Timestamp) v).toInstant();
        }
        if (v instanceof LocalDateTime) {
            return ((LocalDateTime) v).toInstant(ZoneOffset.UTC);
        }
        if (v instanceof Number) {
            return Instant.ofEpochMilli(((Number) v).longValue());
        }
        String text = v.toString();
        return text.endsWith("Z") || text.contains("+") ? OffsetDateTime.parse(text).toInstant()
                                                         : LocalDateTime.parse(text.replace(' ', 'T')).toInstant(ZoneOffset.UTC);
    }
}
