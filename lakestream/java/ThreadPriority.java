package lakestream;

import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.concurrent.Callable;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.FutureTask;
import java.util.concurrent.TimeUnit;

/**
 * Lowers the scheduling priority of the calling thread (Linux: a thread's nice value is its own, and ends with it).
 * Background work in the pipeline's JVM (snapshot expiry, the orphan scan) shares its CPU with the batches' commits:
 * at nice 10 it gets about a tenth of what a nice-0 thread gets under contention, and all of an idle core. Java has
 * no API for it; the thread's id comes from {@code /proc/thread-self} and util-linux's {@code renice} sets it.
 * Anywhere else (no /proc, no renice, not allowed) the thread keeps its priority.
 */
final class ThreadPriority {
  private ThreadPriority() {}

  /** {@code work} on a thread of its own at nice {@code nice} (the caller's thread keeps its priority). */
  static <T> T call(int nice, Callable<T> work) throws Exception {
    FutureTask<T> task = new FutureTask<>(() -> {
      lower(nice);
      return work.call();
    });
    Thread thread = new Thread(task, "lakestream-background");
    thread.setDaemon(true);
    thread.start();
    try {
      return task.get();
    } catch (ExecutionException e) {
      throw e.getCause() instanceof Exception ? (Exception) e.getCause() : e;
    }
  }

  /** Sets the calling thread's nice value to {@code nice} if that lowers its priority; whether it did. */
  static boolean lower(int nice) {
    Integer now = current();
    if (nice <= 0 || (now != null && now >= nice)) {
      return false;
    }
    try {
      Path self = Files.readSymbolicLink(Paths.get("/proc/thread-self")); // "<pid>/task/<tid>"
      String tid = self.getFileName().toString();
      Process renice = new ProcessBuilder("renice", "-n", Integer.toString(nice), "-p", tid)
          .redirectErrorStream(true).redirectOutput(ProcessBuilder.Redirect.DISCARD).start();
      return renice.waitFor(5, TimeUnit.SECONDS) && renice.exitValue() == 0;
    } catch (Exception e) { // not Linux, no renice: the usual priority
      return false;
    }
  }

  /** The calling thread's nice value as the kernel reports it (field 19 of /proc/thread-self/stat), or null. */
  static Integer current() {
    try {
      String stat = Files.readString(Paths.get("/proc/thread-self/stat"));
      String[] fields = stat.substring(stat.lastIndexOf(')') + 2).split(" ");
      return Integer.parseInt(fields[16]); // fields after the name start at field 3
    } catch (Exception e) {
      return null;
    }
  }
}
