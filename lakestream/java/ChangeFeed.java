package lakestream;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Collections;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.iceberg.DataFile;
import org.apache.iceberg.DeleteFile;
import org.apache.iceberg.FileContent;
import org.apache.iceberg.FileScanTask;
import org.apache.iceberg.Snapshot;
import org.apache.iceberg.SnapshotChanges;
import org.apache.iceberg.Table;
import org.apache.iceberg.data.BaseDeleteLoader;
import org.apache.iceberg.deletes.PositionDeleteIndex;
import org.apache.iceberg.io.CloseableIterable;
import org.apache.iceberg.spark.ScanTaskSetManager;
import org.apache.spark.sql.SparkSession;

/**
 * The driver side of the change feed (`lakestream.changes`): what the snapshots of a range touched, and the scans
 * that read only that.
 *
 * <p>A range (since, until] of a table's history is planned from its snapshots' manifests alone: the data files the
 * range added, removed, or whose deletion vector it changed are the only files whose live rows can differ between
 * the two ends. Their rows at {@code since} and at {@code until} are staged as two scan task sets (the mechanism
 * Iceberg's own rewrite uses to read chosen files, {@link ScanTaskSetManager}), so Spark reads those files with the
 * deletes each end had, and the row lineage columns, and nothing else of the table. Every position a snapshot of the
 * range deleted, and every file it removed, is listed with the file's first row id, so that the driver can say which
 * commit deleted a row.
 */
public final class ChangeFeed {
  private static final ObjectMapper JSON = new ObjectMapper();

  private ChangeFeed() {}

  /**
   * Plan (since, until] of {@code catalog.namespace.table}; {@code untilSnapshotId} -1 is the current snapshot.
   * Answer: {"since", "until", "ancestor": whether since is an ancestor of until, "oldest": the oldest snapshot of
   * until's ancestry still in the metadata, "snapshots": [{snapshot_id, sequence_number, operation, compaction}]
   * after since up to until, "since_sequence_number", "full": true when a snapshot of the range added equality
   * deletes or position delete files that name no data file (every file is then read), "before"/"after": {"set":
   * the staged task set id, "files", "records"}, "events": [{snapshot_id, kind: deleted|removed, data_file,
   * first_row_id, positions_le64 (deleted only)}]}. Stages nothing unless since is an ancestor of until.
   */
  public static String plan(SparkSession spark, String catalog, String namespace, String table,
      long sinceSnapshotId, long untilSnapshotId, String setPrefix) throws Exception {
    Table t = loadTable(spark, catalog, namespace, table);
    ObjectNode out = JSON.createObjectNode();
    Snapshot until = untilSnapshotId < 0 ? t.currentSnapshot() : t.snapshot(untilSnapshotId);
    if (until == null) {
      out.put("until_missing", true);
      return out.toString();
    }
    out.put("until", until.snapshotId());
    out.put("since", sinceSnapshotId);
    List<Snapshot> chain = new ArrayList<>();
    Snapshot since = null;
    Snapshot oldest = until;
    for (Snapshot s = until; s != null; s = s.parentId() == null ? null : t.snapshot(s.parentId())) {
      oldest = s;
      if (s.snapshotId() == sinceSnapshotId) {
        since = s;
        break;
      }
      chain.add(s);
    }
    out.put("oldest", oldest.snapshotId());
    out.put("ancestor", since != null);
    if (since == null) {
      return out.toString();
    }
    Collections.reverse(chain);
    out.put("since_sequence_number", since.sequenceNumber());
    ArrayNode snapshots = out.putArray("snapshots");
    ArrayNode events = out.putArray("events");
    Set<String> touched = new HashSet<>();
    Set<String> added = new HashSet<>(); // data files the range added: the only ones a changed row can be in at until
    boolean full = false;
    BaseDeleteLoader loader = new BaseDeleteLoader(d -> t.io().newInputFile(d.location()));
    Map<String, Long> firstRowIds = new HashMap<>();
    for (Snapshot s : chain) {
      ObjectNode n = snapshots.addObject();
      n.put("snapshot_id", s.snapshotId());
      n.put("sequence_number", s.sequenceNumber());
      n.put("operation", s.operation());
      boolean compaction = "replace".equals(s.operation())
          || "true".equals(s.summary() == null ? null : s.summary().get("lakestream.compaction"));
      n.put("compaction", compaction);
      SnapshotChanges changes = SnapshotChanges.builderFor(t).snapshot(s).build();
      for (DataFile f : changes.addedDataFiles()) {
        touched.add(f.location());
        added.add(f.location());
        firstRowIds.put(f.location(), f.firstRowId());
      }
      Map<String, List<DeleteFile>> removedDeletes = new HashMap<>();
      for (DeleteFile d : changes.removedDeleteFiles()) {
        if (d.content() == FileContent.POSITION_DELETES && d.referencedDataFile() != null) {
          removedDeletes.computeIfAbsent(d.referencedDataFile(), k -> new ArrayList<>()).add(d.copy());
        }
      }
      for (DataFile f : changes.removedDataFiles()) {
        touched.add(f.location());
        firstRowIds.putIfAbsent(f.location(), f.firstRowId());
        if (!compaction) {
          // A file removed by anything but a rewrite (TRUNCATE, DELETE of whole files, an overwrite) takes its
          // live rows with it (all but those its deletion vector, removed with it, had deleted already); a rewrite
          // moves them, with their lineage, into the files it added.
          ObjectNode e = events.addObject();
          e.put("snapshot_id", s.snapshotId());
          e.put("kind", "removed");
          e.put("data_file", f.location());
          putFirstRowId(e, f.firstRowId());
          List<DeleteFile> dead = removedDeletes.get(f.location());
          if (dead != null) {
            e.put("dead_le64", encode(loader.loadPositionDeletes(dead, f.location()), null));
          }
        }
      }
      Map<String, List<DeleteFile>> vectors = new LinkedHashMap<>();
      for (DeleteFile d : changes.addedDeleteFiles()) {
        if (d.content() != FileContent.POSITION_DELETES || d.referencedDataFile() == null) {
          full = true;
          continue;
        }
        touched.add(d.referencedDataFile());
        vectors.computeIfAbsent(d.referencedDataFile(), k -> new ArrayList<>()).add(d.copy());
      }
      if (compaction) {
        continue; // a rewrite's deletion vectors carry deletes already made onto its new files: nothing new
      }
      for (Map.Entry<String, List<DeleteFile>> e : vectors.entrySet()) {
        // v3 keeps one deletion vector per data file, so a commit that deletes one more row of a file replaces its
        // vector: only the positions the replaced vector did not hold were deleted by this snapshot.
        PositionDeleteIndex now = loader.loadPositionDeletes(e.getValue(), e.getKey());
        List<DeleteFile> before = removedDeletes.get(e.getKey());
        PositionDeleteIndex earlier = before == null ? null : loader.loadPositionDeletes(before, e.getKey());
        ObjectNode ev = events.addObject();
        ev.put("snapshot_id", s.snapshotId());
        ev.put("kind", "deleted");
        ev.put("data_file", e.getKey());
        ev.put("positions_le64", encode(now, earlier));
      }
    }
    out.put("full", full);
    out.set("before", stage(t, since.snapshotId(), full ? null : touched, setPrefix + "-before", firstRowIds));
    // A file live at both ends only lost rows in between: every row it holds at until it held at since, unchanged.
    // So the rows after are read from the files the range added (new rows, updated rows, rows a rewrite moved).
    out.set("after", stage(t, until.snapshotId(), full ? null : added, setPrefix + "-after", firstRowIds));
    for (com.fasterxml.jackson.databind.JsonNode e : events) {
      if (!e.has("first_row_id")) {
        putFirstRowId((ObjectNode) e, firstRowIds.get(e.get("data_file").asText()));
      }
    }
    return out.toString();
  }

  /** Drop the task sets {@link #plan} staged (once their rows were read). */
  public static void release(SparkSession spark, String catalog, String namespace, String table, String setPrefix) {
    Table t = loadTable(spark, catalog, namespace, table);
    ScanTaskSetManager.get().removeTasks(t, setPrefix + "-before");
    ScanTaskSetManager.get().removeTasks(t, setPrefix + "-after");
  }

  private static ObjectNode stage(Table t, long snapshotId, Set<String> files, String setId,
      Map<String, Long> firstRowIds) throws Exception {
    List<FileScanTask> tasks = new ArrayList<>();
    long records = 0;
    try (CloseableIterable<FileScanTask> planned = t.newScan().useSnapshot(snapshotId).planFiles()) {
      for (FileScanTask task : planned) {
        if (files == null || files.contains(task.file().location())) {
          tasks.add(task);
          records += task.file().recordCount();
          firstRowIds.putIfAbsent(task.file().location(), task.file().firstRowId());
        }
      }
    }
    ObjectNode n = JSON.createObjectNode();
    if (tasks.isEmpty()) {
      n.putNull("set"); // nothing to read on this side (Iceberg refuses to stage an empty set)
    } else {
      ScanTaskSetManager.get().stageTasks(t, setId, tasks);
      n.put("set", setId);
    }
    n.put("files", tasks.size());
    n.put("records", records);
    return n;
  }

  /** Base64 of the little-endian positions of {@code now} that {@code earlier} (may be null) does not hold. */
  private static String encode(PositionDeleteIndex now, PositionDeleteIndex earlier) {
    ByteBuffer fresh = ByteBuffer.allocate((int) Math.min(Integer.MAX_VALUE - 8, 8L * now.cardinality()))
        .order(ByteOrder.LITTLE_ENDIAN);
    now.forEach(pos -> {
      if (earlier == null || !earlier.isDeleted(pos)) {
        fresh.putLong(pos);
      }
    });
    return Base64.getEncoder().encodeToString(java.util.Arrays.copyOf(fresh.array(), fresh.position()));
  }

  private static void putFirstRowId(ObjectNode n, Long firstRowId) {
    if (firstRowId == null) {
      n.putNull("first_row_id");
    } else {
      n.put("first_row_id", firstRowId);
    }
  }

  private static Table loadTable(SparkSession spark, String catalog, String namespace, String table) {
    // Staged sets are keyed by the table's UUID, so the staged scan finds them through any instance of the table.
    return LakestreamSink.loadFresh(LakestreamSink.catalog(spark, catalog), LakestreamSink.identifier(namespace, table));
  }
}
