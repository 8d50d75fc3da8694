package lakestream.capture;

import java.io.File;
import java.util.HashSet;
import java.util.Set;

/**
 * The JVM side of {@code lakestream/faults.py}: a named point where capture pauses the first time it is reached
 * when {@code LAKESTREAM_PAUSE_AT} names it ({@code name[:seconds][@file]}, comma-separated, default 60 s; with a
 * file, only once it exists), so a crash test can kill the process exactly there. Inactive otherwise.
 */
final class PausePoints {

  static final String MARKER = "pause point reached:";
  private static final Set<String> PASSED = new HashSet<>();

  private PausePoints() {}

  static void pause(String name) {
    String spec = System.getenv("LAKESTREAM_PAUSE_AT");
    if (spec == null || spec.isEmpty()) {
      return;
    }
    for (String item : spec.split(",")) {
      String[] armed = item.trim().split("@", 2);
      String[] point = armed[0].split(":", 2);
      if (!point[0].equals(name) || (armed.length == 2 && !new File(armed[1]).exists())) {
        continue;
      }
      synchronized (PASSED) {
        if (!PASSED.add(name)) {
          return;
        }
      }
      double seconds = point.length == 2 ? Double.parseDouble(point[1]) : 60.0;
      System.err.println(MARKER + " " + name + " (pausing " + Math.round(seconds) + "s)");
      System.err.flush();
      try {
        Thread.sleep((long) (seconds * 1000));
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
      return;
    }
  }
}
