package lakestream.trino;

import java.lang.reflect.InvocationTargetException;

/**
 * Starts a Trino server assembled from Trino's modules: what the unpublished trino-server-main's {@code TrinoServer}
 * does, {@code new io.trino.server.Server().start(version)} with trino-main's version. Reflection keeps this class free
 * of a compile-time dependency on trino-main, whose classes are built for a newer Java than the JDK that compiles
 * Lakestream's helpers.
 */
public final class LakestreamTrinoServer {
    private LakestreamTrinoServer() {}

    public static void main(String[] args) throws Throwable {
        Class<?> server = Class.forName("io.trino.server.Server");
        String version = server.getPackage().getImplementationVersion();
        Object instance = server.getConstructor().newInstance();
        try {
            server.getMethod("start", String.class).invoke(instance, version == null ? "unknown" : version);
        } catch (InvocationTargetException e) {
            throw e.getCause();
        }
    }
}
