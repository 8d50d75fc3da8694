package lakestream;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Comparator;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import org.apache.iceberg.ContentFile;
import org.apache.iceberg.ExpireSnapshots;
import org.apache.iceberg.HasTableOperations;
import org.apache.iceberg.ManifestContent;
import org.apache.iceberg.ManifestFile;
import org.apache.iceberg.ManifestFiles;
import org.apache.iceberg.ManifestReader;
import org.apache.iceberg.PartitionStatisticsFile;
import org.apache.iceberg.Snapshot;
import org.apache.iceberg.SnapshotRef;
import org.apache.iceberg.StatisticsFile;
import org.apache.iceberg.Table;
import org.apache.iceberg.TableMetadata;
import org.apache.iceberg.io.FileIO;
import org.apache.iceberg.io.SupportsBulkOperations;
import org.apache.iceberg.relocated.com.google.common.collect.ImmutableList;
import org.apache.iceberg.util.Tasks;
import org.apache.spark.sql.SparkSession;

/**
 * Snapshot expiry for a table whose history is one line (only the main branch, every snapshot an ancestor of
 * the current one), as a pipeline's tables are, without reading the manifests of every retained snapshot.
 *
 * <p>Why not Iceberg's: the Spark procedure reads every manifest of every snapshot (35-78 s of Spark jobs on a
 * 100M-row mirror with ~500 snapshots, beside the batches); the core {@code ExpireSnapshots} cleanup of 1.10
 * reads the manifest lists without their content column, so it takes delete manifests for data manifests, and
 * beside ingestion it deleted a Puffin file that still held live DVs of other data files.
 *
 * <p>What is deleted, on a line of snapshots where the oldest kept one is K: a file is referenced by a kept
 * snapshot only if it is live in K, because a file's entries are only ever removed after it is added (Iceberg
 * never adds a path back). So the candidates are the files removed by the expired snapshots (their DELETED
 * manifest entries), and a candidate is deleted unless K still lists it: a Puffin file holds the DVs of several
 * data files, and stays while any of them is live in K. Manifests are deleted when an expired snapshot listed
 * them and K does not (a manifest is carried from one snapshot to the next until it is dropped for good), and
 * so are the expired snapshots' manifest lists and statistics files. Snapshots committed meanwhile start from
 * a snapshot at or after K, so they cannot reference a deleted file.
 *
 * <p>The metadata commit runs under the table's commit lock in this JVM (a batch's commit never races it); the
 * reading and deleting run after, on {@code threads} threads of their own (not Iceberg's worker pool, which
 * the batches' commits use).
 */
public final class SnapshotExpiry {
  private static final ObjectMapper JSON = new ObjectMapper();

  private SnapshotExpiry() {}

  /**
   * Expire the snapshots older than {@code older_than_ms} beyond the newest {@code retain_last} and delete
   * the files only they referenced. Answers {"fallback": why} without changing anything when the history is
   * not one line (the caller then uses the Spark procedure), {"error": why} when {@code protected_snapshot_id}
   * would be expired, else the counts of what was expired and deleted and the steps' timings.
   */
  public static String expire(SparkSession spark, String catalog, String namespace, String table,
      String requestJson) throws Exception {
    JsonNode req = JSON.readTree(requestJson);
    TableMetadata[] beforeAfter = new TableMetadata[2];
    FileIO[] io = new FileIO[1];
    String answer = LakestreamSink.underTableLock(spark, catalog, namespace, table, req,
        (t, key, r, clock) -> {
          ObjectNode out = commitExpiry(t, r, beforeAfter);
          io[0] = t.io();
          clock.lap("commit");
          clock.into(out);
          return out;
        });
    ObjectNode out = (ObjectNode) JSON.readTree(answer);
    if (beforeAfter[1] == null) {
      return out.toString();
    }
    LakestreamSink.Laps clock = new LakestreamSink.Laps();
    ExecutorService pool = Executors.newFixedThreadPool(Math.max(1, req.path("threads").asInt(1)), r -> {
      Thread th = new Thread(r, "lakestream-expiry");
      th.setDaemon(true);
      return th;
    });
    try {
      deleteUnreferenced(io[0], beforeAfter[0], beforeAfter[1], pool, out, clock);
    } finally {
      pool.shutdownNow();
    }
    clock.into(out); // adds the cleanup's steps to the commit's
    return out.toString();
  }

  /** The metadata commit; {@code beforeAfter} gets the metadata around it when something was expired. */
  private static ObjectNode commitExpiry(Table t, JsonNode req, TableMetadata[] beforeAfter) {
    ObjectNode out = JSON.createObjectNode();
    TableMetadata before = ((HasTableOperations) t).operations().current();
    String notLinear = notOneLine(before);
    if (notLinear != null) {
      out.put("fallback", notLinear);
      return out;
    }
    ExpireSnapshots expiry = t.expireSnapshots()
        .expireOlderThan(req.path("older_than_ms").asLong())
        .retainLast(Math.max(1, req.path("retain_last").asInt(1)))
        .cleanExpiredFiles(false);
    List<Snapshot> doomed = expiry.apply();
    out.put("expired_snapshots", doomed.size());
    JsonNode protect = req.path("protected_snapshot_id");
    if (!protect.isNull() && !protect.isMissingNode()
        && doomed.stream().anyMatch(s -> s.snapshotId() == protect.asLong())) {
      out.put("error", "offsets snapshot " + protect.asLong() + " would be expired: nothing was expired");
      return out;
    }
    if (doomed.isEmpty()) {
      return out;
    }
    expiry.commit();
    beforeAfter[0] = before;
    beforeAfter[1] = ((HasTableOperations) t).operations().refresh();
    return out;
  }

  /** Why {@code m}'s history is not one line of main's ancestors, or null when it is. */
  private static String notOneLine(TableMetadata m) {
    Map<String, SnapshotRef> refs = m.refs();
    if (refs.size() > 1 || (refs.size() == 1 && !refs.containsKey(SnapshotRef.MAIN_BRANCH))) {
      return "the table has branches or tags: " + refs.keySet();
    }
    Set<Long> line = new HashSet<>();
    for (Snapshot s = m.currentSnapshot(); s != null; s = s.parentId() == null ? null : m.snapshot(s.parentId())) {
      line.add(s.snapshotId());
    }
    for (Snapshot s : m.snapshots()) {
      if (!line.contains(s.snapshotId())) {
        return "snapshot " + s.snapshotId() + " is not an ancestor of the current one (a rollback or a staged write)";
      }
    }
    return null;
  }

  private static void deleteUnreferenced(FileIO io, TableMetadata before, TableMetadata after,
      ExecutorService pool, ObjectNode out, LakestreamSink.Laps clock) {
    Set<Long> kept = new HashSet<>();
    after.snapshots().forEach(s -> kept.add(s.snapshotId()));
    List<Snapshot> expired = new ArrayList<>();
    for (Snapshot s : before.snapshots()) {
      if (!kept.contains(s.snapshotId())) {
        expired.add(s);
      }
    }
    Snapshot oldestKept = after.snapshots().stream()
        .min(Comparator.comparingLong(Snapshot::sequenceNumber)).orElseThrow();

    // Candidates: what the expired snapshots listed and removed. Failing to read them only leaves orphans.
    Map<String, ManifestFile> expiredManifests = new ConcurrentHashMap<>();
    Set<String> removedData = ConcurrentHashMap.newKeySet();
    Set<String> removedDeletes = ConcurrentHashMap.newKeySet();
    Tasks.foreach(expired).executeWith(pool).retry(2).stopOnFailure().throwFailureWhenFinished().run(s -> {
      for (ManifestFile m : s.allManifests(io)) {
        expiredManifests.putIfAbsent(m.path(), m);
      }
      // The DELETED entries of the manifests this snapshot wrote: the files it removed.
      s.removedDataFiles(io).forEach(f -> removedData.add(f.location()));
      s.removedDeleteFiles(io).forEach(f -> removedDeletes.add(f.location()));
    });
    clock.lap("read_expired");

    // What the oldest kept snapshot still references: never deleted. A failure here stops the cleanup.
    Set<String> keptManifests = new HashSet<>();
    List<ManifestFile> keptList = oldestKept.allManifests(io);
    keptList.forEach(m -> keptManifests.add(m.path()));
    Set<String> liveInKept = ConcurrentHashMap.newKeySet();
    if (!removedData.isEmpty() || !removedDeletes.isEmpty()) {
      Tasks.foreach(keptList).executeWith(pool).retry(2).stopOnFailure().throwFailureWhenFinished()
          .run(m -> collectLive(m, io, liveInKept));
    }
    clock.lap("read_kept");

    removedData.removeAll(liveInKept);
    removedDeletes.removeAll(liveInKept);
    List<String> manifests = new ArrayList<>();
    expiredManifests.keySet().stream().filter(p -> !keptManifests.contains(p)).forEach(manifests::add);
    List<String> lists = new ArrayList<>();
    expired.stream().map(Snapshot::manifestListLocation).filter(p -> p != null).forEach(lists::add);
    List<String> statistics = expiredStatistics(before, after);

    out.put("deleted_data_files", delete(io, removedData, pool));
    out.put("deleted_position_delete_files", delete(io, removedDeletes, pool));
    out.put("deleted_equality_delete_files", 0);
    out.put("deleted_manifest_files", delete(io, manifests, pool));
    out.put("deleted_manifest_lists", delete(io, lists, pool));
    out.put("deleted_statistics_files", delete(io, statistics, pool));
    out.put("oldest_kept_snapshot_id", oldestKept.snapshotId());
    clock.lap("delete");
  }

  /** Paths of {@code m}'s live files (only the path column is read). */
  private static void collectLive(ManifestFile m, FileIO io, Set<String> into) {
    try (ManifestReader<? extends ContentFile<?>> r = m.content() == ManifestContent.DATA
        ? ManifestFiles.read(m, io, null).select(ImmutableList.of("file_path"))
        : ManifestFiles.readDeleteManifest(m, io, null).select(ImmutableList.of("file_path"))) {
      for (ContentFile<?> f : r) {
        into.add(f.location());
      }
    } catch (java.io.IOException e) {
      throw new java.io.UncheckedIOException("reading manifest " + m.path(), e);
    }
  }

  /** Statistics files of expired snapshots that the remaining metadata no longer names. */
  private static List<String> expiredStatistics(TableMetadata before, TableMetadata after) {
    Set<String> keep = new HashSet<>();
    after.statisticsFiles().forEach(f -> keep.add(f.path()));
    after.partitionStatisticsFiles().forEach(f -> keep.add(f.path()));
    List<String> gone = new ArrayList<>();
    for (StatisticsFile f : before.statisticsFiles()) {
      if (!keep.contains(f.path())) {
        gone.add(f.path());
      }
    }
    for (PartitionStatisticsFile f : before.partitionStatisticsFiles()) {
      if (!keep.contains(f.path())) {
        gone.add(f.path());
      }
    }
    return gone;
  }

  /** Delete {@code paths} (a missing file is already gone); the number asked for. */
  private static int delete(FileIO io, Collection<String> paths, ExecutorService pool) {
    if (paths.isEmpty()) {
      return 0;
    }
    if (io instanceof SupportsBulkOperations) {
      ((SupportsBulkOperations) io).deleteFiles(paths);
    } else {
      Tasks.foreach(paths).executeWith(pool).suppressFailureWhenFinished().run(io::deleteFile);
    }
    return paths.size();
  }
}
