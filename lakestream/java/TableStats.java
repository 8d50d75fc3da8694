package lakestream;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.apache.iceberg.ContentFile;
import org.apache.iceberg.DataFile;
import org.apache.iceberg.DeleteFile;
import org.apache.iceberg.FileContent;
import org.apache.iceberg.FileFormat;
import org.apache.iceberg.HasTableOperations;
import org.apache.iceberg.ManifestContent;
import org.apache.iceberg.ManifestFile;
import org.apache.iceberg.ManifestFiles;
import org.apache.iceberg.ManifestReader;
import org.apache.iceberg.Snapshot;
import org.apache.iceberg.Table;
import org.apache.iceberg.TableMetadata;

/**
 * Counts a maintenance plan needs from a table's current snapshot, read here in the JVM on a thread of its own at
 * a lower priority ({@link ThreadPriority}): the metadata tables' Spark jobs took executor slots and the commit's CPU
 * from the batches every round.
 */
public final class TableStats {
  private static final ObjectMapper JSON = new ObjectMapper();

  private TableStats() {}

  /**
   * {"manifests", "delete_files", "deletion_vectors"} of {@code t}'s current snapshot (live delete files, as the
   * {@code delete_files} metadata table lists them), read on a thread at nice {@code nice}. For a table that was
   * never partitioned also "partition": its one row of the {@code partitions} metadata table ({"spec_id",
   * "data_files", "data_bytes", "delete_files", "last_updated_ms"}; null when it holds no file) — a partitioned
   * table's partition values are typed by Spark's reading of that table, so those stay with Spark.
   *
   * <p>With {@code summaryKeys} (comma-separated; "" for none) also what the {@code snapshots} and
   * {@code metadata_log_entries} metadata tables would give a plan, from the metadata already loaded: "snapshots"
   * (each one's "snapshot_id", "parent_id", "committed_ms", "operation" and "summary": the values of those keys)
   * and "metadata_files" (the metadata log's files and the current one).
   */
  public static String currentFiles(Table t, int nice, String summaryKeys) throws Exception {
    TableMetadata metadata = ((HasTableOperations) t).operations().current();
    boolean unpartitioned = neverPartitioned(t) && metadata.formatVersion() >= 2; // and sequence numbers (v2+)
    return ThreadPriority.call(nice, () -> {
      ObjectNode out = count(t, unpartitioned).toJson(t, unpartitioned);
      if (!summaryKeys.isEmpty()) {
        history(out, metadata, summaryKeys.split(","));
      }
      return out;
    }).toString();
  }

  /**
   * The live data files of {@code t}'s current snapshot, read on a thread at nice {@code nice}, for a compaction's
   * plan: {"unpartitioned": true, "files": [{"path", "size", "records", "spec_id", "deleted"}]} for a table that was never
   * partitioned; {"unpartitioned": false} for any other (its partition values are typed by Spark's listing).
   */
  public static String liveDataFiles(Table t, int nice) throws Exception {
    ObjectNode out = JSON.createObjectNode();
    boolean unpartitioned = neverPartitioned(t);
    out.put("unpartitioned", unpartitioned);
    if (!unpartitioned) {
      return out.toString();
    }
    return ThreadPriority.call(nice, () -> {
      ArrayNode files = out.putArray("files");
      Snapshot s = t.currentSnapshot();
      // Rows deleted in each data file by the live position deletes that name it (a deletion vector's count
      // is its cardinality): compaction picks files by their share of deleted rows.
      Map<String, Long> deleted = new HashMap<>();
      for (ManifestFile m : s == null ? List.<ManifestFile>of() : s.deleteManifests(t.io())) {
        try (ManifestReader<DeleteFile> reader = ManifestFiles.readDeleteManifest(m, t.io(), t.specs())) {
          for (DeleteFile d : reader) {
            if (d.referencedDataFile() != null) {
              deleted.merge(d.referencedDataFile(), d.recordCount(), Long::sum);
            }
          }
        }
      }
      for (ManifestFile m : s == null ? List.<ManifestFile>of() : s.dataManifests(t.io())) {
        try (ManifestReader<DataFile> reader = ManifestFiles.read(m, t.io(), t.specs())) {
          for (DataFile d : reader) { // the live entries
            ObjectNode f = files.addObject();
            f.put("path", d.location());
            f.put("size", d.fileSizeInBytes());
            f.put("records", d.recordCount());
            f.put("spec_id", d.specId());
            f.put("deleted", deleted.getOrDefault(d.location(), 0L));
          }
        }
      }
      return out;
    }).toString();
  }

  /** One spec, unpartitioned: the table's files all sit in its one partition. */
  private static boolean neverPartitioned(Table t) {
    return t.specs().size() == 1 && t.spec().isUnpartitioned();
  }

  private static void history(ObjectNode out, TableMetadata metadata, String[] summaryKeys) {
    ArrayNode snapshots = out.putArray("snapshots");
    for (Snapshot s : metadata.snapshots()) {
      ObjectNode n = snapshots.addObject();
      n.put("snapshot_id", s.snapshotId());
      n.put("parent_id", s.parentId()); // null for the first
      n.put("committed_ms", s.timestampMillis());
      n.put("operation", s.operation());
      ObjectNode summary = n.putObject("summary");
      Map<String, String> all = s.summary() == null ? Map.of() : s.summary();
      for (String key : summaryKeys) {
        summary.put(key, all.get(key));
      }
    }
    ArrayNode files = out.putArray("metadata_files");
    metadata.previousFiles().forEach(e -> files.add(e.file()));
    files.add(metadata.metadataFileLocation());
  }

  private static Counts count(Table t, boolean unpartitioned) throws Exception {
    Counts c = new Counts();
    for (Snapshot snap : t.snapshots()) {
      c.committedMs.put(snap.sequenceNumber(), snap.timestampMillis());
    }
    Snapshot s = t.currentSnapshot();
    List<ManifestFile> manifests = s == null ? List.of() : s.allManifests(t.io());
    c.manifests = manifests.size();
    for (ManifestFile m : manifests) {
      if (m.content() == ManifestContent.DELETES) {
        try (ManifestReader<DeleteFile> reader = ManifestFiles.readDeleteManifest(m, t.io(), t.specs())) {
          for (DeleteFile d : reader) {
            c.deleteFiles++;
            c.dvs += d.format() == FileFormat.PUFFIN ? 1 : 0;
            c.deletedRecords += d.content() == FileContent.POSITION_DELETES ? d.recordCount() : 0;
            c.updated(d);
          }
        }
      } else if (unpartitioned) {
        try (ManifestReader<DataFile> reader = ManifestFiles.read(m, t.io(), t.specs())) {
          for (DataFile d : reader) {
            c.dataFiles++;
            c.dataBytes += d.fileSizeInBytes();
            c.records += d.recordCount();
            c.updated(d);
          }
        }
      }
    }
    return c;
  }

  /** What {@link #count} found in the current snapshot's manifests. */
  private static final class Counts {
    final Map<Long, Long> committedMs = new HashMap<>(); // sequence number → the time of the snapshot that wrote it
    long manifests;
    long dataFiles;
    long dataBytes;
    long records;
    long deletedRecords; // rows deleted by position (a deletion vector's cardinality)
    long deleteFiles;
    long dvs;
    Long lastUpdatedMs; // the latest commit among the live files' (expired snapshots unknown)

    void updated(ContentFile<?> f) {
      Long ms = f.fileSequenceNumber() == null ? null : committedMs.get(f.fileSequenceNumber());
      if (ms != null && (lastUpdatedMs == null || ms > lastUpdatedMs)) {
        lastUpdatedMs = ms;
      }
    }

    ObjectNode toJson(Table t, boolean unpartitioned) {
      ObjectNode out = JSON.createObjectNode();
      out.put("manifests", manifests);
      out.put("delete_files", deleteFiles);
      out.put("deletion_vectors", dvs);
      if (!unpartitioned) {
        return out;
      }
      if (dataFiles + deleteFiles == 0) {
        out.putNull("partition");
        return out;
      }
      ObjectNode p = out.putObject("partition");
      p.put("spec_id", t.spec().specId());
      p.put("data_files", dataFiles);
      p.put("data_bytes", dataBytes);
      p.put("delete_files", deleteFiles);
      p.put("records", records);
      p.put("deleted_records", deletedRecords);
      p.put("last_updated_ms", lastUpdatedMs); // null when unknown
      return out;
    }
  }
}
