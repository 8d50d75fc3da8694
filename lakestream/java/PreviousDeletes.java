package lakestream;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collection;
import java.util.Comparator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import org.apache.iceberg.DeleteFile;
import org.apache.iceberg.Table;
import org.apache.iceberg.data.BaseDeleteLoader;
import org.apache.iceberg.deletes.PositionDeleteIndex;
import org.apache.iceberg.io.InputFile;
import org.apache.iceberg.io.SeekableInputStream;
import org.apache.iceberg.util.ContentFileUtil;
import org.apache.iceberg.util.Tasks;
import org.apache.iceberg.util.ThreadPools;

/**
 * The deletes already applied to the data files a commit deletes rows from, read before the commit writes
 * their new deletion vectors (each new DV holds the old positions too, and replaces the old DV).
 *
 * <p>Why not Iceberg's {@code BaseDeleteLoader} per file, inside {@code BaseDVFileWriter}'s callback: that opens
 * the DV's Puffin file once per data file, one after the other. A batch of random-key changes on a table of many
 * small files touches thousands of data files, and their DVs sit in a few Puffin files (one per earlier commit,
 * each holding the DVs of every file that commit touched). Here each Puffin file is opened once, the blobs it
 * holds for this commit are read in a few ranged reads (blobs closer than {@link #MAX_GAP} share one read), and
 * the Puffin files are read in parallel on Iceberg's worker pool. v2 position delete files (a table upgraded to
 * v3) still go through Iceberg's loader.
 */
final class PreviousDeletes {
  /** Blobs closer than this share one read: reading a gap costs less than another request to a store. */
  static final int MAX_GAP = 1 << 20;

  /** One read never covers more than this (a blob larger than it is read alone). */
  static final int MAX_READ = 16 << 20;

  private PreviousDeletes() {}

  /**
   * For each of {@code dataFiles} that has deletes in {@code live} (data file → its live delete files), the
   * positions they delete, as an index that names those delete files (so the DV writer removes them).
   */
  static Map<String, PositionDeleteIndex> load(
      Table table, Map<String, List<DeleteFile>> live, Collection<String> dataFiles) {
    return load(table, live, dataFiles, ThreadPools.getWorkerPool());
  }

  /** As {@link #load(Table, Map, Collection)}, reading on {@code pool} (null: one file after another, here). */
  static Map<String, PositionDeleteIndex> load(
      Table table, Map<String, List<DeleteFile>> live, Collection<String> dataFiles, ExecutorService pool) {
    Map<String, List<DeleteFile>> dvsByPuffin = new LinkedHashMap<>();
    List<String> positionDeleteFiles = new ArrayList<>();
    for (String path : dataFiles) {
      List<DeleteFile> deletes = live.get(path);
      if (deletes == null || deletes.isEmpty()) {
        continue;
      }
      if (ContentFileUtil.containsSingleDV(deletes)) {
        DeleteFile dv = deletes.get(0);
        if (!path.equals(dv.referencedDataFile()) || dv.contentOffset() == null || dv.contentSizeInBytes() == null) {
          throw new IllegalStateException("DV " + ContentFileUtil.dvDesc(dv) + " cannot be read for data file " + path);
        }
        dvsByPuffin.computeIfAbsent(dv.location(), p -> new ArrayList<>()).add(dv);
      } else {
        positionDeleteFiles.add(path);
      }
    }
    Map<String, PositionDeleteIndex> out = new ConcurrentHashMap<>();
    List<List<DeleteFile>> groups = new ArrayList<>(dvsByPuffin.values());
    Tasks.foreach(groups)
        .stopOnFailure()
        .throwFailureWhenFinished()
        .executeWith(groups.size() > 1 ? pool : null)
        .run(group -> readPuffin(table, group, out));
    if (!positionDeleteFiles.isEmpty()) {
      BaseDeleteLoader loader = new BaseDeleteLoader(d -> table.io().newInputFile(d));
      Tasks.foreach(positionDeleteFiles)
          .stopOnFailure()
          .throwFailureWhenFinished()
          .executeWith(positionDeleteFiles.size() > 1 ? pool : null)
          .run(path -> out.put(path, loader.loadPositionDeletes(live.get(path), path)));
    }
    return out;
  }

  /** The DVs of one Puffin file, sharing reads between nearby blobs. */
  private static void readPuffin(Table table, List<DeleteFile> dvs, Map<String, PositionDeleteIndex> out) {
    dvs.sort(Comparator.comparingLong(DeleteFile::contentOffset));
    InputFile file = table.io().newInputFile(dvs.get(0));
    try (SeekableInputStream in = file.newStream()) {
      int first = 0;
      while (first < dvs.size()) {
        long start = dvs.get(first).contentOffset();
        long end = blobEnd(dvs.get(first));
        int last = first;
        while (last + 1 < dvs.size()) {
          DeleteFile next = dvs.get(last + 1);
          long nextEnd = Math.max(end, blobEnd(next));
          if (next.contentOffset() - end > MAX_GAP || nextEnd - start > MAX_READ) {
            break;
          }
          end = nextEnd;
          last++;
        }
        byte[] bytes = new byte[Math.toIntExact(end - start)];
        in.seek(start);
        readFully(in, bytes);
        for (int i = first; i <= last; i++) {
          DeleteFile dv = dvs.get(i);
          int from = Math.toIntExact(dv.contentOffset() - start);
          byte[] blob = Arrays.copyOfRange(bytes, from, from + Math.toIntExact(dv.contentSizeInBytes()));
          out.put(dv.referencedDataFile(), PositionDeleteIndex.deserialize(blob, dv));
        }
        first = last + 1;
      }
    } catch (IOException e) {
      throw new UncheckedIOException("reading deletion vectors from " + file.location(), e);
    }
  }

  private static long blobEnd(DeleteFile dv) {
    return dv.contentOffset() + dv.contentSizeInBytes();
  }

  private static void readFully(SeekableInputStream in, byte[] bytes) throws IOException {
    int done = 0;
    while (done < bytes.length) {
      int n = in.read(bytes, done, bytes.length - done);
      if (n < 0) {
        throw new IOException("end of file after " + done + " of " + bytes.length + " bytes");
      }
      done += n;
    }
  }
}
