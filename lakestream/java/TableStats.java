package lakestream;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.FutureTask;
import org.apache.iceberg.ContentFile;
import org.apache.iceberg.DataFile;
import org.apache.iceberg.DeleteFile;
import org.apache.iceberg.FileFormat;
import org.apache.iceberg.HasTableOperations;
import org.apache.iceberg.ManifestContent;
import org.apache.iceberg.ManifestFile;
import org.apache.iceberg.ManifestFiles;
import org.apache.iceberg.ManifestReader;
import org.apache.iceberg.Snapshot;
import org.apache.iceberg.Table;

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
   */
  public static String currentFiles(Table t, int nice) throws Exception {
    Snapshot s = t.currentSnapshot();
    boolean unpartitioned = t.specs().size() == 1 && t.spec().isUnpartitioned() // and sequence numbers (v2+)
        && ((HasTableOperations) t).operations().current().formatVersion() >= 2;
    FutureTask<ObjectNode> work = new FutureTask<>(() -> {
      ThreadPriority.lower(nice);
      Map<Long, Long> committedMs = new HashMap<>(); // sequence number → the time of the snapshot that wrote it
      for (Snapshot snap : t.snapshots()) {
        committedMs.put(snap.sequenceNumber(), snap.timestampMillis());
      }
      long[] counts = new long[5]; // data files, data bytes, delete files, DVs, last updated (ms; -1 unknown)
      counts[4] = -1;
      List<ManifestFile> manifests = s == null ? List.of() : s.allManifests(t.io());
      for (ManifestFile m : manifests) {
        if (m.content() == ManifestContent.DELETES) {
          try (ManifestReader<DeleteFile> reader = ManifestFiles.readDeleteManifest(m, t.io(), t.specs())) {
            for (DeleteFile d : reader) {
              counts[2]++;
              counts[3] += d.format() == FileFormat.PUFFIN ? 1 : 0;
              updated(counts, committedMs, d);
            }
          }
        } else if (unpartitioned) {
          try (ManifestReader<DataFile> reader = ManifestFiles.read(m, t.io(), t.specs())) {
            for (DataFile d : reader) {
              counts[0]++;
              counts[1] += d.fileSizeInBytes();
              updated(counts, committedMs, d);
            }
          }
        }
      }
      ObjectNode out = JSON.createObjectNode();
      out.put("manifests", manifests.size());
      out.put("delete_files", counts[2]);
      out.put("deletion_vectors", counts[3]);
      if (unpartitioned) {
        if (counts[0] + counts[2] == 0) {
          out.putNull("partition");
        } else {
          ObjectNode p = out.putObject("partition");
          p.put("spec_id", t.spec().specId());
          p.put("data_files", counts[0]);
          p.put("data_bytes", counts[1]);
          p.put("delete_files", counts[2]);
          if (counts[4] < 0) {
            p.putNull("last_updated_ms");
          } else {
            p.put("last_updated_ms", counts[4]);
          }
        }
      }
      return out;
    });
    Thread thread = new Thread(work, "lakestream-table-stats");
    thread.setDaemon(true);
    thread.start();
    return work.get().toString();
  }

  /** The partition's last update: the latest commit among its live files' (expired snapshots unknown). */
  private static void updated(long[] counts, Map<Long, Long> committedMs, ContentFile<?> f) {
    Long ms = f.fileSequenceNumber() == null ? null : committedMs.get(f.fileSequenceNumber());
    if (ms != null && ms > counts[4]) {
      counts[4] = ms;
    }
  }
}
