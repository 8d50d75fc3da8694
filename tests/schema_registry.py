"""A small Confluent-compatible Schema Registry for tests (no registry server installs on these machines).

It speaks the subset of Confluent's REST API that Debezium's AvroConverter (Java client 7.0) and
confluent-kafka's ``SchemaRegistryClient`` use, with Confluent's content type and error codes:

- ``POST /subjects/{s}/versions`` registers (the same schema gets the same id, in any subject;
  a schema incompatible with the subject's level is refused with 409), ``POST /subjects/{s}`` looks
  a schema up, ``GET /subjects``, ``GET /subjects/{s}/versions``, ``GET /subjects/{s}/versions/{v|latest}``,
  ``GET /schemas/ids/{id}``;
- ``GET|PUT /config`` and ``/config/{s}`` (compatibility levels),
  ``POST /compatibility/subjects/{s}/versions/{v|latest}`` and ``POST /compatibility/subjects/{s}/versions``
  (against all versions).

Compatibility follows Avro's schema-resolution rules for what the tests exercise: records (fields
added or removed, with or without defaults), optional unions, the primitive promotions (int → long →
float → double, string ↔ bytes), enums, arrays, maps, fixed. Levels NONE, BACKWARD, FORWARD, FULL and
their _TRANSITIVE forms. Not implemented: aliases, schema references, Protobuf and JSON Schema,
modes (READONLY/IMPORT), deletes, contexts. Optional HTTP basic auth (``user_info``).
"""

from __future__ import annotations

import base64
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

import orjson

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
LEVELS = ("NONE", "BACKWARD", "FORWARD", "FULL", "BACKWARD_TRANSITIVE", "FORWARD_TRANSITIVE", "FULL_TRANSITIVE")
_PROMOTIONS = {
    ("int", "long"),
    ("int", "float"),
    ("int", "double"),
    ("long", "float"),
    ("long", "double"),
    ("float", "double"),
    ("string", "bytes"),
    ("bytes", "string"),
}
_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}


class _Names:
    """Named Avro types of one schema, so references can be resolved."""

    def __init__(self, schema: Any):
        self.types: dict[str, dict] = {}
        self._collect(schema, None)

    def _collect(self, schema: Any, namespace: str | None) -> None:
        if isinstance(schema, list):
            for branch in schema:
                self._collect(branch, namespace)
        elif isinstance(schema, dict):
            kind = schema.get("type")
            if kind in ("record", "enum", "fixed"):
                name = schema["name"]
                full = name if "." in name else f"{schema.get('namespace', namespace) or ''}.{name}".lstrip(".")
                self.types[full] = schema
                self.types.setdefault(name.rsplit(".", 1)[-1], schema)
                namespace = full.rpartition(".")[0] or None
                for field in schema.get("fields", []):
                    self._collect(field["type"], namespace)
            elif kind == "array":
                self._collect(schema["items"], namespace)
            elif kind == "map":
                self._collect(schema["values"], namespace)
            elif isinstance(kind, (dict, list)):
                self._collect(kind, namespace)

    def resolve(self, schema: Any) -> Any:
        if isinstance(schema, str) and schema not in _PRIMITIVES:
            found = self.types.get(schema) or self.types.get(schema.rsplit(".", 1)[-1])
            if found is None:
                raise ValueError(f"unknown type {schema!r}")
            return found
        if isinstance(schema, dict) and isinstance(schema.get("type"), (dict, list)):
            return self.resolve(schema["type"])
        if isinstance(schema, dict) and schema.get("type") in _PRIMITIVES:
            return schema["type"]
        return schema


def _kind(schema: Any) -> str:
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, str):
        return schema
    return schema["type"]


def read_problem(
    reader: Any, writer: Any, rnames: _Names, wnames: _Names, path: str = "", seen: set | None = None
) -> str | None:
    """Why data written with ``writer`` cannot be read with ``reader`` (Avro resolution), or None."""
    seen = set() if seen is None else seen
    reader, writer = rnames.resolve(reader), wnames.resolve(writer)
    at = path or "/"
    if isinstance(writer, list):
        for branch in writer:
            problem = read_problem(reader, branch, rnames, wnames, path, seen)
            if problem:
                return problem
        return None
    if isinstance(reader, list):
        if any(read_problem(branch, writer, rnames, wnames, path, seen) is None for branch in reader):
            return None
        return f"{at}: reader union {_describe(reader)} has no branch for writer type {_kind(writer)}"
    rk, wk = _kind(reader), _kind(writer)
    if rk != wk:
        if (wk, rk) in _PROMOTIONS:
            return None
        return f"{at}: reader type {rk} does not match writer type {wk}"
    if rk == "record":
        if reader["name"].rsplit(".", 1)[-1] != writer["name"].rsplit(".", 1)[-1]:
            return f"{at}: record name {reader['name']} does not match {writer['name']}"
        key = (id(reader), id(writer))
        if key in seen:
            return None
        seen.add(key)
        written = {f["name"]: f for f in writer.get("fields", [])}
        for field in reader.get("fields", []):
            if field["name"] in written:
                problem = read_problem(
                    field["type"], written[field["name"]]["type"], rnames, wnames, f"{path}/{field['name']}", seen
                )
                if problem:
                    return problem
            elif "default" not in field:
                return f"{path}/{field['name']}: reader field has no default and the writer lacks it"
        return None
    if rk == "enum":
        missing = set(writer["symbols"]) - set(reader["symbols"])
        if missing and "default" not in reader:
            return f"{at}: enum symbols {sorted(missing)} unknown to the reader"
        return None
    if rk == "fixed":
        return None if reader["size"] == writer["size"] else f"{at}: fixed size {writer['size']} ≠ {reader['size']}"
    if rk == "array":
        return read_problem(reader["items"], writer["items"], rnames, wnames, f"{path}/items", seen)
    if rk == "map":
        return read_problem(reader["values"], writer["values"], rnames, wnames, f"{path}/values", seen)
    return None


def _describe(schema: Any) -> str:
    return "[" + ", ".join(_kind(b) if _kind(b) in _PRIMITIVES else _kind(b) for b in schema) + "]"


def compatibility_problems(level: str, new: Any, earlier: list[Any]) -> list[str]:
    """Messages explaining why ``new`` breaks ``level`` against ``earlier`` (oldest first); [] if compatible."""
    if level == "NONE" or not earlier:
        return []
    against = earlier if level.endswith("_TRANSITIVE") else earlier[-1:]
    base = level.removesuffix("_TRANSITIVE")
    new_names = _Names(new)
    problems = []
    for old in against:
        old_names = _Names(old)
        if base in ("BACKWARD", "FULL"):
            problem = read_problem(new, old, new_names, old_names)
            if problem:
                problems.append(f"BACKWARD: the new schema cannot read data written with an earlier one: {problem}")
        if base in ("FORWARD", "FULL"):
            problem = read_problem(old, new, old_names, new_names)
            if problem:
                problems.append(f"FORWARD: an earlier schema cannot read data written with the new one: {problem}")
    return problems


class _Error(Exception):
    def __init__(self, status: int, code: int, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class RegistryState:
    """Schemas, subjects and compatibility levels, plus a log of requests (for tests to inspect)."""

    def __init__(self, compatibility: str = "BACKWARD"):
        self.lock = threading.Lock()
        self.schemas: dict[int, str] = {}  # id → schema text as first registered
        self.ids: dict[bytes, int] = {}  # canonical schema → id
        self.subjects: dict[str, list[int]] = {}  # subject → ids, version = index + 1
        self.global_level = compatibility
        self.levels: dict[str, str] = {}
        self.requests: list[tuple[str, str]] = []

    def level(self, subject: str) -> str:
        return self.levels.get(subject, self.global_level)


def _canonical(text: str) -> bytes:
    return orjson.dumps(orjson.loads(text), option=orjson.OPT_SORT_KEYS)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, *args: Any) -> None:  # quiet: tests read the request log instead
        pass

    def _send(self, status: int, body: Any) -> None:
        data = orjson.dumps(body)
        self.send_response(status)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = orjson.loads(self.rfile.read(length)) if length else {}
        except orjson.JSONDecodeError:
            raise _Error(400, 400, "malformed JSON body") from None
        if not isinstance(body, dict):
            raise _Error(400, 400, "the body must be a JSON object")
        return body

    def _dispatch(self, method: str) -> None:
        state = self.server.state
        path = urlsplit(self.path).path.rstrip("/")
        state.requests.append((method, path))
        try:
            expected = self.server.user_info
            if expected is not None:
                header = self.headers.get("Authorization", "")
                if header != "Basic " + base64.b64encode(expected.encode()).decode():
                    raise _Error(401, 40101, "Unauthorized")
            parts = [unquote(p) for p in path.split("/")[1:]]
            with state.lock:
                status, body = self._route(method, parts, state)
            self._send(status, body)
        except _Error as exc:
            self._send(exc.status, {"error_code": exc.code, "message": exc.message})

    def do_GET(self) -> None:  # noqa: N802 — http.server's naming
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self._dispatch("PUT")

    def _schema_of(self, body: dict[str, Any]) -> tuple[str, Any]:
        if body.get("schemaType", "AVRO") != "AVRO":
            raise _Error(422, 42201, f"schema type {body['schemaType']} is not supported by this test registry")
        if body.get("references"):
            raise _Error(422, 42201, "schema references are not supported by this test registry")
        text = body.get("schema")
        if not isinstance(text, str):
            raise _Error(422, 42201, "Invalid schema: no 'schema' string")
        try:
            import fastavro

            parsed = orjson.loads(text)
            fastavro.parse_schema(parsed)
        except Exception as exc:  # noqa: BLE001 — any parse failure is Confluent's 42201
            raise _Error(422, 42201, f"Invalid schema {text[:200]}: {exc}") from None
        return text, parsed

    def _version(self, state: RegistryState, subject: str, version: str) -> tuple[int, int]:
        ids = state.subjects.get(subject)
        if not ids:
            raise _Error(404, 40401, f"Subject '{subject}' not found.")
        if version in ("latest", "-1"):
            return len(ids), ids[-1]
        if not version.isdigit() or not 1 <= int(version) <= len(ids):
            raise _Error(404, 40402, f"Version {version} not found.")
        return int(version), ids[int(version) - 1]

    def _route(self, method: str, p: list[str], state: RegistryState) -> tuple[int, Any]:
        n = len(p)
        if method == "GET" and n == 3 and p[:2] == ["schemas", "ids"] and p[2].isdigit():
            text = state.schemas.get(int(p[2]))
            if text is None:
                raise _Error(404, 40403, "Schema not found")
            return 200, {"schema": text}
        if method == "GET" and p == ["subjects"]:
            return 200, sorted(state.subjects)
        if n >= 2 and p[0] == "subjects":
            subject = p[1]
            if method == "POST" and n == 3 and p[2] == "versions":
                text, parsed = self._schema_of(self._body())
                key = _canonical(text)
                ids = state.subjects.setdefault(subject, [])
                if key in state.ids and state.ids[key] in ids:
                    return 200, {"id": state.ids[key]}
                earlier = [orjson.loads(state.schemas[i]) for i in ids]
                problems = compatibility_problems(state.level(subject), parsed, earlier)
                if problems:
                    if not ids:
                        del state.subjects[subject]
                    raise _Error(
                        409,
                        409,
                        f"Schema being registered is incompatible with an earlier schema for "
                        f'subject "{subject}", details: {problems}',
                    )
                schema_id = state.ids.get(key)
                if schema_id is None:
                    schema_id = state.ids[key] = len(state.schemas) + 1
                    state.schemas[schema_id] = text
                ids.append(schema_id)
                return 200, {"id": schema_id}
            if method == "POST" and n == 2:
                text, _ = self._schema_of(self._body())
                ids = state.subjects.get(subject)
                if not ids:
                    raise _Error(404, 40401, f"Subject '{subject}' not found.")
                schema_id = state.ids.get(_canonical(text))
                if schema_id not in ids:
                    raise _Error(404, 40403, "Schema not found")
                return 200, {
                    "subject": subject,
                    "version": ids.index(schema_id) + 1,
                    "id": schema_id,
                    "schema": state.schemas[schema_id],
                }
            if method == "GET" and n == 3 and p[2] == "versions":
                ids = state.subjects.get(subject)
                if not ids:
                    raise _Error(404, 40401, f"Subject '{subject}' not found.")
                return 200, list(range(1, len(ids) + 1))
            if method == "GET" and n == 4 and p[2] == "versions":
                version, schema_id = self._version(state, subject, p[3])
                return 200, {
                    "subject": subject,
                    "version": version,
                    "id": schema_id,
                    "schema": state.schemas[schema_id],
                }
        if p and p[0] == "config" and n <= 2:
            if method == "GET":
                if n == 1:
                    return 200, {"compatibilityLevel": state.global_level}
                if p[1] not in state.levels:
                    if "defaultToGlobal=true" in (urlsplit(self.path).query or ""):
                        return 200, {"compatibilityLevel": state.global_level}
                    raise _Error(404, 40408, f"Subject '{p[1]}' does not have subject-level compatibility configured")
                return 200, {"compatibilityLevel": state.levels[p[1]]}
            if method == "PUT":
                level = self._body().get("compatibility")
                if level not in LEVELS:
                    raise _Error(422, 42203, f"Invalid compatibility level {level!r}; one of {LEVELS}")
                if n == 1:
                    state.global_level = level
                else:
                    state.levels[p[1]] = level
                return 200, {"compatibility": level}
        if method == "POST" and n >= 4 and p[:2] == ["compatibility", "subjects"] and p[3] == "versions":
            subject = p[2]
            _, parsed = self._schema_of(self._body())
            if n == 5:
                _, schema_id = self._version(state, subject, p[4])
                earlier = [orjson.loads(state.schemas[schema_id])]
                level = state.level(subject).removesuffix("_TRANSITIVE")
            else:
                earlier = [orjson.loads(state.schemas[i]) for i in state.subjects.get(subject, [])]
                level = state.level(subject)
            problems = compatibility_problems(level, parsed, earlier)
            return 200, {"is_compatible": not problems, "messages": problems}
        raise _Error(404, 404, f"HTTP 404 Not Found: {method} {self.path}")


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, state: RegistryState, user_info: str | None):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.state = state
        self.user_info = user_info


class SchemaRegistryServer:
    """Runs the registry on a free loopback port in a background thread."""

    def __init__(self, compatibility: str = "BACKWARD", user_info: str | None = None):
        self.state = RegistryState(compatibility)
        self._server = _Server(self.state, user_info)
        self._thread = threading.Thread(target=self._server.serve_forever, name="schema-registry", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> SchemaRegistryServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def requests(self, method: str, prefix: str) -> int:
        """How many requests of ``method`` to paths starting with ``prefix`` arrived."""
        return sum(1 for m, p in list(self.state.requests) if m == method and p.startswith(prefix))
