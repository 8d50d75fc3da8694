package org.apache.iceberg.rest;

import org.apache.iceberg.shaded.com.fasterxml.jackson.databind.ObjectMapper;

/**
 * Iceberg's own REST JSON mapper (package-private in the runtime jar), so that the test REST catalog
 * server reads and writes exactly the JSON Iceberg's clients do. Iceberg's REST test fixture lives
 * in this package for the same reason.
 */
public final class LakestreamRestMapper {
  private LakestreamRestMapper() {}

  public static ObjectMapper mapper() {
    return RESTObjectMapper.mapper();
  }
}
