package lakestream;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
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
import org.apache.iceberg.PartitionSpec;
import org.apache.iceberg.PartitionStatisticsFile;
import org.apache.iceberg.Snapshot;
import org.apache.iceberg.SnapshotRef;
import org.apache.iceberg.StatisticsFile;
import org.apache.iceberg.Table;
import org.apache.iceberg.TableMetadata;
import org.apache.iceberg.io.FileIO;
import org.apache.iceberg.io.FileInfo;
import org.apache.iceberg.io.SupportsPrefixOperations;
import org.apache.iceberg.io.SupportsBulkOperations;
import org.apache.iceberg.relocated.com.google.common.collect.ImmutableList;
import org.apache.iceberg.relocated.com.google.common.collect.Lists;
import org.apache.iceberg.util.Tasks;
import org.apache.spark.sql.SparkSession;

/**
 * Snapshot expiry and orphan removal for a table whose history is one line (only the main branch, every snapshot
 * an ancestor of the current one), as a pipeline's tables are, without reading the manifests of every snapshot.
 * Both read on their own thread, paced to a duty cycle (they run beside the batches, which need the cores).
 *
 * <p>The one fact both rest on: on a line of snapshots whose oldest is K, the files a snapshot R references are
 * those live in K plus those added by the snapshots after K up to R, because a file's entries are only ever
 * removed after it is added (Iceberg never adds a path back).
 *
 * <p>Why not Iceberg's: the Spark procedure reads every manifest of every snapshot (35-78 s of Spark jobs on a
 * 100M-row mirror with ~500 snapshots, beside the batches); the core {@code ExpireSnapshots} cleanup of 1.10
 * reads the manifest lists without their content column, so it takes delete manifests for data manifests, and
 * beside ingestion it deleted a Puffin file that still held live DVs of other data files.
 *
 * <p>Expiry, where E is the oldest expired snapshot and K the oldest kept one: a kept snapshot references a file
 * of the expired ones only if it is live in K. So the candidates are the files live in E or added by an expired
 * snapshot (read from E's manifests and the manifests with added files, skipping those K still lists), and a
 * candidate is deleted unless K lists it live: a Puffin file holds the DVs of several data files, and stays
 * while any of them is live in K. Manifests are deleted when an expired snapshot listed them and K does not (a
 * manifest is carried from one snapshot to the next until it is dropped for good), and so are the expired
 * snapshots' manifest lists and statistics files. Snapshots committed meanwhile start from a snapshot at or
 * after K, so they cannot reference a deleted file.
 *
 * <p>The metadata commit runs under the table's commit lock in this JVM (a batch's commit never races it); the
 * reading and deleting run after, on {@code threads} threads of their own (not Iceberg's worker pool, which
 * the batches' commits use).
 */
public final class LineHistory {
  private static final ObjectMapper JSON = new ObjectMapper();

  private LineHistory() {}

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
    ExecutorService pool = pool(req);
    try {
      deleteUnreferenced(io[0], beforeAfter[0], beforeAfter[1], pool, paced(req), out, clock);
    } finally {
      pool.shutdownNow();
    }
    clock.into(out); // adds the cleanup's steps to the commit's
    return out.toString();
  }

  /**
   * The files under the table's location that no snapshot references and that are older than
   * {@code older_than_ms}: deleted unless {@code dry_run}. Never a metadata JSON file (the catalog's pointer and
   * its log: `trim_metadata` bounds them), never a checksum file, never anything under {@code keep_under} (the
   * pipeline's own files beside the table, its key index: no snapshot names them). Answers {"fallback": why} when the history
   * is not one line or the table's FileIO cannot list an object store, else {"orphans": [first 100 paths], "orphan_count",
   * "listed", "referenced", "timings_ms"}.
   */
  public static String removeOrphans(SparkSession spark, String catalog, String namespace, String table,
      String requestJson) throws Exception {
    JsonNode req = JSON.readTree(requestJson);
    Table t = LakestreamSink.loadFresh(LakestreamSink.catalog(spark, catalog), LakestreamSink.identifier(namespace, table));
    ObjectNode out = JSON.createObjectNode();
    TableMetadata m = ((HasTableOperations) t).operations().current();
    String notLinear = notOneLine(m);
    if (notLinear == null && localRoot(m.location()) == null && !(t.io() instanceof SupportsPrefixOperations)) {
      notLinear = "the table's FileIO cannot list (" + t.io().getClass().getSimpleName() + ")";
    }
    if (notLinear != null) {
      out.put("fallback", notLinear);
      return out.toString();
    }
    LakestreamSink.Laps clock = new LakestreamSink.Laps();
    ExecutorService pool = pool(req);
    try {
      Set<String> referenced = referenced(t.io(), m, pool, paced(req));
      clock.lap("read_referenced");
      String location = m.location().replaceAll("/+$", "");
      String kept = req.path("keep_under").asText("");
      String own = kept.isEmpty() ? null : key(kept.replaceAll("/+$", "") + "/");
      long olderThan = req.path("older_than_ms").asLong();
      List<String> orphans = new ArrayList<>();
      int listed = 0;
      for (FileInfo f : listing(t.io(), location)) {
        listed++;
        String path = f.location();
        String name = path.substring(path.lastIndexOf('/') + 1);
        if (f.createdAtMillis() >= olderThan || name.endsWith(".crc") || name.equals("version-hint.text")
            || name.contains(".metadata.json") || (own != null && key(path).startsWith(own)) || referenced.contains(key(path))) {
          continue;
        }
        orphans.add(path);
      }
      clock.lap("list");
      if (!req.path("dry_run").asBoolean(false)) {
        Deletes deleting = new Deletes(t.io(), pool, paced(req));
        deleting.all(orphans);
        out.put("delete_nice", deleting.nice());
        clock.lap("delete");
      }
      out.put("orphan_count", orphans.size());
      out.put("listed", listed);
      out.put("referenced", referenced.size());
      ArrayNode first = out.putArray("orphans");
      orphans.stream().limit(100).forEach(first::add);
      clock.into(out);
      return out.toString();
    } finally {
      pool.shutdownNow();
    }
  }

  /**
   * Every file some snapshot of {@code m} references, as {@link #key}s: the metadata's statistics files, each
   * snapshot's manifest list and manifests, and the files of the oldest snapshot's manifests and of every
   * manifest with added files (a file live in a later snapshot was live in the oldest or added since, and
   * the manifest that added it is listed by the snapshot that added it).
   */
  private static Set<String> referenced(FileIO io, TableMetadata m, ExecutorService pool, Pace pace) {
    Set<String> out = ConcurrentHashMap.newKeySet();
    m.statisticsFiles().forEach(f -> out.add(key(f.path())));
    m.partitionStatisticsFiles().forEach(f -> out.add(key(f.path())));
    List<Snapshot> snapshots = m.snapshots();
    if (snapshots.isEmpty()) {
      return out;
    }
    Snapshot oldest = snapshots.stream().min(Comparator.comparingLong(Snapshot::sequenceNumber)).orElseThrow();
    Map<String, ManifestFile> toRead = new ConcurrentHashMap<>();
    eachPaced(snapshots, pool, pace, s -> {
      if (s.manifestListLocation() != null) {
        out.add(key(s.manifestListLocation()));
      }
      for (ManifestFile mf : s.allManifests(io)) {
        out.add(key(mf.path()));
        if (s == oldest || mf.hasAddedFiles()) {
          toRead.putIfAbsent(mf.path(), mf);
        }
      }
    });
    eachPaced(toRead.values(), pool, pace, mf -> {
      Set<String> live = new HashSet<>();
      collectLive(mf, io, m.specsById(), live);
      live.forEach(p -> out.add(key(p)));
    });
    return out;
  }

  /**
   * Every file under {@code location}. A local directory is walked with java.nio: Hadoop's local file system
   * runs `ls -ld` once per file for its permissions (a minute for the 100M-row mirror's ~10k files) and fails
   * the whole listing when a file vanishes meanwhile (Iceberg deletes old metadata files at commits).
   */
  private static Iterable<FileInfo> listing(FileIO io, String location) throws java.io.IOException {
    java.nio.file.Path root = localRoot(location);
    if (root == null) {
      return ((SupportsPrefixOperations) io).listPrefix(location + "/");
    }
    String scheme = location.startsWith("file:") ? "file:" : "";
    List<FileInfo> files = new ArrayList<>();
    if (!java.nio.file.Files.isDirectory(root)) {
      return files;
    }
    java.nio.file.Files.walkFileTree(root, new java.nio.file.SimpleFileVisitor<java.nio.file.Path>() {
      @Override
      public java.nio.file.FileVisitResult visitFile(java.nio.file.Path file,
          java.nio.file.attribute.BasicFileAttributes attrs) {
        if (attrs.isRegularFile()) {
          files.add(new FileInfo(scheme + file.toAbsolutePath(), attrs.size(), attrs.lastModifiedTime().toMillis()));
        }
        return java.nio.file.FileVisitResult.CONTINUE;
      }

      @Override
      public java.nio.file.FileVisitResult visitFileFailed(java.nio.file.Path file, java.io.IOException e) {
        return java.nio.file.FileVisitResult.CONTINUE; // gone since it was listed: not an orphan to delete
      }
    });
    return files;
  }

  /** The local directory of a {@code file:} or scheme-less location, else null. */
  private static java.nio.file.Path localRoot(String location) {
    java.net.URI uri = new org.apache.hadoop.fs.Path(location).toUri();
    if (uri.getScheme() != null && !uri.getScheme().equals("file")) {
      return null;
    }
    return java.nio.file.Paths.get(uri.getPath());
  }

  /** A path compared by its path part only: one table's files share a scheme and authority, spelled variously. */
  private static String key(String path) {
    try {
      return new org.apache.hadoop.fs.Path(path).toUri().getPath();
    } catch (IllegalArgumentException e) {
      return path;
    }
  }

  /** Runs a unit of background work, then rests so that it works only a {@code duty} share of the time. */
  static final class Pace {
    private final double duty;

    Pace(double duty) {
      this.duty = Math.min(1.0, Math.max(0.05, duty));
    }

    void run(Runnable work) {
      long started = System.nanoTime();
      work.run();
      long worked = System.nanoTime() - started;
      long rest = (long) (worked * (1.0 / duty - 1.0));
      if (rest > 0) {
        try {
          Thread.sleep(rest / 1_000_000L, (int) (rest % 1_000_000L));
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
        }
      }
    }
  }

  /** {@code body} for each item on {@code pool}, paced; the first failure (after two retries) is thrown. */
  private static <T> void eachPaced(Iterable<T> items, ExecutorService pool, Pace pace,
      java.util.function.Consumer<T> body) {
    Tasks.foreach(items).executeWith(pool).retry(2).stopOnFailure().throwFailureWhenFinished()
        .run(item -> pace.run(() -> body.accept(item)));
  }

  private static Pace paced(JsonNode req) {
    return new Pace(req.path("duty").asDouble(1.0));
  }

  /**
   * The reading and deleting threads: their own, not Iceberg's worker pool (the batches' commits use it), at nice
   * {@code req.nice} (0: as they are) for as long as they live (the pool ends with the call).
   */
  private static ExecutorService pool(JsonNode req) {
    int nice = req.path("nice").asInt(0);
    return Executors.newFixedThreadPool(Math.max(1, req.path("threads").asInt(1)), r -> {
      Thread th = new Thread(() -> {
        ThreadPriority.lower(nice);
        r.run();
      }, "lakestream-line-history");
      th.setDaemon(true);
      return th;
    });
  }

  /** The nice value the pool's threads of {@code requestJson} run at (for tests). */
  public static int poolNiceness(String requestJson) throws Exception {
    ExecutorService pool = pool(JSON.readTree(requestJson));
    try {
      Integer nice = pool.submit(ThreadPriority::current).get();
      return nice == null ? -100 : nice;
    } finally {
      pool.shutdownNow();
    }
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
      ExecutorService pool, Pace pace, ObjectNode out, LakestreamSink.Laps clock) {
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

    // The manifests the expired snapshots listed (reading the lists only).
    Snapshot oldestExpired = expired.stream().min(Comparator.comparingLong(Snapshot::sequenceNumber)).orElseThrow();
    Map<String, ManifestFile> expiredManifests = new ConcurrentHashMap<>();
    Set<String> ofOldestExpired = ConcurrentHashMap.newKeySet();
    eachPaced(expired, pool, pace, s -> {
      for (ManifestFile m : s.allManifests(io)) {
        expiredManifests.putIfAbsent(m.path(), m);
        if (s == oldestExpired) {
          ofOldestExpired.add(m.path());
        }
      }
    });
    Set<String> keptManifests = new HashSet<>();
    List<ManifestFile> keptList = oldestKept.allManifests(io);
    keptList.forEach(m -> keptManifests.add(m.path()));
    clock.lap("read_lists");

    // Candidates: the files live in some expired snapshot, i.e. live in the oldest expired one or added since.
    // A manifest the oldest kept snapshot still lists holds only files live there: not read. Failing to
    // read a candidate manifest only leaves orphans.
    Set<String> data = ConcurrentHashMap.newKeySet(); // the candidates, by content
    Set<String> deletes = ConcurrentHashMap.newKeySet();
    List<ManifestFile> candidates = new ArrayList<>();
    for (ManifestFile m : expiredManifests.values()) {
      if (!keptManifests.contains(m.path()) && (ofOldestExpired.contains(m.path()) || m.hasAddedFiles())) {
        candidates.add(m);
      }
    }
    eachPaced(candidates, pool, pace, m -> collectLive(m, io, before.specsById(), m.content() == ManifestContent.DATA ? data : deletes));
    clock.lap("read_expired");

    // What the oldest kept snapshot still references: never deleted. A failure here stops the cleanup.
    Set<String> liveInKept = ConcurrentHashMap.newKeySet();
    if (!data.isEmpty() || !deletes.isEmpty()) {
      eachPaced(keptList, pool, pace, m -> collectLive(m, io, before.specsById(), liveInKept));
    }
    clock.lap("read_kept");

    data.removeAll(liveInKept);
    deletes.removeAll(liveInKept);
    List<String> manifests = new ArrayList<>();
    expiredManifests.keySet().stream().filter(p -> !keptManifests.contains(p)).forEach(manifests::add);
    List<String> lists = new ArrayList<>();
    expired.stream().map(Snapshot::manifestListLocation).filter(p -> p != null).forEach(lists::add);
    List<String> statistics = expiredStatistics(before, after);

    Deletes deleting = new Deletes(io, pool, pace);
    out.put("deleted_data_files", deleting.all(data));
    out.put("deleted_position_delete_files", deleting.all(deletes));
    out.put("deleted_equality_delete_files", 0);
    out.put("deleted_manifest_files", deleting.all(manifests));
    out.put("deleted_manifest_lists", deleting.all(lists));
    out.put("deleted_statistics_files", deleting.all(statistics));
    out.put("delete_nice", deleting.nice());
    out.put("oldest_kept_snapshot_id", oldestKept.snapshotId());
    out.put("manifests_read", candidates.size() + (liveInKept.isEmpty() ? 0 : keptList.size()));
    clock.lap("delete");
  }

  /** Paths of {@code m}'s live files (only the path column is read). */
  private static void collectLive(ManifestFile m, FileIO io, Map<Integer, PartitionSpec> specs, Set<String> into) {
    try (ManifestReader<? extends ContentFile<?>> r = m.content() == ManifestContent.DATA
        ? ManifestFiles.read(m, io, specs).select(ImmutableList.of("file_path"))
        : ManifestFiles.readDeleteManifest(m, io, specs).select(ImmutableList.of("file_path"))) {
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

  /**
   * Deletes files paced on the call's own threads, at its nice (a missing file is already gone; {@code all}
   * answers the number asked for). A burst of thousands of unlinks at once (HadoopFileIO's bulk delete runs four
   * threads a core at nice 0) made the batches' commits two to four times slower while it lasted (expiry deletes
   * 6-10k files a round at 100M rows). An object store's bulk delete still goes a request of up to {@code BULK}
   * keys at a time, paced.
   */
  static final class Deletes {
    private static final int BULK = 1000;
    private final FileIO io;
    private final ExecutorService pool;
    private final Pace pace;
    private final java.util.concurrent.atomic.AtomicInteger nice = new java.util.concurrent.atomic.AtomicInteger(-100);

    Deletes(FileIO io, ExecutorService pool, Pace pace) {
      this.io = io;
      this.pool = pool;
      this.pace = pace;
    }

    int all(Collection<String> paths) {
      if (paths.isEmpty()) {
        return 0;
      }
      if (io instanceof SupportsBulkOperations && !local(paths.iterator().next())) {
        SupportsBulkOperations bulk = (SupportsBulkOperations) io;
        Tasks.foreach(Lists.partition(new ArrayList<>(paths), BULK)).executeWith(pool).suppressFailureWhenFinished()
            .run(keys -> pace.run(() -> {
              noteNice();
              bulk.deleteFiles(keys);
            }));
      } else {
        Tasks.foreach(paths).executeWith(pool).suppressFailureWhenFinished().run(path -> pace.run(() -> {
          noteNice();
          io.deleteFile(path);
        }));
      }
      return paths.size();
    }

    /** The nice value the deleting threads ran at (-100 when nothing was deleted or it could not be read). */
    int nice() {
      return nice.get();
    }

    private void noteNice() {
      if (nice.get() == -100) {
        Integer now = ThreadPriority.current();
        nice.set(now == null ? -100 : now);
      }
    }

    private static boolean local(String path) {
      return path.startsWith("/") || path.startsWith("file:") || path.startsWith("hdfs:");
    }
  }
}
