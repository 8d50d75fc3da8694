package lakestream.fs;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;
import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.io.nativeio.NativeIO;

/**
 * Hadoop's local file system ({@code file:}, with its checksum files) that sets a permission without starting a
 * process. Without Hadoop's native library (pyspark's wheel ships none) {@code RawLocalFileSystem.setPermission}
 * runs {@code chmod} for every file and directory it creates: a fork of the driver's JVM and a thread to read the
 * child's output, about a dozen per Iceberg commit (manifests, the manifest list, the metadata file, deletion
 * vectors, and each one's {@code .crc}). java.nio sets the same bits with one system call. Registered as
 * {@code fs.file.impl} by {@code lakestream.spark}; with the native library loaded, for a bit java.nio cannot set
 * (sticky) or on a file system without POSIX attributes, Hadoop's own path runs.
 */
public class LocalFileSystemNoFork extends LocalFileSystem {
  public LocalFileSystemNoFork() {
    super(new Raw());
  }

  /** The raw file system underneath: Hadoop's, but for {@link #setPermission}. */
  public static class Raw extends RawLocalFileSystem {
    @Override
    public void setPermission(Path p, FsPermission permission) throws IOException {
      short mode = permission.toShort();
      if (NativeIO.isAvailable() || (mode & ~0777) != 0) {
        super.setPermission(p, permission);
        return;
      }
      try {
        Files.setPosixFilePermissions(pathToFile(p).toPath(), posix(mode));
      } catch (UnsupportedOperationException notPosix) {
        super.setPermission(p, permission); // a mount without POSIX attributes: Hadoop's way
      }
    }
  }

  private static final PosixFilePermission[] BITS = {
    PosixFilePermission.OTHERS_EXECUTE, PosixFilePermission.OTHERS_WRITE, PosixFilePermission.OTHERS_READ,
    PosixFilePermission.GROUP_EXECUTE, PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_READ,
    PosixFilePermission.OWNER_EXECUTE, PosixFilePermission.OWNER_WRITE, PosixFilePermission.OWNER_READ,
  };

  static Set<PosixFilePermission> posix(short mode) {
    Set<PosixFilePermission> out = EnumSet.noneOf(PosixFilePermission.class);
    for (int bit = 0; bit < BITS.length; bit++) {
      if ((mode & (1 << bit)) != 0) {
        out.add(BITS[bit]);
      }
    }
    return out;
  }
}
