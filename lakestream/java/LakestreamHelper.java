package lakestream;

import java.util.Map;
import org.apache.iceberg.Snapshot;
import org.apache.iceberg.Table;
import org.apache.iceberg.catalog.Catalog;
import org.apache.iceberg.catalog.Namespace;
import org.apache.iceberg.catalog.TableIdentifier;
import org.apache.iceberg.exceptions.NoSuchNamespaceException;
import org.apache.iceberg.exceptions.NoSuchTableException;
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

  /**
   * The largest numeric value of summary property {@code key} over every snapshot of every table in
   * {@code namespace} whose summary has {@code filterKey} = {@code filterValue}; -1 when there is none.
   * Walks all snapshots (not only the current ancestry): a rolled-back snapshot still used its number.
   */
  public static long maxSummaryLong(
      SparkSession spark, String catalog, String namespace, String key, String filterKey, String filterValue) {
    Catalog cat = Spark3Util.loadIcebergCatalog(spark, catalog);
    long max = -1;
    java.util.List<TableIdentifier> tables;
    try {
      tables = cat.listTables(Namespace.of(namespace));
    } catch (NoSuchNamespaceException e) {
      return max;
    }
    for (TableIdentifier id : tables) {
      Table t;
      try {
        t = cat.loadTable(id);
      } catch (NoSuchTableException e) {
        continue; // dropped while listing
      }
      for (Snapshot s : t.snapshots()) {
        Map<String, String> summary = s.summary();
        String value = summary.get(key);
        if (value == null || !filterValue.equals(summary.get(filterKey))) {
          continue;
        }
        try {
          max = Math.max(max, Long.parseLong(value));
        } catch (NumberFormatException e) {
          // written by something else: not a batch number
        }
      }
    }
    return max;
  }
}
