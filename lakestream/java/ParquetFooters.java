package lakestream;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.stream.Stream;
import org.apache.iceberg.Metrics;
import org.apache.iceberg.MetricsConfig;
import org.apache.iceberg.parquet.ParquetUtil;
import org.apache.iceberg.shaded.org.apache.parquet.ParquetReadOptions;
import org.apache.iceberg.shaded.org.apache.parquet.conf.PlainParquetConfiguration;
import org.apache.iceberg.shaded.org.apache.parquet.hadoop.ParquetFileReader;
import org.apache.iceberg.shaded.org.apache.parquet.io.DelegatingSeekableInputStream;
import org.apache.iceberg.shaded.org.apache.parquet.io.InputFile;
import org.apache.iceberg.shaded.org.apache.parquet.io.SeekableInputStream;

/**
 * The Iceberg metrics of a Parquet data file, from its footer: what {@code ParquetUtil.fileMetrics} computes,
 * without its cost at every commit.
 *
 * <p>Why not {@code ParquetUtil.fileMetrics}: it opens the file with default read options, which build a new
 * Hadoop {@code Configuration} per file; its first read looks {@code core-default.xml} up in the jars and parses it.
 * That was 22% of the CPU of Iceberg's worker pool in the 100M-row sustained run (a batch commit reads the footer
 * of every data file it adds, a compaction commit those of its outputs). Here the options come from a plain
 * Parquet configuration, built once; footers need nothing from Hadoop.
 */
final class ParquetFooters {
  private static final ParquetReadOptions OPTIONS = ParquetReadOptions.builder(new PlainParquetConfiguration()).build();

  private ParquetFooters() {}

  static Metrics metrics(org.apache.iceberg.io.InputFile file, MetricsConfig metricsConfig) {
    try (ParquetFileReader reader = ParquetFileReader.open(parquetFile(file), OPTIONS)) {
      return ParquetUtil.footerMetrics(reader.getFooter(), Stream.empty(), metricsConfig);
    } catch (IOException e) {
      throw new UncheckedIOException("reading the Parquet footer of " + file.location(), e);
    }
  }

  private static InputFile parquetFile(org.apache.iceberg.io.InputFile file) {
    return new InputFile() {
      @Override
      public long getLength() {
        return file.getLength();
      }

      @Override
      public SeekableInputStream newStream() {
        org.apache.iceberg.io.SeekableInputStream in = file.newStream();
        return new DelegatingSeekableInputStream(in) {
          @Override
          public long getPos() throws IOException {
            return in.getPos();
          }

          @Override
          public void seek(long pos) throws IOException {
            in.seek(pos);
          }
        };
      }
    };
  }
}
