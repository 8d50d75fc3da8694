package software.amazon.awssdk.services.sts.model;

import java.util.Objects;
import software.amazon.awssdk.utils.builder.SdkBuilder;

/**
 * Stand-in for the AWS SDK v2 STS model class of the same name (module {@code sts}, absent from the
 * wheels). Iceberg's {@code AwsProperties} builds a set of these (the assume-role session tags,
 * usually none) in every {@code S3FileIO}. Assuming a role still needs the real STS module: a
 * real SDK or {@code iceberg-aws-bundle} on the class path replaces this class.
 */
public final class Tag {
  private final String key;
  private final String value;

  private Tag(String key, String value) {
    this.key = key;
    this.value = value;
  }

  public String key() {
    return key;
  }

  public String value() {
    return value;
  }

  public static Builder builder() {
    return new BuilderImpl();
  }

  @Override
  public boolean equals(Object other) {
    return other instanceof Tag && Objects.equals(key, ((Tag) other).key) && Objects.equals(value, ((Tag) other).value);
  }

  @Override
  public int hashCode() {
    return Objects.hash(key, value);
  }

  @Override
  public String toString() {
    return "Tag(Key=" + key + ", Value=" + value + ")";
  }

  /** The SDK's builder shape: {@code build()} comes from {@link SdkBuilder}, as in the real class. */
  public interface Builder extends SdkBuilder<Builder, Tag> {
    Builder key(String key);

    Builder value(String value);
  }

  private static final class BuilderImpl implements Builder {
    private String key;
    private String value;

    @Override
    public Builder key(String key) {
      this.key = key;
      return this;
    }

    @Override
    public Builder value(String value) {
      this.value = value;
      return this;
    }

    @Override
    public Tag build() {
      return new Tag(key, value);
    }
  }
}
