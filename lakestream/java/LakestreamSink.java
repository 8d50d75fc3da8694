package lakestream;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.math.BigDecimal;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.iceberg.DataFile;
import org.apache.iceberg.DataFiles;
import org.apache.iceberg.DeleteFile;
import org.apache.iceberg.FileContent;
import org.apache.iceberg.FileFormat;
import org.apache.iceberg.FileScanTask;
import org.apache.iceberg.Metrics;
import org.apache.iceberg.MetricsConfig;
import org.apache.iceberg.PartitionData;
import org.apache.iceberg.PartitionSpec;
import org.apache.iceberg.PartitionSpecParser;
import org.apache.iceberg.RowDelta;
import org.apache.iceberg.Schema;
import org.apache.iceberg.SchemaParser;
import org.apache.iceberg.Snapshot;
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
import org.apache.iceberg.exceptions.AlreadyExistsException;
import org.apache.iceberg.io.CloseableIterable;
import org.apache.iceberg.io.DeleteWriteResult;
import org.apache.iceberg.io.OutputFileFactory;
import org.apache.iceberg.parquet.ParquetUtil;
import org.apache.iceberg.spark.SparkCatalog;
import org.apache.iceberg.spark.SparkSchemaUtil;
import org.apache.iceberg.types.Type;
import org.apache.iceberg.types.Types;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.types.StructType;

/**
 * The sink's JVM side: table metadata for the write tasks, fast table creation, and the commit of
 * data files written by the tasks plus deletion vectors, with the Kafka offsets, in one snapshot.
 */
public final class LakestreamSink {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final AtomicLong TASK_IDS = new AtomicLong(System.nanoTime() & 0xFFFFFFL);
  /** Per table: the data files and their deletes at one snapshot, so a commit needs no scan planning. */
  private static final Map<String, FileState> STATES = new ConcurrentHashMap<>();

  private LakestreamSink() {}

  private static final class FileState {
    Long snapshotId;
    final Map<String, DataFile> dataFiles = new HashMap<>();
    final Map<String, List<DeleteFile>> deletes = new HashMap<>();
  }

  static Catalog catalog(SparkSession spark, String name) {
    Object c = spark.sessionState().catalogManager().catalog(name);
    if (c instanceof SparkCatalog) {
      return ((SparkCatalog) c).icebergCatalog();
    }
    throw new IllegalArgumentException("catalog " + name + " is not an Iceberg SparkCatalog: " + c.getClass());
  }

  static Table load(SparkSession spark, String catalog, String namespace, String table) {
    return catalog(spark, catalog).loadTable(TableIdentifier.of(Namespace.of(namespace), table));
  }

  public static String tableInfo(SparkSession spark, String catalog, String namespace, String table)
      throws Exception {
    Catalog cat = catalog(spark, catalog);
    TableIdentifier ident = TableIdentifier.of(Namespace.of(namespace), table);
    if (!cat.tableExists(ident)) {
      return "{\"exists\": false}";
    }
    return info(cat.loadTable(ident)).toString();
  }

  static ObjectNode info(Table t) throws Exception {
    ObjectNode out = JSON.createObjectNode();
    out.put("exists", true);
    out.put("location", t.location());
    String data = t.properties().get(TableProperties.WRITE_DATA_LOCATION);
    out.put("data_location", data != null ? data : t.location() + "/data");
    out.put("format_version", ((org.apache.iceberg.HasTableOperations) t).operations().current().formatVersion());
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
    return out;
  }

  public static String createTable(
      SparkSession spark, String catalog, String namespace, String table, String requestJson) throws Exception {
    JsonNode req = JSON.readTree(requestJson);
    Catalog cat = catalog(spark, catalog);
    Namespace ns = Namespace.of(namespace);
    if (cat instanceof SupportsNamespaces && !((SupportsNamespaces) cat).namespaceExists(ns)) {
      try {
        ((SupportsNamespaces) cat).createNamespace(ns);
      } catch (AlreadyExistsException e) {
        // created concurrently
      }
    }
    TableIdentifier ident = TableIdentifier.of(ns, table);
    if (cat.tableExists(ident)) {
      return info(cat.loadTable(ident)).toString();
    }
    StringBuilder ddl = new StringBuilder();
    for (JsonNode col : req.get("columns")) {
      if (ddl.length() > 0) {
        ddl.append(", ");
      }
      ddl.append('`').append(col.get("name").asText().replace("`", "``")).append("` ").append(col.get("type").asText());
    }
    StructType struct = StructType.fromDDL(ddl.toString());
    Schema converted = SparkSchemaUtil.convert(struct);
    java.util.Set<String> required = new java.util.HashSet<>();
    for (JsonNode col : req.get("columns")) {
      if (col.path("required").asBoolean(false)) {
        required.add(col.get("name").asText());
      }
    }
    List<Types.NestedField> fields = new ArrayList<>();
    for (Types.NestedField f : converted.columns()) {
      fields.add(required.contains(f.name()) ? f.asRequired() : f);
    }
    java.util.Set<Integer> idFields = new java.util.HashSet<>();
    Schema plain = new Schema(fields);
    for (JsonNode k : req.path("identifier_fields")) {
      idFields.add(plain.findField(k.asText()).fieldId());
    }
    Schema schema = new Schema(fields, idFields);
    PartitionSpec.Builder spec = PartitionSpec.builderFor(schema);
    for (JsonNode p : req.path("partition_by")) {
      addPartition(spec, p.asText().trim());
    }
    SortOrder.Builder order = SortOrder.builderFor(schema);
    boolean sorted = false;
    for (JsonNode s : req.path("sort_by")) {
      String[] parts = s.asText().trim().split("\\s+");
      if (parts.length == 2 && parts[1].equalsIgnoreCase("DESC")) {
        order.desc(parts[0]);
      } else {
        order.asc(parts[0]);
      }
      sorted = true;
    }
    Map<String, String> props = new HashMap<>();
    req.path("properties").fields().forEachRemaining(e -> props.put(e.getKey(), e.getValue().asText()));
    try {
      Catalog.TableBuilder builder = cat.buildTable(ident, schema).withPartitionSpec(spec.build()).withProperties(props);
      if (sorted) {
        builder = builder.withSortOrder(order.build());
      }
      return info(builder.create()).toString();
    } catch (AlreadyExistsException e) {
      return info(cat.loadTable(ident)).toString();
    }
  }

  private static void addPartition(PartitionSpec.Builder spec, String text) {
    java.util.regex.Matcher m =
        java.util.regex.Pattern.compile("^(\\w+)\\((?:\\s*(\\d+)\\s*,)?\\s*`?([^`()]+?)`?\\s*\\)$").matcher(text);
    if (!m.matches()) {
      spec.identity(text.replace("`", ""));
      return;
    }
    String fn = m.group(1).toLowerCase();
    String col = m.group(3).trim();
    switch (fn) {
      case "years": case "year": spec.year(col); break;
      case "months": case "month": spec.month(col); break;
      case "days": case "day": spec.day(col); break;
      case "hours": case "hour": spec.hour(col); break;
      case "bucket": spec.bucket(col, Integer.parseInt(m.group(2))); break;
      case "truncate": spec.truncate(col, Integer.parseInt(m.group(2))); break;
      case "identity": spec.identity(col); break;
      default: throw new IllegalArgumentException("unknown partition transform " + text);
    }
  }

  private static synchronized FileState state(String key, Table t) throws Exception {
    Snapshot current = t.currentSnapshot();
    Long id = current == null ? null : current.snapshotId();
    FileState st = STATES.get(key);
    if (st != null && java.util.Objects.equals(st.snapshotId, id)) {
      return st;
    }
    st = new FileState();
    st.snapshotId = id;
    if (current != null) {
      try (CloseableIterable<FileScanTask> tasks = t.newScan().useSnapshot(id).planFiles()) {
        for (FileScanTask task : tasks) {
          String path = task.file().location();
          st.dataFiles.put(path, task.file().copyWithoutStats());
          if (!task.deletes().isEmpty()) {
            List<DeleteFile> ds = new ArrayList<>();
            for (DeleteFile d : task.deletes()) {
              ds.add(d.copyWithoutStats());
            }
            st.deletes.put(path, ds);
          }
        }
      }
    }
    STATES.put(key, st);
    return st;
  }

  private static Object partitionValue(Type type, JsonNode v) {
    if (v == null || v.isNull()) {
      return null;
    }
    switch (type.typeId()) {
      case BOOLEAN: return v.asBoolean();
      case INTEGER: case DATE: return v.asInt();
      case LONG: case TIMESTAMP: case TIMESTAMP_NANO: case TIME: return v.asLong();
      case FLOAT: return (float) v.asDouble();
      case DOUBLE: return v.asDouble();
      case STRING: return v.asText();
      case DECIMAL: return new BigDecimal(v.asText());
      default: throw new IllegalArgumentException("unsupported partition value type " + type);
    }
  }

  public static String commitFiles(
      SparkSession spark, String catalog, String namespace, String table, String requestJson) throws Exception {
    JsonNode req = JSON.readTree(requestJson);
    Table t = load(spark, catalog, namespace, table);
    String key = catalog + "." + namespace + "." + table;
    int formatVersion = ((org.apache.iceberg.HasTableOperations) t).operations().current().formatVersion();
    PartitionSpec spec = t.spec();
    MetricsConfig metricsConfig = MetricsConfig.forTable(t);
    RowDelta delta = t.newRowDelta();
    Map<String, DataFile> added = new HashMap<>();
    int dataCount = 0;
    for (JsonNode f : req.path("data_files")) {
      String path = f.get("path").asText();
      PartitionData partition = new PartitionData(spec.partitionType());
      JsonNode values = f.path("partition");
      List<Types.NestedField> pfields = spec.partitionType().fields();
      for (int i = 0; i < pfields.size(); i++) {
        partition.set(i, partitionValue(pfields.get(i).type(), values.get(i)));
      }
      Metrics metrics = ParquetUtil.fileMetrics(t.io().newInputFile(path), metricsConfig);
      DataFiles.Builder b = DataFiles.builder(spec).withPath(path).withFormat(FileFormat.PARQUET)
          .withFileSizeInBytes(f.get("file_size").asLong()).withMetrics(metrics);
      if (spec.isPartitioned()) {
        b = b.withPartition(partition);
      }
      DataFile df = b.build();
      added.put(path, df);
      delta.addRows(df);
      dataCount++;
    }
    int deleteCount = 0;
    int removed = 0;
    List<DeleteFile> newDeletes = new ArrayList<>();
    Long base = req.hasNonNull("base_snapshot_id") ? req.get("base_snapshot_id").asLong() : null;
    if (req.path("deletes").size() > 0) {
      if (formatVersion < 3) {
        throw new IllegalArgumentException("table " + key + " is format v" + formatVersion
            + ": deletion vectors need format v3 (run `lakestream upgrade-tables`)");
      }
      FileState st = state(key, t);
      BaseDeleteLoader loader = new BaseDeleteLoader(d -> t.io().newInputFile(d.location()));
      OutputFileFactory files = OutputFileFactory.builderFor(t, 0, TASK_IDS.incrementAndGet())
          .format(FileFormat.PUFFIN).build();
      BaseDVFileWriter writer = new BaseDVFileWriter(files, path -> {
        List<DeleteFile> previous = st.deletes.get(path);
        return previous == null || previous.isEmpty() ? null : loader.loadPositionDeletes(previous, path);
      });
      List<String> referencedExisting = new ArrayList<>();
      try {
        for (JsonNode d : req.get("deletes")) {
          String path = d.get("data_file").asText();
          DataFile target = added.get(path);
          if (target == null) {
            target = st.dataFiles.get(path);
            if (target == null) {
              throw new org.apache.iceberg.exceptions.ValidationException(
                  "data file %s is not live in table %s at snapshot %s", path, key, st.snapshotId);
            }
            referencedExisting.add(path);
          }
          PartitionSpec targetSpec = t.specs().get(target.specId());
          for (JsonNode pos : d.get("positions")) {
            writer.delete(path, pos.asLong(), targetSpec, target.partition());
          }
        }
      } finally {
        writer.close();
      }
      DeleteWriteResult result = writer.result();
      for (DeleteFile dv : result.deleteFiles()) {
        delta.addDeletes(dv);
        newDeletes.add(dv);
        deleteCount++;
      }
      for (DeleteFile old : result.rewrittenDeleteFiles()) {
        delta.removeDeletes(old);
        removed++;
      }
      if (!referencedExisting.isEmpty()) {
        delta.validateDataFilesExist(referencedExisting);
        delta.validateDeletedFiles();
      }
    }
    if (base != null) {
      delta.validateFromSnapshot(base);
      delta.validateNoConflictingDeleteFiles();
    }
    req.path("properties").fields().forEachRemaining(e -> delta.set(e.getKey(), e.getValue().asText()));
    delta.commit();
    Snapshot committed = t.currentSnapshot();
    synchronized (LakestreamSink.class) {
      FileState st = STATES.get(key);
      if (st != null && java.util.Objects.equals(committed.parentId(), st.snapshotId)) {
        // Nobody else committed in between: move the cached file state forward instead of re-planning.
        for (Map.Entry<String, DataFile> e : added.entrySet()) {
          st.dataFiles.put(e.getKey(), e.getValue().copyWithoutStats());
        }
        for (DeleteFile dv : newDeletes) {
          List<DeleteFile> one = new ArrayList<>();
          one.add(dv.copyWithoutStats());
          st.deletes.put(dv.referencedDataFile(), one);  // the vector holds every earlier position too
        }
        st.snapshotId = committed.snapshotId();
      } else {
        STATES.remove(key);
      }
    }
    ObjectNode out = JSON.createObjectNode();
    out.put("snapshot_id", committed.snapshotId());
    if (committed.parentId() == null) {
      out.putNull("parent_snapshot_id");
    } else {
      out.put("parent_snapshot_id", committed.parentId());
    }
    out.put("data_files", dataCount);
    out.put("delete_files", deleteCount);
    out.put("removed_delete_files", removed);
    return out.toString();
  }
}
