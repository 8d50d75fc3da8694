package lakestream.rest;

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import com.sun.net.httpserver.HttpsConfigurator;
import com.sun.net.httpserver.HttpsServer;
import java.io.FileInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.security.KeyStore;
import java.security.MessageDigest;
import java.security.SecureRandom;
import java.util.Base64;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.Executors;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import javax.net.ssl.KeyManagerFactory;
import javax.net.ssl.SSLContext;
import org.apache.hadoop.conf.Configuration;
import org.apache.iceberg.CatalogUtil;
import org.apache.iceberg.catalog.Catalog;
import org.apache.iceberg.catalog.Namespace;
import org.apache.iceberg.catalog.SupportsNamespaces;
import org.apache.iceberg.catalog.TableIdentifier;
import org.apache.iceberg.exceptions.AlreadyExistsException;
import org.apache.iceberg.exceptions.CommitFailedException;
import org.apache.iceberg.exceptions.CommitStateUnknownException;
import org.apache.iceberg.exceptions.ForbiddenException;
import org.apache.iceberg.exceptions.NamespaceNotEmptyException;
import org.apache.iceberg.exceptions.NoSuchNamespaceException;
import org.apache.iceberg.exceptions.NoSuchTableException;
import org.apache.iceberg.exceptions.NotAuthorizedException;
import org.apache.iceberg.exceptions.ValidationException;
import org.apache.iceberg.rest.CatalogHandlers;
import org.apache.iceberg.rest.Endpoint;
import org.apache.iceberg.rest.RESTCatalogProperties.SnapshotMode;
import org.apache.iceberg.rest.LakestreamRestMapper;
import org.apache.iceberg.rest.RESTUtil;
import org.apache.iceberg.rest.requests.CreateNamespaceRequest;
import org.apache.iceberg.rest.requests.CreateTableRequest;
import org.apache.iceberg.rest.requests.RegisterTableRequest;
import org.apache.iceberg.rest.requests.RenameTableRequest;
import org.apache.iceberg.rest.requests.UpdateNamespacePropertiesRequest;
import org.apache.iceberg.rest.requests.UpdateTableRequest;
import org.apache.iceberg.rest.responses.ConfigResponse;
import org.apache.iceberg.rest.responses.ErrorResponse;
import org.apache.iceberg.rest.responses.LoadTableResponse;
import org.apache.iceberg.rest.responses.OAuthTokenResponse;
import org.apache.iceberg.shaded.com.fasterxml.jackson.databind.ObjectMapper;

/**
 * A small Iceberg REST catalog server for tests and the local stack: the REST protocol's routes
 * mapped onto Iceberg's own request handlers ({@link CatalogHandlers}, the code real servers build
 * on) over any Iceberg catalog (here a JDBC catalog on PostgreSQL), served by the JDK's HTTP server.
 * Spark's RESTCatalog, the Java committer and pyiceberg's RestCatalog talk to it as to Polaris or
 * Lakekeeper; table commits go through {@code CatalogHandlers.updateTable}, which checks the
 * request's requirements (e.g. the branch's current snapshot) and applies its updates atomically.
 *
 * <p>Settings come from a properties file (argument 1): {@code server.host}, {@code server.port};
 * {@code server.credential} = {@code client_id:client_secret} turns on OAuth2 (client credentials at
 * {@code /v1/oauth/tokens}, then a bearer token on every request); {@code server.token} accepts one
 * static bearer token; {@code server.vend.<key>} are FileIO properties (storage credentials) added to
 * a table's config when the client asks for vended credentials; {@code server.tls.keystore} (a PKCS12
 * file) and {@code server.tls.keystore-password} serve HTTPS instead of HTTP; {@code catalog.<key>}
 * configure the backing catalog ({@code catalog.name}, {@code catalog.catalog-impl}, {@code catalog.uri}, ...).
 *
 * <p>Not implemented (not used by lakestream's clients): views, multi-table transactions, scan
 * planning, pagination beyond what CatalogHandlers does.
 */
public final class RestCatalogServer {
  // The REST spec's multi-level namespace separator (0x1F, URL-encoded), as clients send it by default.
  private static final String NAMESPACE_SEPARATOR = "%1F";
  private static final String DELEGATION_HEADER = "X-Iceberg-Access-Delegation";
  private static final Pattern NAMESPACE = Pattern.compile("^/v1/namespaces/([^/]+)$");
  private static final Pattern NAMESPACE_PROPERTIES = Pattern.compile("^/v1/namespaces/([^/]+)/properties$");
  private static final Pattern TABLES = Pattern.compile("^/v1/namespaces/([^/]+)/tables$");
  private static final Pattern REGISTER = Pattern.compile("^/v1/namespaces/([^/]+)/register$");
  private static final Pattern TABLE = Pattern.compile("^/v1/namespaces/([^/]+)/tables/([^/]+)$");
  private static final Pattern METRICS = Pattern.compile("^/v1/namespaces/([^/]+)/tables/([^/]+)/metrics$");

  private static final List<Endpoint> ENDPOINTS = List.of(
      Endpoint.V1_LIST_NAMESPACES, Endpoint.V1_LOAD_NAMESPACE, Endpoint.V1_NAMESPACE_EXISTS,
      Endpoint.V1_CREATE_NAMESPACE, Endpoint.V1_UPDATE_NAMESPACE, Endpoint.V1_DELETE_NAMESPACE,
      Endpoint.V1_LIST_TABLES, Endpoint.V1_LOAD_TABLE, Endpoint.V1_TABLE_EXISTS, Endpoint.V1_CREATE_TABLE,
      Endpoint.V1_UPDATE_TABLE, Endpoint.V1_DELETE_TABLE, Endpoint.V1_RENAME_TABLE, Endpoint.V1_REGISTER_TABLE,
      Endpoint.V1_REPORT_METRICS);

  private final Catalog catalog;
  private final SupportsNamespaces namespaces;
  private final ObjectMapper mapper = LakestreamRestMapper.mapper();
  private final String credential;
  private final String staticToken;
  private final String issuedToken;
  private final Map<String, String> vended;

  private RestCatalogServer(Properties props) {
    Map<String, String> catalogProps = new HashMap<>();
    Map<String, String> vend = new HashMap<>();
    for (String key : props.stringPropertyNames()) {
      if (key.startsWith("catalog.") && !key.equals("catalog.name")) {
        catalogProps.put(key.substring("catalog.".length()), props.getProperty(key));
      } else if (key.startsWith("server.vend.")) {
        vend.put(key.substring("server.vend.".length()), props.getProperty(key));
      }
    }
    this.catalog = CatalogUtil.buildIcebergCatalog(
        props.getProperty("catalog.name", "rest_backend"), catalogProps, new Configuration());
    this.namespaces = (SupportsNamespaces) catalog;
    this.credential = props.getProperty("server.credential");
    this.staticToken = props.getProperty("server.token");
    byte[] random = new byte[24];
    new SecureRandom().nextBytes(random);
    this.issuedToken = Base64.getUrlEncoder().withoutPadding().encodeToString(random);
    this.vended = vend;
  }

  public static void main(String[] args) throws Exception {
    Properties props = new Properties();
    try (InputStream in = new FileInputStream(args[0])) {
      props.load(in);
    }
    RestCatalogServer server = new RestCatalogServer(props);
    String host = props.getProperty("server.host", "127.0.0.1");
    int port = Integer.parseInt(props.getProperty("server.port", "8181"));
    String keystore = props.getProperty("server.tls.keystore");
    HttpServer http;
    if (keystore != null) {
      HttpsServer https = HttpsServer.create(new InetSocketAddress(host, port), 64);
      https.setHttpsConfigurator(new HttpsConfigurator(tlsContext(keystore,
          props.getProperty("server.tls.keystore-password", "").toCharArray())));
      http = https;
    } else {
      http = HttpServer.create(new InetSocketAddress(host, port), 64);
    }
    http.createContext("/", server::serve);
    http.setExecutor(Executors.newFixedThreadPool(8));
    http.start();
    System.err.println("lakestream REST catalog listening on " + (keystore != null ? "https" : "http") + "://"
        + host + ":" + port);
  }

  /** The server's TLS context: its key and certificate from a PKCS12 key store. */
  private static SSLContext tlsContext(String keystore, char[] password) throws Exception {
    KeyStore ks = KeyStore.getInstance("PKCS12");
    try (InputStream in = new FileInputStream(keystore)) {
      ks.load(in, password);
    }
    KeyManagerFactory kmf = KeyManagerFactory.getInstance(KeyManagerFactory.getDefaultAlgorithm());
    kmf.init(ks, password);
    SSLContext context = SSLContext.getInstance("TLS");
    context.init(kmf.getKeyManagers(), null, null);
    return context;
  }

  private void serve(HttpExchange exchange) throws IOException {
    try {
      String method = exchange.getRequestMethod();
      String path = exchange.getRequestURI().getRawPath();
      if (path.equals("/v1/oauth/tokens") && method.equals("POST")) {
        tokens(exchange);
        return;
      }
      if (!authorized(exchange)) {
        error(exchange, 401, "NotAuthorizedException", "missing or invalid bearer token");
        return;
      }
      Object response = route(exchange, method, path);
      if (response == null) {
        respond(exchange, 204, null);
      } else {
        respond(exchange, 200, response);
      }
    } catch (NoSuchNamespaceException | NoSuchTableException e) {
      error(exchange, 404, e.getClass().getSimpleName(), e.getMessage());
    } catch (AlreadyExistsException | NamespaceNotEmptyException | CommitFailedException e) {
      error(exchange, 409, e.getClass().getSimpleName(), e.getMessage());
    } catch (ValidationException | IllegalArgumentException e) {
      error(exchange, 400, e.getClass().getSimpleName(), e.getMessage());
    } catch (NotAuthorizedException e) {
      error(exchange, 401, e.getClass().getSimpleName(), e.getMessage());
    } catch (ForbiddenException e) {
      error(exchange, 403, e.getClass().getSimpleName(), e.getMessage());
    } catch (UnsupportedOperationException e) {
      error(exchange, 406, e.getClass().getSimpleName(), e.getMessage());
    } catch (CommitStateUnknownException e) {
      // The client treats a 5xx of a commit as "state unknown" and checks the table before retrying.
      error(exchange, 500, e.getClass().getSimpleName(), e.getMessage());
    } catch (RuntimeException e) {
      // The backing catalog's database away: a 503 the client retries, like a real server's.
      error(exchange, 503, e.getClass().getSimpleName(), String.valueOf(e.getMessage()));
    } finally {
      exchange.close();
    }
  }

  private Object route(HttpExchange exchange, String method, String path) throws IOException {
    Map<String, String> query = query(exchange);
    Matcher m;
    if (path.equals("/v1/config") && method.equals("GET")) {
      // The routes this server serves: a client asks for nothing else (Trino looks a name up as a view
      // first, and takes a view route the server does not list as "no such view").
      return ConfigResponse.builder().withEndpoints(ENDPOINTS).build();
    }
    if (path.equals("/v1/namespaces")) {
      if (method.equals("GET")) {
        Namespace parent = query.containsKey("parent") ? RESTUtil.decodeNamespace(query.get("parent"), NAMESPACE_SEPARATOR) : Namespace.empty();
        return query.containsKey("pageSize")
            ? CatalogHandlers.listNamespaces(namespaces, parent, query.get("pageToken"), query.get("pageSize"))
            : CatalogHandlers.listNamespaces(namespaces, parent);
      }
      if (method.equals("POST")) {
        return CatalogHandlers.createNamespace(namespaces, read(exchange, CreateNamespaceRequest.class));
      }
    }
    if (path.equals("/v1/tables/rename") && method.equals("POST")) {
      CatalogHandlers.renameTable(catalog, read(exchange, RenameTableRequest.class));
      return null;
    }
    if ((m = NAMESPACE.matcher(path)).matches()) {
      Namespace ns = RESTUtil.decodeNamespace(m.group(1), NAMESPACE_SEPARATOR);
      switch (method) {
        case "GET":
          return CatalogHandlers.loadNamespace(namespaces, ns);
        case "HEAD":
          CatalogHandlers.namespaceExists(namespaces, ns);
          return null;
        case "DELETE":
          CatalogHandlers.dropNamespace(namespaces, ns);
          return null;
        default:
          break;
      }
    }
    if ((m = NAMESPACE_PROPERTIES.matcher(path)).matches() && method.equals("POST")) {
      Namespace ns = RESTUtil.decodeNamespace(m.group(1), NAMESPACE_SEPARATOR);
      return CatalogHandlers.updateNamespaceProperties(namespaces, ns, read(exchange, UpdateNamespacePropertiesRequest.class));
    }
    if ((m = TABLES.matcher(path)).matches()) {
      Namespace ns = RESTUtil.decodeNamespace(m.group(1), NAMESPACE_SEPARATOR);
      if (method.equals("GET")) {
        return query.containsKey("pageSize")
            ? CatalogHandlers.listTables(catalog, ns, query.get("pageToken"), query.get("pageSize"))
            : CatalogHandlers.listTables(catalog, ns);
      }
      if (method.equals("POST")) {
        CreateTableRequest request = read(exchange, CreateTableRequest.class);
        LoadTableResponse created = request.stageCreate()
            ? CatalogHandlers.stageTableCreate(catalog, ns, request)
            : CatalogHandlers.createTable(catalog, ns, request);
        return withVended(exchange, created);
      }
    }
    if ((m = REGISTER.matcher(path)).matches() && method.equals("POST")) {
      Namespace ns = RESTUtil.decodeNamespace(m.group(1), NAMESPACE_SEPARATOR);
      return withVended(exchange, CatalogHandlers.registerTable(catalog, ns, read(exchange, RegisterTableRequest.class)));
    }
    if ((m = METRICS.matcher(path)).matches() && method.equals("POST")) {
      drain(exchange);
      return null;
    }
    if ((m = TABLE.matcher(path)).matches()) {
      TableIdentifier ident = TableIdentifier.of(RESTUtil.decodeNamespace(m.group(1), NAMESPACE_SEPARATOR), decode(m.group(2)));
      switch (method) {
        case "GET":
          // ?snapshots=refs asks for the snapshots that refs point to only; all of them otherwise (the spec's default).
          SnapshotMode mode = "refs".equalsIgnoreCase(query.get("snapshots")) ? SnapshotMode.REFS : SnapshotMode.ALL;
          return withVended(exchange, CatalogHandlers.loadTable(catalog, ident, mode));
        case "HEAD":
          CatalogHandlers.tableExists(catalog, ident);
          return null;
        case "POST":
          // The commit: requirements (assert-ref-snapshot-id, assert-table-uuid, ...) are checked
          // against the current metadata and the updates applied in one catalog commit, or 409.
          return withVended(exchange, CatalogHandlers.updateTable(catalog, ident, read(exchange, UpdateTableRequest.class)));
        case "DELETE":
          if (Boolean.parseBoolean(query.getOrDefault("purgeRequested", "false"))) {
            CatalogHandlers.purgeTable(catalog, ident);
          } else {
            CatalogHandlers.dropTable(catalog, ident);
          }
          return null;
        default:
          break;
      }
    }
    throw new UnsupportedOperationException("no route for " + method + " " + path);
  }

  /** OAuth2 client credentials grant: a valid client_id:client_secret gets this server's token. */
  private void tokens(HttpExchange exchange) throws IOException {
    String body = new String(exchange.getRequestBody().readAllBytes(), StandardCharsets.UTF_8);
    Map<String, String> form = RESTUtil.decodeFormData(body);
    String presented = form.getOrDefault("client_id", "") + ":" + form.getOrDefault("client_secret", "");
    if (credential == null || !constantTimeEquals(credential, presented)) {
      respondRaw(exchange, 401, "{\"error\":\"invalid_client\",\"error_description\":\"unknown client credentials\"}");
      return;
    }
    respond(exchange, 200, OAuthTokenResponse.builder()
        .withToken(issuedToken)
        .withTokenType("bearer")
        .withIssuedTokenType("urn:ietf:params:oauth:token-type:access_token")
        .setExpirationInSeconds(3600)
        .build());
  }

  private boolean authorized(HttpExchange exchange) {
    if (credential == null && staticToken == null) {
      return true;
    }
    String header = exchange.getRequestHeaders().getFirst("Authorization");
    if (header == null || !header.startsWith("Bearer ")) {
      return false;
    }
    String token = header.substring("Bearer ".length()).trim();
    return (credential != null && constantTimeEquals(issuedToken, token))
        || (staticToken != null && constantTimeEquals(staticToken, token));
  }

  private LoadTableResponse withVended(HttpExchange exchange, LoadTableResponse response) {
    String delegation = exchange.getRequestHeaders().getFirst(DELEGATION_HEADER);
    if (vended.isEmpty() || delegation == null || !delegation.contains("vended-credentials")) {
      return response;
    }
    return LoadTableResponse.builder()
        .withTableMetadata(response.tableMetadata())
        .addAllConfig(response.config())
        .addAllConfig(vended)
        .build();
  }

  private <T> T read(HttpExchange exchange, Class<T> type) throws IOException {
    try (InputStream in = exchange.getRequestBody()) {
      return mapper.readValue(in, type);
    }
  }

  private static void drain(HttpExchange exchange) throws IOException {
    try (InputStream in = exchange.getRequestBody()) {
      in.readAllBytes();
    }
  }

  private void respond(HttpExchange exchange, int status, Object body) throws IOException {
    respondRaw(exchange, status, body == null ? null : mapper.writeValueAsString(body));
  }

  private static void respondRaw(HttpExchange exchange, int status, String json) throws IOException {
    if (json == null || exchange.getRequestMethod().equals("HEAD")) {
      exchange.sendResponseHeaders(status == 200 ? 204 : status, -1);
      return;
    }
    byte[] bytes = json.getBytes(StandardCharsets.UTF_8);
    exchange.getResponseHeaders().set("Content-Type", "application/json");
    exchange.sendResponseHeaders(status, bytes.length);
    try (OutputStream out = exchange.getResponseBody()) {
      out.write(bytes);
    }
  }

  private void error(HttpExchange exchange, int code, String type, String message) throws IOException {
    ErrorResponse body = ErrorResponse.builder().responseCode(code).withType(type).withMessage(message).build();
    if (exchange.getRequestMethod().equals("HEAD")) {
      exchange.sendResponseHeaders(code, -1);
      return;
    }
    respondRaw(exchange, code, mapper.writeValueAsString(body));
  }

  private static Map<String, String> query(HttpExchange exchange) {
    Map<String, String> out = new HashMap<>();
    String raw = exchange.getRequestURI().getRawQuery();
    if (raw == null || raw.isEmpty()) {
      return out;
    }
    for (String pair : raw.split("&")) {
      int eq = pair.indexOf('=');
      String key = decode(eq < 0 ? pair : pair.substring(0, eq));
      out.put(key, eq < 0 ? "" : decode(pair.substring(eq + 1)));
    }
    return out;
  }

  private static String decode(String raw) {
    return URLDecoder.decode(raw, StandardCharsets.UTF_8);
  }

  private static boolean constantTimeEquals(String a, String b) {
    return MessageDigest.isEqual(a.getBytes(StandardCharsets.UTF_8), b.getBytes(StandardCharsets.UTF_8));
  }
}
