package software.amazon.awssdk.services.kms.model;

/**
 * Stand-in for the AWS SDK v2 KMS enum of the same name (module {@code kms}, which no reachable
 * wheel ships). Iceberg's {@code AwsProperties} reads its default while every {@code S3FileIO}
 * initializes, even when no KMS encryption is configured. Only the values and {@code fromValue}
 * that {@code AwsProperties} touches; KMS itself stays unavailable (a real SDK or
 * {@code iceberg-aws-bundle} on the class path replaces this class; see docs/design/storage.md).
 */
public enum EncryptionAlgorithmSpec {
  SYMMETRIC_DEFAULT("SYMMETRIC_DEFAULT"),
  RSAES_OAEP_SHA_1("RSAES_OAEP_SHA_1"),
  RSAES_OAEP_SHA_256("RSAES_OAEP_SHA_256"),
  SM2_PKE("SM2PKE"),
  UNKNOWN_TO_SDK_VERSION(null);

  private final String value;

  EncryptionAlgorithmSpec(String value) {
    this.value = value;
  }

  @Override
  public String toString() {
    return String.valueOf(value);
  }

  public static EncryptionAlgorithmSpec fromValue(String value) {
    if (value == null) {
      return null;
    }
    for (EncryptionAlgorithmSpec spec : values()) {
      if (value.equals(spec.value)) {
        return spec;
      }
    }
    return UNKNOWN_TO_SDK_VERSION;
  }
}
