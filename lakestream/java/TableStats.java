package lakestream;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.util.List;
import java.util.concurrent.FutureTask;
import org.apache.iceberg.DeleteFile;
import org.apache.iceberg.FileFormat;
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
   * {@code delete_files} metadata table lists them), read on a thread at nice {@code nice}.
   */
  public static String currentFiles(Table t, int nice) throws Exception {
    Snapshot s = t.currentSnapshot();
    FutureTask<ObjectNode> work = new FutureTask<>(() -> {
      ThreadPriority.lower(nice);
      ObjectNode out = JSON.createObjectNode();
      long deleteFiles = 0;
      long dvs = 0;
      List<ManifestFile> manifests = s == null ? List.of() : s.allManifests(t.io());
      for (ManifestFile m : manifests) {
        if (m.content() != ManifestContent.DELETES) {
          continue;
        }
        try (ManifestReader<DeleteFile> reader = ManifestFiles.readDeleteManifest(m, t.io(), t.specs())) {
          for (DeleteFile d : reader) {
            deleteFiles++;
            if (d.format() == FileFormat.PUFFIN) {
              dvs++;
            }
          }
        }
      }
      out.put("manifests", manifests.size());
      out.put("delete_files", deleteFiles);
      out.put("deletion_vectors", dvs);
      return out;
    });
    Thread thread = new Thread(work, "lakestream-table-stats");
    thread.setDaemon(true);
    thread.start();
    return work.get().toString();
  }
}
