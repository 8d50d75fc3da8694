package lakestream;

import java.io.FileInputStream;
import java.io.InputStream;
import java.security.KeyStore;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.util.Collection;
import java.util.Map;
import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManagerFactory;
import org.apache.iceberg.rest.auth.TLSConfigurer;

/**
 * TLS for an https REST catalog that the JVM's default trust store does not cover (a private CA): the
 * REST client trusts the certificates of the PEM bundle named by the catalog property
 * {@code lakestream.ssl-ca-bundle} ({@code catalog.ssl_ca_bundle} in the config), as pyiceberg does with
 * {@code ssl.cabundle}. Plugged in with {@code rest.client.tls.configurer-impl}; without the property
 * the JVM's defaults apply.
 */
public class LakestreamTlsConfigurer implements TLSConfigurer {
  public static final String CA_BUNDLE = "lakestream.ssl-ca-bundle";

  private SSLContext context;

  @Override
  public void initialize(Map<String, String> properties) {
    String bundle = properties.get(CA_BUNDLE);
    if (bundle == null || bundle.isEmpty()) {
      return;
    }
    try (InputStream in = new FileInputStream(bundle)) {
      Collection<? extends Certificate> certs = CertificateFactory.getInstance("X.509").generateCertificates(in);
      if (certs.isEmpty()) {
        throw new IllegalArgumentException("catalog.ssl_ca_bundle " + bundle + " holds no PEM certificate");
      }
      KeyStore trusted = KeyStore.getInstance(KeyStore.getDefaultType());
      trusted.load(null, null);
      int i = 0;
      for (Certificate cert : certs) {
        trusted.setCertificateEntry("ca-" + i++, cert);
      }
      TrustManagerFactory tmf = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
      tmf.init(trusted);
      SSLContext ctx = SSLContext.getInstance("TLS");
      ctx.init(null, tmf.getTrustManagers(), null);
      this.context = ctx;
    } catch (IllegalArgumentException e) {
      throw e;
    } catch (Exception e) {
      throw new IllegalArgumentException("catalog.ssl_ca_bundle " + bundle + " cannot be read as PEM certificates: "
          + e, e);
    }
  }

  @Override
  public SSLContext sslContext() {
    return context != null ? context : TLSConfigurer.super.sslContext();
  }
}
