package lakestream;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.math.BigDecimal;
import java.math.RoundingMode;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.iceberg.AppendFiles;
import org.apache.iceberg.CachingCatalog;
import org.apache.iceberg.DataFile;
import org.apache.iceberg.DataFiles;
import org.apache.iceberg.DeleteFile;
import org.apache.iceberg.FileContent;
import org.apache.iceberg.FileFormat;
import org.apache.iceberg.FileScanTask;
import org.apache.iceberg.HasTableOperations;
import org.apache.iceberg.ManifestFile;
import org.apache.iceberg.ManifestFiles;
import org.apache.iceberg.ManifestReader;
import org.apache.iceberg.Metrics;
import org.apache.iceberg.MetricsConfig;
import org.apache.iceberg.NullOrder;
import org.apache.iceberg.PartitionData;
import org.apache.iceberg.PartitionSpec;
import org.apache.iceberg.PartitionSpecParser;
import org.apache.iceberg.RewriteFiles;
import org.apache.iceberg.RowDelta;
import org.apache.iceberg.Schema;
import org.apache.iceberg.SchemaParser;
import org.apache.iceberg.Snapshot;
import org.apache.iceberg.SnapshotChanges;
import org.apache.iceberg.SnapshotUpdate;
import org.apache.iceberg.SortOrder;
import org.apache.iceberg.Table;
import org.apache.iceberg.TableProperties;
import org.apache.iceberg.catalog.Catalog;
import org.apache.iceberg.catalog.Namespace;
import org.apache.iceberg.catalog.SupportsNamespaces;
import org.apache.iceberg.catalog.TableIdentifier;
import org.apache.iceberg.data.BaseDeleteLoader;
import org.apache.iceberg.deletes.BaseDVFileWriter;
import org.apache.iceberg.deletes.PositionDeleteIndex;
import org.apache.iceberg.events.CreateSnapshotEvent;
import org.apache.iceberg.events.Listeners;
import org.apache.iceberg.exceptions.AlreadyExistsException;
import org.apache.iceberg.exceptions.NoSuchTableException;
import org.apache.iceberg.exceptions.ValidationException;
import org.apache.iceberg.expressions.Expressions;
import org.apache.iceberg.expressions.Term;
import org.apache.iceberg.io.CloseableIterable;
import org.apache.iceberg.io.DeleteWriteResult;
import org.apache.iceberg.io.OutputFileFactory;
import org.apache.iceberg.spark.SparkSchemaUtil;
import org.apache.iceberg.spark.source.HasIcebergCatalog;
import org.apache.iceberg.types.Type;
import org.apache.iceberg.util.Tasks;
import org.apache.iceberg.util.ThreadPools;
import org.apache.iceberg.types.Types;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.types.StructType;

/**
 * The sink's JVM side, called from Python through py4j (SparkSession + JSON strings in, JSON out):
 * table metadata for the write tasks, table creation in one catalog commit, and the commit of data
 * files written by the tasks plus deletion vectors, with snapshot properties, in one snapshot.
 *
 * <p>Iceberg's own exceptions (ValidationException, CommitFailedException, ...) propagate unchanged:
 * the Python caller classifies them by Java class.
 */
public final class LakestreamSink {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final AtomicLong TASK_IDS = new AtomicLong(System.nanoTime() & 0xFFFFFFL);

  /** Per table: its data files and their live deletes at one snapshot, so commits need no planning. */
  private static final Map<String, FileState> STATES = new ConcurrentHashMap<>();

  /** One lock per table: commits to one table from several threads of this JVM run one at a time. */
  private static final Map<String, Object> LOCKS = new ConcurrentHashMap<>();

  /** The snapshot created by the last commit on this thread (Iceberg notifies listeners in commit()). */
  private static final ThreadLocal<CreateSnapshotEvent> LAST_COMMIT = new ThreadLocal<>();

  private static final Pattern TRANSFORM =
      Pattern.compile("^(\\w+)\\s*\\((?:\\s*(\\d+)\\s*,)?\\s*(`(?:[^`]|``)+`|[^`(),]+?)\\s*\\)$");

  static {
    Listeners.register(LAST_COMMIT::set, CreateSnapshotEvent.class);
  }

  private LakestreamSink() {}

  private static final class FileState {
    String tableUuid;
    Long snapshotId;
    int formatVersion;
    final Map<String, DataFile> dataFiles = new HashMap<>();
    final Map<String, List<DeleteFile>> deletes = new HashMap<>();
  }

  // -- catalog and tables ----------------------------------------------------------------------

  static Catalog catalog(SparkSession spark, String name) {
    Object c = spark.sessionState().catalogManager().catalog(name);
    if (c instanceof HasIcebergCatalog) { // SparkCatalog and SparkSessionCatalog
      return ((HasIcebergCatalog) c).icebergCatalog();
    }
    throw new IllegalArgumentException(
        "catalog " + name + " is not an Iceberg catalog (SparkCatalog/SparkSessionCatalog): " + c.getClass());
  }

  static TableIdentifier identifier(String namespace, String table) {
    return TableIdentifier.of(Namespace.of(namespace.split("\\.")), table);
  }

  /** The table's latest metadata (never a cached copy: other processes commit too). */
  static Table loadFresh(Catalog cat, TableIdentifier ident) {
    Table t = cat.loadTable(ident);
    if (cat instanceof CachingCatalog) {
      t.refresh();
    }
    return t;
  }

  static int formatVersion(Table t) {
    return ((HasTableOperations) t).operations().current().formatVersion();
  }

  public static String tableInfo(SparkSession spark, String catalog, String namespace, String table)
      throws Exception {
    Catalog cat = catalog(spark, catalog);
    try {
      return info(loadFresh(cat, identifier(namespace, table))).toString();
    } catch (NoSuchTableException e) {
      return "{\"exists\": false}";
    }
  }

  static ObjectNode info(Table t) throws Exception {
    ObjectNode out = JSON.createObjectNode();
    out.put("exists", true);
    out.put("location", t.location());
    out.put("uuid", t.uuid().toString());
    String data = t.properties().get(TableProperties.WRITE_DATA_LOCATION);
    out.put("data_location", data != null ? data : t.location() + "/data");
    out.put("format_version", formatVersion(t));
    Snapshot s = t.currentSnapshot();
    if (s == null) {
      out.putNull("snapshot_id");
    } else {
      out.put("snapshot_id", s.snapshotId());
    }
    out.set("schema", JSON.readTree(SchemaParser.toJson(t.schema())));
    out.set("spec", JSON.readTree(PartitionSpecParser.toJson(t.spec())));
    ArrayNode ids = out.putArray("identifier_fields");
    for (String name : t.schema().identifierFieldNames()) {
      ids.add(name);
    }
    ObjectNode props = out.putObject("properties");
    t.properties().forEach(props::put);
    // Storage credentials a REST catalog vended for this table (its FileIO's properties), for the
    // Python writers; the Python side takes them out of the answer at once (never logged).
    Map<String, String> io = t.io().properties();
    if (io.containsKey("s3.access-key-id")) {
      ObjectNode vended = out.putObject("io");
      for (String key : VENDED_KEYS) {
        if (io.get(key) != null) {
          vended.put(key, io.get(key));
        }
      }
    }
    return out;
  }

  private static final String[] VENDED_KEYS = {
    "s3.access-key-id", "s3.secret-access-key", "s3.session-token", "s3.endpoint", "client.region",
    "s3.path-style-access"
  };

  // -- table creation --------------------------------------------------------------------------

  /**
   * Create the table (and its namespace) if missing, in one catalog commit; tolerate a concurrent
   * creator. Returns {@link #tableInfo}.
   */
  public static String createTable(
      SparkSession spark, String catalog, String namespace, String table, String requestJson) throws Exception {
    JsonNode req = JSON.readTree(requestJson);
    Catalog cat = catalog(spark, catalog);
    TableIdentifier ident = identifier(namespace, table);
    try {
      return info(loadFresh(cat, ident)).toString();
    } catch (NoSuchTableException e) {
      // create it below
    }
    Namespace ns = ident.namespace();
    if (cat instanceof SupportsNamespaces && !((SupportsNamespaces) cat).namespaceExists(ns)) {
      try {
        ((SupportsNamespaces) cat).createNamespace(ns);
      } catch (AlreadyExistsException e) {
        // created concurrently
      }
    }
    Schema schema = schema(req);
    PartitionSpec.Builder spec = PartitionSpec.builderFor(schema);
    for (JsonNode p : req.path("partition_by")) {
      addPartition(spec, p.asText().trim());
    }
    SortOrder.Builder order = SortOrder.builderFor(schema);
    boolean sorted = false;
    for (JsonNode s : req.path("sort_by")) {
      addSort(order, s.asText().trim());
      sorted = true;
    }
    Map<String, String> props = new LinkedHashMap<>();
    req.path("properties").fields().forEachRemaining(e -> props.put(e.getKey(), text(e.getValue())));
    try {
      Catalog.TableBuilder builder = cat.buildTable(ident, schema).withPartitionSpec(spec.build()).withProperties(props);
      if (sorted) {
        builder = builder.withSortOrder(order.build());
      }
      return info(builder.create()).toString();
    } catch (AlreadyExistsException e) {
      return info(loadFresh(cat, ident)).toString();
    }
  }

  /**
   * Add a top-level column whose value for existing rows is a default (Iceberg v3 initial-default,
   * also the write-default): PostgreSQL's ADD COLUMN ... DEFAULT gives every existing row that value,
   * and so does the mirror, without rewriting a file. No-op if the column exists. Returns tableInfo.
   * {@code defaultJson} is the value in Iceberg's single-value JSON form for the column's type.
   */
  public static String addColumnWithDefault(SparkSession spark, String catalog, String namespace, String table,
      String column, String sparkDdlType, String defaultJson) throws Exception {
    Catalog cat = catalog(spark, catalog);
    Table t = loadFresh(cat, identifier(namespace, table));
    if (t.schema().caseInsensitiveFindField(column) == null) {
      Type type = SparkSchemaUtil.convert(StructType.fromDDL("`c` " + sparkDdlType)).findField("c").type();
      Object value = org.apache.iceberg.SingleValueParser.fromJson(type, defaultJson);
      org.apache.iceberg.expressions.Literal<?> literal = Expressions.lit(value).to(type);
      if (literal == null) {
        throw new IllegalArgumentException("default " + defaultJson + " does not fit column " + column + " " + type);
      }
      t.updateSchema().addColumn(column, type, null, literal).commit();
    }
    return info(loadFresh(cat, identifier(namespace, table))).toString();
  }

  private static String text(JsonNode v) {
    return v.isTextual() ? v.asText() : v.toString();
  }

  /** Columns as Spark DDL types -> Iceberg schema; `required` and identifier columns are NOT NULL. */
  static Schema schema(JsonNode req) {
    StringBuilder ddl = new StringBuilder();
    Set<String> required = new HashSet<>();
    Map<String, String> comments = new HashMap<>();
    Map<String, String> defaults = new HashMap<>();
    for (JsonNode col : req.get("columns")) {
      String name = col.get("name").asText();
      if (col.hasNonNull("default")) {
        defaults.put(name, col.get("default").toString());
      }
      if (ddl.length() > 0) {
        ddl.append(", ");
      }
      ddl.append('`').append(name.replace("`", "``")).append("` ").append(col.get("type").asText());
      if (col.path("required").asBoolean(false)) {
        required.add(name);
      }
      if (col.hasNonNull("comment")) {
        comments.put(name, col.get("comment").asText());
      }
    }
    for (JsonNode k : req.path("identifier_fields")) {
      required.add(k.asText());
    }
    Schema converted = SparkSchemaUtil.convert(StructType.fromDDL(ddl.toString()));
    List<Types.NestedField> fields = new ArrayList<>();
    for (Types.NestedField f : converted.columns()) {
      boolean optional = f.isOptional() && !required.contains(f.name());
      String doc = comments.getOrDefault(f.name(), f.doc());
      Types.NestedField.Builder field = Types.NestedField.from(f).isOptional(optional).withDoc(doc);
      String dflt = defaults.get(f.name());
      if (dflt != null) {
        // the source's column default: the value our writers give a row whose record predates the column
        field = field.withWriteDefault(
            Expressions.lit(org.apache.iceberg.SingleValueParser.fromJson(f.type(), dflt)).to(f.type()));
      }
      fields.add(field.build());
    }
    Schema plain = new Schema(fields);
    Set<Integer> idFields = new HashSet<>();
    for (JsonNode k : req.path("identifier_fields")) {
      Types.NestedField f = plain.findField(k.asText());
      if (f == null) {
        throw new IllegalArgumentException("identifier field " + k.asText() + " is not a column");
      }
      idFields.add(f.fieldId());
    }
    return new Schema(fields, idFields);
  }

  private static String unquote(String col) {
    col = col.trim();
    if (col.length() >= 2 && col.startsWith("`") && col.endsWith("`")) {
      return col.substring(1, col.length() - 1).replace("``", "`");
    }
    return col;
  }

  private static void addPartition(PartitionSpec.Builder spec, String text) {
    Matcher m = TRANSFORM.matcher(text);
    if (!m.matches()) {
      spec.identity(unquote(text));
      return;
    }
    String col = unquote(m.group(3));
    String arg = m.group(2);
    switch (m.group(1).toLowerCase()) {
      case "years": case "year": spec.year(col); break;
      case "months": case "month": spec.month(col); break;
      case "days": case "day": case "date": spec.day(col); break;
      case "hours": case "hour": case "date_hour": spec.hour(col); break;
      case "bucket": spec.bucket(col, Integer.parseInt(need(arg, text))); break;
      case "truncate": spec.truncate(col, Integer.parseInt(need(arg, text))); break;
      case "identity": spec.identity(col); break;
      default: throw new IllegalArgumentException("unknown partition transform " + text);
    }
  }

  private static String need(String arg, String text) {
    if (arg == null) {
      throw new IllegalArgumentException("transform needs a width/count: " + text);
    }
    return arg;
  }

  /** "col", "col DESC", "bucket(4, id) ASC NULLS LAST", ... (Spark's defaults: ASC nulls first). */
  private static void addSort(SortOrder.Builder order, String text) {
    Matcher m = Pattern.compile("^(.+?)(?:\\s+(ASC|DESC))?(?:\\s+NULLS\\s+(FIRST|LAST))?$", Pattern.CASE_INSENSITIVE)
        .matcher(text);
    if (!m.matches()) {
      throw new IllegalArgumentException("cannot parse sort field " + text);
    }
    boolean desc = "DESC".equalsIgnoreCase(m.group(2));
    NullOrder nulls = m.group(3) == null
        ? (desc ? NullOrder.NULLS_LAST : NullOrder.NULLS_FIRST)
        : ("FIRST".equalsIgnoreCase(m.group(3)) ? NullOrder.NULLS_FIRST : NullOrder.NULLS_LAST);
    Term term = sortTerm(m.group(1).trim());
    if (desc) {
      order.desc(term, nulls);
    } else {
      order.asc(term, nulls);
    }
  }

  private static Term sortTerm(String text) {
    Matcher m = TRANSFORM.matcher(text);
    if (!m.matches()) {
      return Expressions.ref(unquote(text));
    }
    String col = unquote(m.group(3));
    String arg = m.group(2);
    switch (m.group(1).toLowerCase()) {
      case "years": case "year": return Expressions.year(col);
      case "months": case "month": return Expressions.month(col);
      case "days": case "day": return Expressions.day(col);
      case "hours": case "hour": return Expressions.hour(col);
      case "bucket": return Expressions.bucket(col, Integer.parseInt(need(arg, text)));
      case "truncate": return Expressions.truncate(col, Integer.parseInt(need(arg, text)));
      case "identity": return Expressions.ref(col);
      default: throw new IllegalArgumentException("unknown sort transform " + text);
    }
  }

  // -- commits ---------------------------------------------------------------------------------

  /** The table's live data files and deletes at its current snapshot (cached while it stays current). */
  private static FileState state(String key, Table t) throws Exception {
    Snapshot current = t.currentSnapshot();
    Long id = current == null ? null : current.snapshotId();
    String uuid = ((HasTableOperations) t).operations().current().uuid();
    FileState st = STATES.get(key);
    if (st != null && Objects.equals(st.snapshotId, id) && Objects.equals(st.tableUuid, uuid)) {
      return st;
    }
    st = new FileState();
    st.snapshotId = id;
    st.tableUuid = uuid;
    st.formatVersion = formatVersion(t);
    if (current != null) {
      try (CloseableIterable<FileScanTask> tasks = t.newScan().useSnapshot(id).planFiles()) {
        for (FileScanTask task : tasks) {
          String path = task.file().location();
          st.dataFiles.put(path, task.file().copyWithoutStats());
          List<DeleteFile> ds = new ArrayList<>();
          for (DeleteFile d : task.deletes()) {
            if (d.content() == FileContent.POSITION_DELETES) { // equality deletes do not merge into a DV
              ds.add(d.copy()); // keep the bounds: a v2 file-scoped delete is recognised by them
            }
          }
          if (!ds.isEmpty()) {
            st.deletes.put(path, ds);
          }
        }
      }
    }
    STATES.put(key, st);
    return st;
  }

  /**
   * Move the cached file state of {@code key} over {@code committed} when nobody else committed in between,
   * instead of planning the table again: everything out with {@code clear} (a TRUNCATE), the {@code removed}
   * data files and their deletes out, {@code added} in, and each DV of {@code dvs} as its data file's only delete
   * (it holds every earlier position too). Otherwise the cache is dropped.
   */
  private static void advanceState(Table t, String key, Snapshot committed, boolean clear,
      java.util.Collection<String> removed, Map<String, DataFile> added, List<DeleteFile> dvs) {
    FileState cached = STATES.get(key);
    if (cached == null || !Objects.equals(committed.parentId(), cached.snapshotId)) {
      STATES.remove(key);
      return;
    }
    if (clear) {
      cached.dataFiles.clear();
      cached.deletes.clear();
    }
    for (String path : removed) {
      cached.dataFiles.remove(path);
      cached.deletes.remove(path);
    }
    Map<String, DataFile> committedFiles = added;
    if (!added.isEmpty() && formatVersion(t) >= 3) {
      // The files as the new manifests hold them: first_row_id (assigned at commit, v3 row lineage) and the data
      // sequence number are known only there, and a later update of one of their rows keeps that row's id.
      committedFiles = new HashMap<>();
      for (ManifestFile m : committed.dataManifests(t.io())) {
        if (!Objects.equals(m.snapshotId(), committed.snapshotId()) || !m.hasAddedFiles()) {
          continue;
        }
        try (ManifestReader<DataFile> reader = ManifestFiles.read(m, t.io(), t.specs())) {
          for (DataFile df : reader) {
            if (added.containsKey(df.location())) {
              committedFiles.put(df.location(), df.copyWithoutStats());
            }
          }
        } catch (java.io.IOException e) {
          throw new java.io.UncheckedIOException(e);
        }
      }
    }
    for (Map.Entry<String, DataFile> e : added.entrySet()) {
      DataFile df = committedFiles.getOrDefault(e.getKey(), e.getValue());
      cached.dataFiles.put(e.getKey(), df.copyWithoutStats());
    }
    for (DeleteFile dv : dvs) {
      List<DeleteFile> one = new ArrayList<>();
      one.add(dv.copy());
      cached.deletes.put(dv.referencedDataFile(), one);
    }
    cached.snapshotId = committed.snapshotId();
  }

  /** The snapshot a commit made and its parent, as the commit's answer begins. */
  private static ObjectNode committedAnswer(Snapshot committed) {
    ObjectNode out = JSON.createObjectNode();
    out.put("snapshot_id", committed.snapshotId());
    if (committed.parentId() == null) {
      out.putNull("parent_snapshot_id");
    } else {
      out.put("parent_snapshot_id", committed.parentId());
    }
    return out;
  }

  /** A partition value from JSON in Iceberg's internal form for the partition field's result type. */
  private static Object partitionValue(Type type, JsonNode v) {
    if (v == null || v.isNull()) {
      return null;
    }
    switch (type.typeId()) {
      case BOOLEAN: return v.asBoolean();
      case INTEGER: case DATE: return v.asInt();
      case LONG: case TIME: case TIMESTAMP: case TIMESTAMP_NANO: return v.asLong();
      case FLOAT: return (float) v.asDouble();
      case DOUBLE: return v.asDouble();
      case STRING: return v.asText();
      case DECIMAL:
        return new BigDecimal(v.asText()).setScale(((Types.DecimalType) type).scale(), RoundingMode.UNNECESSARY);
      case UUID: return java.util.UUID.fromString(v.asText());
      case BINARY: case FIXED: return ByteBuffer.wrap(Base64.getDecoder().decode(v.asText()));
      default: throw new IllegalArgumentException("unsupported partition value type " + type);
    }
  }

  private static DataFile dataFile(Table t, MetricsConfig metricsConfig, JsonNode f) {
    String path = f.get("path").asText();
    PartitionSpec spec = f.hasNonNull("spec_id") ? t.specs().get(f.get("spec_id").asInt()) : t.spec();
    if (spec == null) {
      throw new IllegalArgumentException("unknown partition spec id " + f.get("spec_id") + " for " + path);
    }
    JsonNode values = f.path("partition");
    List<Types.NestedField> pfields = spec.partitionType().fields();
    if (values.size() != pfields.size()) {
      throw new IllegalArgumentException("data file " + path + " has " + values.size()
          + " partition values; spec " + spec.specId() + " has " + pfields.size() + " fields");
    }
    Metrics metrics = ParquetFooters.metrics(t.io().newInputFile(path), metricsConfig);
    if (f.hasNonNull("record_count") && f.get("record_count").asLong() != metrics.recordCount()) {
      throw new IllegalArgumentException("data file " + path + ": record_count " + f.get("record_count").asLong()
          + " but its footer says " + metrics.recordCount());
    }
    DataFiles.Builder b = DataFiles.builder(spec).withPath(path).withFormat(FileFormat.PARQUET)
        .withFileSizeInBytes(f.get("file_size").asLong()).withMetrics(metrics);
    if (spec.isPartitioned()) {
      PartitionData partition = new PartitionData(spec.partitionType());
      for (int i = 0; i < pfields.size(); i++) {
        partition.set(i, partitionValue(pfields.get(i).type(), values.get(i)));
      }
      b = b.withPartition(partition);
    }
    return b.build();
  }

  /**
   * Commit data files and deletion vectors with snapshot properties in ONE snapshot (a RowDelta).
   * Each data file named by a delete gets one DV holding its earlier deleted positions too; the DV it
   * replaces is removed.
   */
  public static String commitFiles(
      SparkSession spark, String catalog, String namespace, String table, String requestJson) throws Exception {
    JsonNode req = JSON.readTree(requestJson);
    return underTableLock(spark, catalog, namespace, table, req, LakestreamSink::commit);
  }

  /** One commit of a table: its fresh metadata, its key in the caches, the request, the step clock. */
  @FunctionalInterface
  interface TableCommit {
    ObjectNode run(Table t, String key, JsonNode req, Laps clock) throws Exception;
  }

  /**
   * Run {@code body} on the freshly loaded table under the table's lock in this JVM, once no other owner
   * holds the table's commits (`heldByOther`); waits for a hold without the lock (its holder may commit from
   * this JVM).
   */
  static String underTableLock(SparkSession spark, String catalog, String namespace, String table,
      JsonNode req, TableCommit body) throws Exception {
    Catalog cat = catalog(spark, catalog);
    TableIdentifier ident = identifier(namespace, table);
    String key = catalog + "." + ident;
    String owner = req.path("hold_owner").asText("");
    while (true) {
      synchronized (LOCKS.computeIfAbsent(key, k -> new Object())) {
        Laps clock = new Laps();
        Table t = loadFresh(cat, ident);
        clock.lap("load_table");
        if (!heldByOther(t, owner)) {
          return body.run(t, key, req, clock).toString();
        }
      }
      Thread.sleep(200);
    }
  }

  /** {@code body} for 0..n-1 on Iceberg's worker pool (in this thread for one), failing on the first failure. */
  private static void inParallel(int n, java.util.function.IntConsumer body) {
    Tasks.range(n).stopOnFailure().throwFailureWhenFinished()
        .executeWith(n > 1 ? ThreadPools.getWorkerPool() : null)
        .run(body::accept);
  }

  /** The answer to a commit whose caller's view is behind the table: nothing was committed. */
  private static ObjectNode stale(Long current) {
    ObjectNode stale = JSON.createObjectNode();
    stale.put("stale", true);
    if (current == null) {
      stale.putNull("snapshot_id");
    } else {
      stale.put("snapshot_id", current);
    }
    return stale;
  }

  /** Commit {@code update}; the snapshot it made (seen by the commit listener, else the table's current one). */
  private static Snapshot commitAndGet(Table t, SnapshotUpdate<?> update) {
    LAST_COMMIT.remove();
    update.commit();
    CreateSnapshotEvent event = LAST_COMMIT.get();
    LAST_COMMIT.remove();
    Snapshot committed = event != null ? t.snapshot(event.snapshotId()) : null;
    return committed != null ? committed : t.currentSnapshot();
  }

  /** Table property by which one writer (a re-snapshot's final commit) holds back the others' commits. */
  static final String COMMIT_HOLD = "lakestream.commit-hold";

  /**
   * Whether another owner holds the table's commits: a hold ({"owner", "until_ms"}) makes commitFiles
   * wait until it is released or expires (a holder that died is waited out, not forever).
   */
  static boolean heldByOther(Table t, String owner) {
    String hold = t.properties().get(COMMIT_HOLD);
    if (hold == null) {
      return false;
    }
    JsonNode h;
    try {
      h = JSON.readTree(hold);
    } catch (Exception e) {
      return false; // not ours to interpret: never block on it
    }
    return !owner.equals(h.path("owner").asText()) && h.path("until_ms").asLong(0) > System.currentTimeMillis();
  }

  /** Milliseconds spent in each step of a commit, in order (reported with the commit's result). */
  static final class Laps {
    private final Map<String, Long> laps = new LinkedHashMap<>();
    private long last = System.nanoTime();

    void lap(String step) {
      long now = System.nanoTime();
      laps.merge(step, now - last, Long::sum);
      last = now;
    }

    void into(ObjectNode out) {
      ObjectNode ms = out.has("timings_ms") ? (ObjectNode) out.get("timings_ms") : out.putObject("timings_ms");
      laps.forEach((step, nanos) -> ms.put(step, Math.round(nanos / 1e4) / 100.0));
    }
  }

  private static ObjectNode commit(Table t, String key, JsonNode req, Laps clock) throws Exception {
    if (req.has("expect_snapshot_id")) {
      // The caller's view of the table (its key index) describes this snapshot: if another writer
      // committed since, nothing is committed and the caller refreshes its view first.
      Long expected = req.get("expect_snapshot_id").isNull() ? null : req.get("expect_snapshot_id").asLong();
      Long current = t.currentSnapshot() == null ? null : t.currentSnapshot().snapshotId();
      if (!java.util.Objects.equals(expected, current)) {
        return stale(current);
      }
    }
    Map<String, Integer> counts = new LinkedHashMap<>();
    MetricsConfig metricsConfig = MetricsConfig.forTable(t);
    List<JsonNode> requested = new ArrayList<>();
    req.path("data_files").forEach(requested::add);
    DataFile[] built = new DataFile[requested.size()];
    // footers are read in parallel (one small ranged read each; remote object stores benefit most)
    inParallel(built.length, i -> built[i] = dataFile(t, metricsConfig, requested.get(i)));
    Map<String, DataFile> added = new LinkedHashMap<>();
    for (DataFile df : built) {
      if (added.put(df.location(), df) != null) {
        throw new IllegalArgumentException("data file " + df.location() + " listed twice");
      }
    }
    clock.lap("data_file_footers");

    // positions by data file, in request order
    Map<String, List<Long>> positions = new LinkedHashMap<>();
    for (JsonNode d : req.path("deletes")) {
      List<Long> list = positions.computeIfAbsent(d.get("data_file").asText(), p -> new ArrayList<>());
      for (JsonNode pos : d.path("positions")) {
        list.add(pos.asLong());
      }
    }
    positions.values().removeIf(List::isEmpty);

    // Only new rows: an "append" snapshot (incremental readers skip "overwrite" ones by default).
    // With deletes: one RowDelta ("overwrite", or "delete" without new rows).
    boolean truncate = req.path("truncate").asBoolean(false);
    SnapshotUpdate<?> update;
    RowDelta delta = null;
    if (positions.isEmpty() && !truncate) {
      AppendFiles append = t.newAppend();
      added.values().forEach(append::appendFile);
      update = append;
    } else {
      delta = t.newRowDelta();
      added.values().forEach(delta::addRows);
      update = delta;
    }

    FileState st = null;
    List<DeleteFile> newDeletes = new ArrayList<>();
    List<DeleteFile> rewritten = new ArrayList<>();
    Long base = req.hasNonNull("base_snapshot_id") ? req.get("base_snapshot_id").asLong() : null;
    Long validateFrom = base;
    if (truncate) {
      // A source TRUNCATE: every data file live at the base snapshot goes, with its deletes, in the
      // same snapshot as the rows written after it. A file added or removed by anyone else since
      // (a compaction) fails validation, and the caller retries on a fresh view.
      FileState state = state(key, t);
      st = state;
      if (validateFrom == null) {
        validateFrom = state.snapshotId;
      }
      for (DataFile df : state.dataFiles.values()) {
        delta.removeRows(df);
      }
      for (List<DeleteFile> ds : state.deletes.values()) {
        for (DeleteFile d : ds) {
          delta.removeDeletes(d);
        }
      }
      delta.conflictDetectionFilter(Expressions.alwaysTrue());
      delta.validateNoConflictingDataFiles();
      delta.validateNoConflictingDeleteFiles();
      delta.validateDeletedFiles();
    }
    if (!positions.isEmpty()) {
      int formatVersion = formatVersion(t);
      if (formatVersion < 3) {
        throw new IllegalArgumentException("table " + key + " is Iceberg format v" + formatVersion
            + ": deletes are written as deletion vectors, which need format v3; upgrade the table to "
            + "format-version 3 first (`lakestream upgrade-tables`). Appends without deletes work on v2.");
      }
      FileState state = truncate ? new FileState() : state(key, t); // after a truncate no old file is live
      st = state;
      clock.lap("file_state");
      if (validateFrom == null) {
        // The DVs merge the deletes live at this snapshot: DVs added after it must fail the commit,
        // and history before it must not (the DVs replaced here were added there).
        validateFrom = state.snapshotId;
      }
      List<String> referencedExisting = new ArrayList<>();
      Map<String, DataFile> targets = new HashMap<>();
      for (String path : positions.keySet()) {
        DataFile target = added.get(path);
        if (target == null) {
          target = state.dataFiles.get(path);
          if (target == null) {
            throw new ValidationException(
                "Cannot delete rows of data file %s: it is not live in table %s at snapshot %s",
                path, key, state.snapshotId);
          }
          referencedExisting.add(path);
        }
        targets.put(path, target);
      }
      clock.lap("plan_deletes");
      Map<String, PositionDeleteIndex> previous = PreviousDeletes.load(t, state.deletes, referencedExisting);
      clock.lap("load_previous_deletes");
      counts.put("previous_deletes_loaded", previous.size());
      OutputFileFactory files = OutputFileFactory.builderFor(t, 0, TASK_IDS.incrementAndGet())
          .format(FileFormat.PUFFIN).build();
      BaseDVFileWriter writer = new BaseDVFileWriter(files, previous::get);
      try {
        for (Map.Entry<String, List<Long>> e : positions.entrySet()) {
          String path = e.getKey();
          DataFile target = targets.get(path);
          PartitionSpec targetSpec = t.specs().get(target.specId());
          long rows = target.recordCount();
          for (long pos : e.getValue()) {
            if (pos < 0 || pos >= rows) {
              throw new IllegalArgumentException(
                  "position " + pos + " out of range for data file " + path + " (" + rows + " rows)");
            }
            writer.delete(path, pos, targetSpec, target.partition());
          }
        }
      } finally {
        writer.close();
      }
      DeleteWriteResult result = writer.result();
      for (DeleteFile dv : result.deleteFiles()) {
        delta.addDeletes(dv);
        newDeletes.add(dv);
      }
      for (DeleteFile old : result.rewrittenDeleteFiles()) {
        delta.removeDeletes(old);
        rewritten.add(old);
      }
      delta.validateDeletedFiles();
      if (!referencedExisting.isEmpty()) {
        delta.validateDataFilesExist(referencedExisting);
      }
      clock.lap("write_dvs");
    }
    if (validateFrom != null && delta != null) {
      delta.validateFromSnapshot(validateFrom);
    }
    req.path("properties").fields().forEachRemaining(e -> update.set(e.getKey(), text(e.getValue())));

    clock.lap("prepare");
    Snapshot committed = commitAndGet(t, update);
    clock.lap("iceberg_commit");
    advanceState(t, key, committed, truncate, List.of(), added, newDeletes);
    clock.lap("file_state_update");

    ObjectNode out = committedAnswer(committed);
    out.put("sequence_number", committed.sequenceNumber());
    out.put("data_files", added.size());
    FileState now = STATES.get(key);
    if (now != null && Objects.equals(now.snapshotId, committed.snapshotId()) && now.formatVersion >= 3) {
      // Each added file's first_row_id (v3 row lineage): a later update of one of its rows keeps that row's id.
      ObjectNode firstRowIds = out.putObject("first_row_ids");
      for (String path : added.keySet()) {
        DataFile df = now.dataFiles.get(path);
        if (df != null && df.firstRowId() != null) {
          firstRowIds.put(path, df.firstRowId());
        }
      }
    }
    out.put("delete_files", newDeletes.size());
    out.put("removed_delete_files", rewritten.size());
    counts.forEach(out::put);
    clock.into(out);
    return out;
  }

  // -- compaction committed by the pipeline: rows re-mapped, the key index moved ---------------------

  /**
   * The positions deleted, at the table's current snapshot, in each data file of {@code pathsJson} (a JSON
   * array): {"snapshot_id", "files": {path: {"records", "positions": [...], "first_row_id"?,
   * "data_sequence_number"?}}, "missing": [paths not live]} (the last two: the file's row lineage, format v3).
   * A compaction written beside ingestion reads its inputs without these rows, and its commit carries the
   * positions deleted since onto the new files. {@code nice}: the priority of the DV reads (0: the caller's, on
   * Iceberg's worker pool).
   */
  public static String deletedPositions(SparkSession spark, String catalog, String namespace, String table,
      String pathsJson, int nice) throws Exception {
    JsonNode paths = JSON.readTree(pathsJson);
    Catalog cat = catalog(spark, catalog);
    TableIdentifier ident = identifier(namespace, table);
    String key = catalog + "." + ident;
    Table t;
    Long snapshotId;
    Map<String, Long> records = new LinkedHashMap<>(); // live inputs → their row counts
    Map<String, List<DeleteFile>> deletes = new HashMap<>();
    Map<String, Long[]> lineage = new HashMap<>(); // first_row_id, data sequence number (v3 row lineage)
    ObjectNode out = JSON.createObjectNode();
    ArrayNode missing = out.putArray("missing");
    // Under the table's lock only the file state is read (the batches' commits update it); the DVs are read after.
    synchronized (LOCKS.computeIfAbsent(key, k -> new Object())) {
      t = loadFresh(cat, ident);
      FileState st = state(key, t);
      snapshotId = st.snapshotId;
      for (JsonNode p : paths) {
        DataFile f = st.dataFiles.get(p.asText());
        if (f == null) {
          missing.add(p.asText());
          continue;
        }
        records.put(p.asText(), f.recordCount());
        lineage.put(p.asText(), new Long[] {f.firstRowId(), f.dataSequenceNumber()});
        List<DeleteFile> ds = st.deletes.get(p.asText());
        if (ds != null) {
          deletes.put(p.asText(), new ArrayList<>(ds));
        }
      }
    }
    // At nice > 0 (a compaction planned beside the batches) on a thread of its own, one Puffin file after another:
    // not on Iceberg's shared worker pool, which the batches' commits use.
    Map<String, PositionDeleteIndex> deleted = nice > 0
        ? ThreadPriority.call(nice, () -> PreviousDeletes.load(t, deletes, records.keySet(), null))
        : PreviousDeletes.load(t, deletes, records.keySet());
    if (snapshotId == null) {
      out.putNull("snapshot_id");
    } else {
      out.put("snapshot_id", snapshotId);
    }
    ObjectNode files = out.putObject("files");
    records.forEach((path, count) -> {
      ObjectNode f = files.putObject(path);
      f.put("records", count);
      Long[] rowLineage = lineage.get(path);
      if (rowLineage[0] != null) {
        f.put("first_row_id", rowLineage[0]);
      }
      if (rowLineage[1] != null) {
        f.put("data_sequence_number", rowLineage[1]);
      }
      ArrayNode positions = f.putArray("positions");
      PositionDeleteIndex index = deleted.get(path);
      if (index != null) {
        index.forEach(positions::add);
      }
    });
    return out.toString();
  }

  /**
   * Row lineage (format v3) of live data files at snapshot {@code snapshotId}: {"snapshot_id", "lineage": whether
   * the table tracks it, "files": {path: [first_row_id or null, data_sequence_number]}, "missing": [paths not live]};
   * {"stale": true} when the table is no longer at that snapshot. Answered from the file state the commits keep, so
   * the catalog is read only when that state is not at {@code snapshotId}. A row without an explicit {@code _row_id}
   * in its file has id first_row_id + position.
   */
  public static String rowLineage(SparkSession spark, String catalog, String namespace, String table,
      long snapshotId, String pathsJson) throws Exception {
    JsonNode paths = JSON.readTree(pathsJson);
    TableIdentifier ident = identifier(namespace, table);
    String key = catalog + "." + ident;
    ObjectNode out = JSON.createObjectNode();
    synchronized (LOCKS.computeIfAbsent(key, k -> new Object())) {
      FileState st = STATES.get(key);
      if (st == null || !Objects.equals(st.snapshotId, snapshotId) || st.formatVersion == 0) {
        Table t = loadFresh(catalog(spark, catalog), ident);
        st = state(key, t);
        if (!Objects.equals(st.snapshotId, snapshotId)) {
          return stale(st.snapshotId).toString();
        }
      }
      out.put("snapshot_id", snapshotId);
      out.put("lineage", st.formatVersion >= 3);
      ObjectNode files = out.putObject("files");
      ArrayNode missing = out.putArray("missing");
      for (JsonNode p : paths) {
        DataFile f = st.dataFiles.get(p.asText());
        if (f == null) {
          missing.add(p.asText());
          continue;
        }
        ArrayNode pair = files.putArray(p.asText());
        if (f.firstRowId() == null) {
          pair.addNull();
        } else {
          pair.add(f.firstRowId());
        }
        if (f.dataSequenceNumber() == null) {
          pair.addNull();
        } else {
          pair.add(f.dataSequenceNumber());
        }
      }
    }
    return out.toString();
  }

  /**
   * Replace data files by files that hold their live rows, in one `replace` snapshot (a compaction written
   * beside ingestion, committed by the pipeline between its batches). Request: {"expect_snapshot_id",
   * "groups": [{"inputs": [paths], "output": {path, file_size, record_count}, "deletes": [positions of the
   * output]}], "properties"}. Each output takes its inputs' spec and partition (one per group); the inputs'
   * delete files go with them; "deletes" are the rows deleted in the inputs after the rewrite read them,
   * carried onto the output as its deletion vector. {"stale": true} when the table is past expect_snapshot_id.
   */
  public static String commitRewrite(
      SparkSession spark, String catalog, String namespace, String table, String requestJson) throws Exception {
    return underTableLock(spark, catalog, namespace, table, JSON.readTree(requestJson), LakestreamSink::rewrite);
  }

  private static ObjectNode rewrite(Table t, String key, JsonNode req, Laps clock) throws Exception {
    Long expected = req.get("expect_snapshot_id").isNull() ? null : req.get("expect_snapshot_id").asLong();
    Long current = t.currentSnapshot() == null ? null : t.currentSnapshot().snapshotId();
    if (!Objects.equals(expected, current) || current == null) {
      return stale(current);
    }
    FileState st = state(key, t);
    clock.lap("file_state");
    MetricsConfig metricsConfig = MetricsConfig.forTable(t);
    List<JsonNode> groups = new ArrayList<>();
    req.path("groups").forEach(groups::add);
    Metrics[] footers = new Metrics[groups.size()];
    inParallel(footers.length, i -> footers[i] = ParquetFooters.metrics(
        t.io().newInputFile(groups.get(i).get("output").get("path").asText()), metricsConfig));
    clock.lap("output_footers");
    RewriteFiles rw = t.newRewrite();
    rw.validateFromSnapshot(current);
    Map<String, DataFile> outputs = new LinkedHashMap<>();
    Set<String> inputs = new HashSet<>();
    List<DeleteFile> removedDeletes = new ArrayList<>();
    OutputFileFactory files = OutputFileFactory.builderFor(t, 0, TASK_IDS.incrementAndGet())
        .format(FileFormat.PUFFIN).build();
    BaseDVFileWriter writer = new BaseDVFileWriter(files, p -> null);
    try {
      for (int gi = 0; gi < groups.size(); gi++) {
        JsonNode g = groups.get(gi);
        DataFile first = null;
        for (JsonNode in : g.path("inputs")) {
          String path = in.asText();
          DataFile df = st.dataFiles.get(path);
          if (df == null) {
            throw new ValidationException("Cannot rewrite data file %s: it is not live in table %s at snapshot %s",
                path, key, current);
          }
          if (first == null) {
            first = df;
          } else if (df.specId() != first.specId() || !Objects.equals(df.partition(), first.partition())) {
            throw new IllegalArgumentException("rewrite group mixes partitions: " + path + " and " + first.location());
          }
          if (!inputs.add(path)) {
            throw new IllegalArgumentException("data file " + path + " is in two rewrite groups");
          }
          rw.deleteFile(df);
          for (DeleteFile d : st.deletes.getOrDefault(path, List.of())) {
            rw.deleteFile(d);
            removedDeletes.add(d);
          }
        }
        if (first == null) {
          throw new IllegalArgumentException("rewrite group without inputs");
        }
        JsonNode o = g.get("output");
        String path = o.get("path").asText();
        PartitionSpec spec = t.specs().get(first.specId());
        Metrics metrics = footers[gi];
        if (o.get("record_count").asLong() != metrics.recordCount()) {
          throw new IllegalArgumentException("data file " + path + ": record_count " + o.get("record_count").asLong()
              + " but its footer says " + metrics.recordCount());
        }
        DataFiles.Builder b = DataFiles.builder(spec).withPath(path).withFormat(FileFormat.PARQUET)
            .withFileSizeInBytes(o.get("file_size").asLong()).withMetrics(metrics);
        if (spec.isPartitioned()) {
          b = b.withPartition(first.partition());
        }
        DataFile out = b.build();
        rw.addFile(out);
        outputs.put(path, out);
        for (JsonNode pos : g.path("deletes")) {
          long p = pos.asLong();
          if (p < 0 || p >= out.recordCount()) {
            throw new IllegalArgumentException("position " + p + " out of range for data file " + path);
          }
          writer.delete(path, p, spec, out.partition());
        }
      }
    } finally {
      writer.close();
    }
    clock.lap("prepare");
    List<DeleteFile> newDeletes = new ArrayList<>(writer.result().deleteFiles());
    newDeletes.forEach(rw::addFile);
    req.path("properties").fields().forEachRemaining(e -> rw.set(e.getKey(), text(e.getValue())));
    Snapshot committed = commitAndGet(t, rw);
    clock.lap("iceberg_commit");
    advanceState(t, key, committed, false, inputs, outputs, newDeletes);
    ObjectNode out = committedAnswer(committed);
    out.put("removed_data_files", inputs.size());
    out.put("added_data_files", outputs.size());
    out.put("removed_delete_files", removedDeletes.size());
    out.put("delete_files", newDeletes.size());
    clock.into(out);
    return out;
  }

  // -- what snapshots changed (the key index refreshes by diff) -----------------------------------

  /**
   * The snapshots committed after {@code fromSnapshotId}, oldest first, each with the data files it added
   * ({path, records}) and removed (paths), and per data file with deletes added by it the row positions it newly
   * deleted ({data_file, positions_le64}): a deletion vector that replaces an earlier one of the same data file in
   * the same snapshot (v3 keeps one per file, so every upsert of a file's row rewrites its whole vector) reports only
   * the positions the earlier one did not hold. Positions go as base64 of little-endian longs: tens of millions of
   * JSON numbers would not fit a default driver's heap. Past {@code maxPositions} positions in all, no more are listed
   * and "positions_over" is true: the caller builds the index again instead. {"ancestor": false} when
   * {@code fromSnapshotId} is not an ancestor of the current snapshot (rolled back, expired, another table);
   * "unsupported": true when a snapshot added equality deletes or position delete files that name no single data
   * file.
   */
  public static String snapshotChanges(SparkSession spark, String catalog, String namespace, String table,
      long fromSnapshotId, long maxPositions) throws Exception {
    Table t = loadFresh(catalog(spark, catalog), identifier(namespace, table));
    ObjectNode out = JSON.createObjectNode();
    Snapshot current = t.currentSnapshot();
    if (current == null) {
      out.putNull("current");
    } else {
      out.put("current", current.snapshotId());
    }
    List<Snapshot> chain = new ArrayList<>();
    boolean found = false;
    for (Snapshot s = current; s != null; s = s.parentId() == null ? null : t.snapshot(s.parentId())) {
      if (s.snapshotId() == fromSnapshotId) {
        found = true;
        break;
      }
      chain.add(s);
    }
    out.put("ancestor", found);
    if (!found) {
      return out.toString();
    }
    java.util.Collections.reverse(chain);
    BaseDeleteLoader loader = new BaseDeleteLoader(d -> t.io().newInputFile(d.location()));
    ArrayNode snapshots = out.putArray("snapshots");
    boolean unsupported = false;
    long listed = 0;
    for (Snapshot s : chain) {
      ObjectNode n = snapshots.addObject();
      n.put("snapshot_id", s.snapshotId());
      n.put("operation", s.operation());
      // Lakestream's own compaction moves rows and changes none: the index follows it from its new files alone.
      n.put("compaction", "true".equals(s.summary() == null ? null : s.summary().get("lakestream.compaction")));
      // SnapshotChanges reads the manifests with the table's specs (Snapshot.addedDataFiles(io) reads each
      // manifest's spec from its own metadata, deprecated since Iceberg 1.11).
      SnapshotChanges changes = SnapshotChanges.builderFor(t).snapshot(s).build();
      ArrayNode added = n.putArray("added");
      for (DataFile f : changes.addedDataFiles()) {
        ObjectNode a = added.addObject();
        a.put("path", f.location());
        a.put("records", f.recordCount());
      }
      ArrayNode removed = n.putArray("removed");
      long removedRecords = 0;
      for (DataFile f : changes.removedDataFiles()) {
        removed.add(f.location());
        removedRecords += f.recordCount();
      }
      n.put("removed_records", removedRecords);
      Map<String, List<DeleteFile>> byFile = new LinkedHashMap<>();
      for (DeleteFile d : changes.addedDeleteFiles()) {
        if (d.content() != FileContent.POSITION_DELETES || d.referencedDataFile() == null) {
          unsupported = true;
          continue;
        }
        byFile.computeIfAbsent(d.referencedDataFile(), k -> new ArrayList<>()).add(d.copy());
      }
      Map<String, List<DeleteFile>> replaced = new HashMap<>();
      for (DeleteFile d : changes.removedDeleteFiles()) {
        if (d.content() == FileContent.POSITION_DELETES && d.referencedDataFile() != null
            && byFile.containsKey(d.referencedDataFile())) {
          replaced.computeIfAbsent(d.referencedDataFile(), k -> new ArrayList<>()).add(d.copy());
        }
      }
      ArrayNode deleted = n.putArray("deleted");
      for (Map.Entry<String, List<DeleteFile>> e : byFile.entrySet()) {
        if (listed > maxPositions) {
          break;
        }
        PositionDeleteIndex now = loader.loadPositionDeletes(e.getValue(), e.getKey());
        List<DeleteFile> before = replaced.get(e.getKey());
        PositionDeleteIndex earlier = before == null ? null : loader.loadPositionDeletes(before, e.getKey());
        ByteBuffer fresh = ByteBuffer.allocate((int) Math.min(Integer.MAX_VALUE - 8, 8L * now.cardinality()))
            .order(java.nio.ByteOrder.LITTLE_ENDIAN);
        now.forEach(pos -> {
          if (earlier == null || !earlier.isDeleted(pos)) {
            fresh.putLong(pos);
          }
        });
        listed += fresh.position() / 8;
        ObjectNode d = deleted.addObject();
        d.put("data_file", e.getKey());
        d.put("positions_le64", Base64.getEncoder().encodeToString(
            java.util.Arrays.copyOf(fresh.array(), fresh.position())));
      }
      if (listed > maxPositions) {
        out.put("positions_over", true);
        break;
      }
    }
    out.put("positions_listed", listed);
    out.put("unsupported", unsupported);
    return out.toString();
  }
}
