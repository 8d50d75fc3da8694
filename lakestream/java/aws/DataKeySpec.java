package software.amazon.awssdk.services.kms.model;

/**
 * Stand-in for the AWS SDK v2 KMS enum of the same name (module {@code kms}, absent from the
 * wheels): Iceberg's {@code AwsProperties} reads its default in every {@code S3FileIO}. See
 * {@link EncryptionAlgorithmSpec}.
 */
public enum DataKeySpec {
  AES_256("AES_256"),
  AES_128("AES_128"),
  UNKNOWN_TO_SDK_VERSION(null);

  private final String value;

  DataKeySpec(String value) {
    this.value = value;
  }

  @Override
  public String toString() {
    return String.valueOf(value);
  }

  public static DataKeySpec fromValue(String value) {
    if (value == null) {
      return null;
    }
    for (DataKeySpec spec : values()) {
      if (value.equals(spec.value)) {
        return spec;
      }
    }
    return UNKNOWN_TO_SDK_VERSION;
  }
}
