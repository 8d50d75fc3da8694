package lakestream.capture;

import io.debezium.embedded.KafkaConnectUtil;
import java.io.EOFException;
import java.io.File;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.ObjectInputStream;
import java.io.ObjectOutputStream;
import java.io.StreamCorruptedException;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.HashMap;
import java.util.Map;
import org.apache.kafka.connect.errors.ConnectException;
import org.apache.kafka.connect.runtime.WorkerConfig;
import org.apache.kafka.connect.runtime.standalone.StandaloneConfig;
import org.apache.kafka.connect.storage.FileOffsetBackingStore;

/**
 * Kafka Connect's file offset store, with the file replaced atomically and a damaged file refused.
 *
 * <p>{@link FileOffsetBackingStore#save} truncates the offsets file and writes it in place, and its load treats a
 * file that ends early ({@link EOFException}) as no offsets at all. A process killed inside that write (the engine
 * saves every {@code offset.flush.interval.ms}) left an empty file, and the next start took a new snapshot: rows
 * deleted between the last stored position and that snapshot stayed in the mirrors. Here the offsets go to a
 * temporary file, forced to disk, which then replaces the old one in one rename; a file that cannot be read stops
 * capture with the fix instead of being taken for a first start. Same file format as Kafka's.
 */
public final class AtomicFileOffsetBackingStore extends FileOffsetBackingStore {

  private File file;

  public AtomicFileOffsetBackingStore() {
    super(KafkaConnectUtil.converterForOffsetStore());
  }

  @Override
  public void configure(WorkerConfig config) {
    super.configure(config);
    file = new File(config.getString(StandaloneConfig.OFFSET_STORAGE_FILE_FILENAME_CONFIG));
  }

  @Override
  public synchronized void start() {
    checkReadable(file.toPath());
    super.start();
  }

  /** Throws naming the fix when {@code path} exists but does not hold a whole offsets map. */
  static void checkReadable(Path path) {
    try (InputStream in = Files.newInputStream(path); ObjectInputStream objects = new ObjectInputStream(in)) {
      Object raw = objects.readObject();
      if (!(raw instanceof Map)) {
        throw new StreamCorruptedException("not an offsets map: " + (raw == null ? "null" : raw.getClass()));
      }
    } catch (NoSuchFileException e) {
      // a first start
    } catch (EOFException | StreamCorruptedException | ClassNotFoundException e) {
      throw new ConnectException("capture's offsets file " + path + " is damaged (" + e
          + "): started without it, Debezium would take a new snapshot and the mirrors would keep the rows "
          + "deleted since its last stored position — fix: restore the file from a copy, or remove it and its "
          + "mirrors' tables and capture again from a new snapshot", e);
    } catch (IOException e) {
      throw new ConnectException("cannot read capture's offsets file " + path + ": " + e, e);
    }
  }

  @Override
  protected void save() {
    Path target = file.toPath();
    Path temporary = target.resolveSibling(target.getFileName() + ".tmp");
    Map<byte[], byte[]> raw = new HashMap<>();
    for (Map.Entry<ByteBuffer, ByteBuffer> entry : data.entrySet()) {
      raw.put(entry.getKey() == null ? null : entry.getKey().array(),
          entry.getValue() == null ? null : entry.getValue().array());
    }
    try (FileOutputStream out = new FileOutputStream(temporary.toFile());
        ObjectOutputStream objects = new ObjectOutputStream(out)) {
      objects.writeObject(raw);
      objects.flush();
      out.getFD().sync();
    } catch (IOException e) {
      throw new ConnectException("cannot write capture's offsets to " + temporary + ": " + e, e);
    }
    PausePoints.pause("capture.offsets.written");
    try {
      Files.move(temporary, target, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
    } catch (IOException e) {
      throw new ConnectException("cannot replace capture's offsets file " + target + ": " + e, e);
    }
  }
}
