package lakestream;

import java.util.Map;
import org.apache.iceberg.Snapshot;
import org.apache.iceberg.Table;
import org.apache.iceberg.spark.CommitMetadata;
import org.apache.iceberg.spark.Spark3Util;
import org.apache.iceberg.util.SnapshotUtil;
import org.apache.spark.sql.SparkSession;

/** JVM-side helpers that PySpark cannot express: commit properties for SQL writes, and snapshot lookups. */
public final class LakestreamHelper {
  private LakestreamHelper() {}

  /**
   * Runs an SQL write (MERGE / INSERT) so that its Iceberg snapshot summary carries {@code props}.
   * CommitMetadata keeps the properties in a thread-local, so the SQL must run on this very thread:
   * that is why this is Java and not a py4j callback.
   */
  public static void sqlWithCommitProperties(SparkSession spark, String sql, Map<String, String> props)
      throws Exception {
    CommitMetadata.withCommitProperties(
        props,
        () -> {
          spark.sql(sql);
          return null;
        },
        Exception.class);
  }

  /** The newest value of summary property {@code key} on the current snapshot's ancestry, or null. */
  public static String latestSummaryValue(SparkSession spark, String table, String key) throws Exception {
    Table t = Spark3Util.loadIcebergTable(spark, table);
    t.refresh();
    if (t.currentSnapshot() == null) {
      return null;
    }
    for (Snapshot s : SnapshotUtil.currentAncestors(t)) {
      String value = s.summary().get(key);
      if (value != null) {
        return value;
      }
    }
    return null;
  }

  /** The current snapshot's summary (empty map when the table has no snapshot). */
  public static Map<String, String> currentSummary(SparkSession spark, String table) throws Exception {
    Table t = Spark3Util.loadIcebergTable(spark, table);
    t.refresh();
    Snapshot s = t.currentSnapshot();
    return s == null ? java.util.Collections.emptyMap() : s.summary();
  }
}
