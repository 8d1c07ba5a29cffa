#!/usr/bin/env python3
"""Differential test of spate's built-in schema registry against Karapace 3.16.0 (a
Confluent-compatible registry in Python, running on a real Apache Kafka; see
scripts/schema-registry-differential.sh, which starts all three). Both registries start empty
and get the same API steps in the same order: registrations of AVRO, JSON and PROTOBUF schemas
(the same schema twice, references, normalize=true), lookups by id, subject and version,
/schemas/ids/{id}/versions, referencedby, config and mode per subject and global, a table of
schema changes checked and registered under each of the 7 compatibility levels, soft and
permanent deletes, and bad input (40401, 40402, 40403, 409, 42201, 42202, 42203, ...).

Each answer pair is compared: the status, the content type, and the JSON body (a schema text
that is JSON is compared as JSON, so key order and spacing do not count; lists that are sets
are compared sorted; ids through a map of the ids each registry gave the same registration, so
one registration taken by one registry and refused by the other does not shift every later id).
Every difference is either listed in ACCEPTED (below, with the reason) or counted as
unexplained; the run ends with the counts and exits 1 on any unexplained difference.

Env: SPATE_REGISTRY, KARAPACE_REGISTRY (http://host:port each); DIFF_ONLY (a substring: run
only the steps whose name contains it; steps that need earlier ones must match too);
DIFF_VERBOSE=1 (print both answers of every differing step, accepted ones included).
"""
import http.client
import json
import os
import re
import sys
import time
import urllib.parse

SPATE = os.environ["SPATE_REGISTRY"]
KARAPACE = os.environ["KARAPACE_REGISTRY"]
ONLY = os.environ.get("DIFF_ONLY", "")
VERBOSE = os.environ.get("DIFF_VERBOSE") == "1"
CT = "application/vnd.schemaregistry.v1+json"

# ---------------------------------------------------------------------------------------------
# Accepted differences. Each entry explains the differences ("what differed" strings) that match
# its `diff` pattern in the steps whose name matches its `step` pattern. A `why` says why the
# difference is acceptable: in each, spate does what Confluent's Schema Registry does (the API the
# clients are written against) where Karapace 3.16 does not, or the difference is free text. An
# entry that explained nothing in a run is named at the end, so that it can go.
ACCEPTED = [
    # --- free text
    {"id": "message-wording", "step": r"", "diff": r"^message: ",
     "why": "error messages are free text worded by each registry (Karapace copies some of Confluent's, "
            "spate words its own); clients act on the status and error_code, which are compared "
            "(confluent-kafka's SchemaRegistryError and the Java client's RestClientException carry both)."},
    # --- what Karapace 3.16 does not have
    {"id": "karapace-no-avro-json-references", "step": r"^(avro|json) ref: ",
     "diff": r"",
     "why": "Karapace 3.16 takes references only in PROTOBUF schemas: an AVRO or JSON schema with references is "
            "422 with its own code 44302 ('Schema references are not supported for 'AVRO' schema type'); "
            "Confluent's registry and spate take them (confluent-kafka's serializers register them). Every "
            "difference in these steps follows from it (the subjects exist in spate only, and are deleted "
            "again so that later lists compare)."},
    {"id": "karapace-no-id-subjects-schema", "step": r"^by id (subjects|schema)$", "diff": r"",
     "why": "Karapace 3.16 has no GET /schemas/ids/{id}/subjects nor /schemas/ids/{id}/schema (404, HTTP 404 Not "
            "Found); Confluent's registry has both (the issue's interface lists them) and spate answers them."},
    {"id": "karapace-no-mode-writes", "step": r"^mode: set ", "diff": r"",
     "why": "Karapace 3.16 serves GET /mode and GET /mode/{s} only (always READWRITE): PUT /mode[/{s}] is 405 "
            "there; Confluent's registry and spate set READWRITE, READONLY, READONLY_OVERRIDE and IMPORT "
            "(42204 for an unknown mode), which schema_registry_e2e.py checks against spate."},
    {"id": "karapace-compat-no-messages", "step": r"verbose", "diff": r"^messages: only spate",
     "why": "with ?verbose=true Confluent's registry answers the reasons of an incompatibility in `messages`; "
            "Karapace 3.16 answers only is_compatible."},
    {"id": "karapace-schemas-list-schemaType-AVRO", "step": r"^(schemas list|final schemas)", "diff": r"schemaType: only Karapace answers it \(AVRO\)",
     "why": "GET /schemas: Karapace names schemaType AVRO; Confluent's registry, spate, and Karapace itself on "
            "every other answer leave schemaType out for AVRO (the clients take a missing schemaType as AVRO)."},
    {"id": "karapace-lookup-no-references", "step": r"^protobuf lookup importing schema$", "diff": r"^references: only spate",
     "why": "POST /subjects/{s} (is this schema registered?) answers the found version; Confluent's registry "
            "includes its references, as spate does; Karapace 3.16 leaves them out."},
    # --- where spate follows Confluent and Karapace 3.16 does not
    {"id": "protobuf-field-number-change", "step": r"^compat PROTOBUF \w+: field number changed: (check latest|register new)$",
     "diff": r"is_compatible: true vs false|status 200 vs 409|error_code: only Karapace answers it \(409\)|id: only spate",
     "why": "a field whose number changes (string n = 2 -> string n = 3): Confluent's registry compares fields "
            "by number (MessageSchemaDiff: number 2 removed, number 3 added, both compatible changes), so it is "
            "compatible at every level, as in spate; Karapace 3.16 calls it FIELD_TAG_ALTER, incompatible."},
    {"id": "protobuf-fully-qualified-type-names", "step": r"^protobuf .*import", "diff": r"^schema: schema text ",
     "why": "spate stores and serves a Protobuf schema as one canonical text with every type name fully "
            "qualified (.com.example.Money), so the text and the descriptor (base64) forms of one schema get one "
            "id (README); Karapace serves the text as registered (com.example.Money). The same descriptor "
            "results (deserializers compile either)."},
    {"id": "protobuf-field-order", "step": r"^normalize: (protobuf fields in order|versions)$",
     "diff": r"^id: id \d+ vs \d+|^: 1 items vs 2: \[1\] vs \[1, 2\]",
     "why": "the same Protobuf message with its fields declared in another order: spate's canonical text lists "
            "fields by number, so it is the same schema (same id, no new version); Karapace 3.16 keeps the "
            "declared order even with normalize=true and makes it version 2."},
    {"id": "avro-normalize-primitive-object", "step": r"^normalize: int as an object$", "diff": r"^id: id \d+ vs \d+",
     "why": "with normalize=true spate collapses {\"type\": \"int\"} to \"int\" (Avro's parsers read both as "
            "the same primitive; Confluent's normalization prints it as \"int\"), so the schema is the one "
            "registered before; Karapace 3.16 gives it a new id."},
    {"id": "avro-default-validated", "step": r"^invalid avro: default of wrong type",
     "diff": r"",
     "why": "a field default that is not of the field's type (int with default \"s\"): the Avro specification "
            "requires the default to match, and spate refuses the schema (42201); Karapace with stock avro "
            "1.11.3 takes it (id 3, subject bad-default-value). The next two steps delete that subject from "
            "Karapace (spate answers 40401: it never had it)."},
    {"id": "invalid-schema-type-42201", "step": r"^invalid schemaType$", "diff": r"^error_code: 42201 vs 422$",
     "why": "an unknown schemaType (XML): Confluent's registry refuses it as an invalid schema, 42201, as spate "
            "does; Karapace uses the bare HTTP status as error_code (422)."},
    {"id": "body-not-json", "step": r"^body not JSON$", "diff": r"",
     "why": "a body that is not JSON: both answer 400; Confluent's registry and spate answer a JSON error body "
            "(error_code 400, content type application/vnd.schemaregistry.v1+json); Karapace answers "
            "text/plain 'Invalid request JSON body'."},
    {"id": "missing-reference-code", "step": r"^reference to a missing schema$", "diff": r"^error_code: 42201 vs 44302$",
     "why": "an AVRO schema with a reference: Karapace refuses every AVRO reference with 44302 (see "
            "karapace-no-avro-json-references) before looking at it; spate answers 42201 (invalid schema: the "
            "referenced subject/version does not exist), as Confluent's registry does."},
    {"id": "compatibility-level-case", "step": r"^set subject config lower case$", "diff": r"",
     "why": "PUT /config/{s} {\"compatibility\": \"backward\"}: Confluent's registry reads the level in any case "
            "(CompatibilityLevel.forName upper-cases it), as spate does; Karapace 3.16 refuses it (42203)."},
    {"id": "delete-subject-config-answer", "step": r"^delete subject config$",
     "diff": r"^compatibility(Level)?: only (Karapace|spate) answers it",
     "why": "DELETE /config/{s}: Confluent's registry answers the deleted config as {\"compatibilityLevel\": ...}, "
            "as spate does; Karapace 3.16 answers {\"compatibility\": <the global level>}."},
    {"id": "subject-config-not-set-40408", "step": r"^config of unknown subject$", "diff": r"^error_code: 40408 vs 40401$",
     "why": "GET /config/{s} for a subject without a level of its own: Confluent's registry (7.x) answers 40408 "
            "(subject-level compatibility not configured) whether the subject exists or not, as spate does; "
            "Karapace answers 40401 for a subject it does not know."},
    {"id": "subject-mode-not-set-40409", "step": r"^(subject mode|unknown subject mode)$",
     "diff": r"^status 404 vs 200$|^error_code: (only spate answers it \(40409\)|40409 vs 40401)$|^mode: only Karapace",
     "why": "GET /mode/{s} for a subject without a mode of its own: Confluent's registry (7.x) answers 40409 "
            "(subject-level mode not configured; defaultToGlobal=true gives the global one), as spate does; "
            "Karapace 3.16 answers the global mode (READWRITE), or 40401 for an unknown subject."},
    {"id": "compatibility-unknown-subject-40401", "step": r"^compatibility check unknown subject$",
     "diff": r"^error_code: 40401 vs 40402$",
     "why": "POST /compatibility/subjects/{s}/versions/latest for an unknown subject: Confluent's "
            "CompatibilityResource answers 40401 (subject not found), as spate does; Karapace 40402."},
    {"id": "karapace-config-only-subject-listed", "step": r"^delete: subjects deleted=true",
     "diff": r'only spate \[\], only Karapace \["\\"future-value\\""\]$',
     "why": "GET /subjects?deleted=true: Karapace 3.16 also lists a subject that has a compatibility level and "
            "no schema (future-value, set by PUT /config/future-value); Confluent's registry and spate list "
            "subjects that have versions, deleted ones included."},
    {"id": "final-list-follows", "step": r"^final schemas$",
     "diff": r'^: \d+ items vs \d+: only spate \[("compat-protobuf-field-number-changed-[a-z_]+ v2"(, )?){6}\], '
             r'only Karapace \["norm-value v2", "pnorm-value v2"\]$',
     "why": "the list of every schema differs by exactly the versions that accepted differences above made: "
            "the six field-number changes spate took (protobuf-field-number-change) and the two versions "
            "Karapace made where spate found the schema registered (avro-normalize-primitive-object, "
            "protobuf-field-order)."},
    {"id": "hard-deleted-schema-forgotten", "step": r"^delete: (id of permanently deleted|register into a deleted subject)$",
     "diff": r"^status 404 vs 200$|^error_code: only spate answers it \(40403\)|^schema: only Karapace|^id: id \d+ vs \d+",
     "why": "after every version holding a schema is permanently deleted, spate forgets the schema: its id "
            "answers 40403 and the same text registered again gets a new id (an id never names two schemas); "
            "Karapace keeps serving the schema by id and gives it its old id again. Not checked against "
            "Confluent's registry here."},
    # --- spate defects, small, not fixed in this change
]

seen_accepted = set()

# ---------------------------------------------------------------------------------------------
# HTTP


def call(base, method, path, body=None, ctype=CT):
    """(status, parsed JSON or text, content type of the answer)."""
    u = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    headers = {"Accept": CT}
    data = None
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        if ctype:
            headers["Content-Type"] = ctype
    try:
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw.decode(errors="replace")
        return resp.status, parsed, (resp.getheader("Content-Type") or "").split(";")[0].strip()
    finally:
        conn.close()


# ---------------------------------------------------------------------------------------------
# Comparison

class Ids:
    """Karapace's id -> spate's id, from answers that name the id of the same schema."""

    def __init__(self):
        self.k2s, self.s2k = {}, {}

    def same(self, s, k):
        """Whether spate's id `s` and Karapace's id `k` name the same schema (first sight maps)."""
        if k in self.k2s or s in self.s2k:
            return self.k2s.get(k) == s
        self.k2s[k], self.s2k[s] = s, k
        return True


IDS = Ids()
SAVED = {"spate": {}, "karapace": {}}  # name -> id, per registry


def as_json(text):
    if isinstance(text, str):
        try:
            return json.loads(text)
        except ValueError:
            pass
    return text


def norm_proto(text):
    """A .proto text with spacing and blank lines not counting."""
    return re.sub(r"\s+", " ", text).strip()


def compare(s, k, where, out, set_like=False):
    """Appends to `out` a description of each difference between spate's value `s` and
    Karapace's `k` at `where`."""
    if isinstance(s, dict) and isinstance(k, dict):
        for key in sorted(set(s) | set(k)):
            w = f"{where}.{key}" if where else key
            if key not in k:
                out.append(f"{w}: only spate answers it ({short(s[key])})")
            elif key not in s:
                out.append(f"{w}: only Karapace answers it ({short(k[key])})")
            elif key == "schema" and isinstance(s[key], str) and isinstance(k[key], str):
                sj, kj = as_json(s[key]), as_json(k[key])
                if isinstance(sj, str) and isinstance(kj, str):
                    if norm_proto(sj) != norm_proto(kj):
                        out.append(f"{w}: schema text {short(s[key])} vs {short(k[key])}")
                else:
                    compare(sj, kj, w + "(json)", out)
            elif key == "id" and isinstance(s[key], int) and isinstance(k[key], int):
                if not IDS.same(s[key], k[key]):
                    out.append(f"{w}: id {s[key]} vs {k[key]} (not the same schema by earlier answers)")
            elif key == "message" and "error_code" in s and "error_code" in k:
                if s[key] != k[key]:
                    out.append(f"message: {short(s[key])} vs {short(k[key])}")
            else:
                compare(s[key], k[key], w, out, set_like=key in ("subjects",))
        return
    if isinstance(s, list) and isinstance(k, list):
        if set_like:
            def key(x):
                if isinstance(x, dict) and "subject" in x:
                    return json.dumps([x.get("subject"), x.get("version")])
                return json.dumps(x)
            s, k = sorted(s, key=key), sorted(k, key=key)
        if len(s) != len(k):
            if set_like:
                def ident(x):
                    if isinstance(x, dict) and "subject" in x:
                        return f"{x['subject']} v{x.get('version')}"
                    return json.dumps(x, sort_keys=True)
                ss, ks = {ident(x) for x in s}, {ident(x) for x in k}
                out.append(f"{where}: {len(s)} items vs {len(k)}: only spate {json.dumps(sorted(ss - ks))}, "
                           f"only Karapace {json.dumps(sorted(ks - ss))}")
            else:
                out.append(f"{where}: {len(s)} items vs {len(k)}: {short(s)} vs {short(k)}")
            return
        for i, (a, b) in enumerate(zip(s, k)):
            compare(a, b, f"{where}[{i}]", out)
        return
    if s != k:
        out.append(f"{where or 'body'}: {short(s)} vs {short(k)}")


def short(v, n=160):
    t = v if isinstance(v, str) else json.dumps(v)
    return t if len(t) <= n else t[:n] + "..."


# ---------------------------------------------------------------------------------------------
# Steps

STEPS = []


def step(name, method, path, body=None, *, ctype=CT, save=None, sort=False, ids_list=False):
    """One request, to both. `path` may name saved ids as {name}. `save`: remember the answer's
    id under that name. `sort`: the answer is a set (compared sorted). `ids_list`: the answer is
    a list of ids (compared through the id map)."""
    STEPS.append(dict(name=name, method=method, path=path, body=body, ctype=ctype, save=save,
                      sort=sort, ids_list=ids_list))


def reg(name, subject, schema, stype=None, refs=None, query="", save=None, extra=None):
    body = {"schema": schema}
    if stype:
        body["schemaType"] = stype
    if refs:
        body["references"] = refs
    if extra:
        body.update(extra)
    step(name, "POST", f"/subjects/{subject}/versions{query}", body, save=save)


def avro(name, fields, **extra):
    return json.dumps(dict({"type": "record", "name": name, "fields": fields}, **extra))


# --- basics: types, empty registry, global config and mode
step("types", "GET", "/schemas/types", sort=True)
step("empty subjects", "GET", "/subjects")
step("global config", "GET", "/config")
step("global mode", "GET", "/mode")
step("unknown id", "GET", "/schemas/ids/4242")
step("non-numeric id", "GET", "/schemas/ids/abc")
step("unknown subject versions", "GET", "/subjects/nope/versions")
step("unknown subject version", "GET", "/subjects/nope/versions/1")
step("unknown subject latest", "GET", "/subjects/nope/versions/latest")

# --- AVRO registration, same schema twice, lookups
USER = avro("User", [{"name": "id", "type": "long"}, {"name": "name", "type": "string"}],
            namespace="com.example")
USER_SPACED = json.dumps(json.loads(USER), indent=2)
USER2 = avro("User", [{"name": "id", "type": "long"}, {"name": "name", "type": "string"},
                      {"name": "email", "type": ["null", "string"], "default": None}],
             namespace="com.example")
reg("avro register", "users-value", USER, save="user1")
reg("avro register same again", "users-value", USER, save="user1b")
reg("avro register same, other spacing", "users-value", USER_SPACED)
reg("avro register same, schemaType AVRO given", "users-value", USER, stype="AVRO")
reg("avro same schema, second subject", "users-copy", USER)
reg("avro evolve (optional field)", "users-value", USER2, save="user2")
step("subjects", "GET", "/subjects", sort=True)
step("versions", "GET", "/subjects/users-value/versions")
step("version 1", "GET", "/subjects/users-value/versions/1")
step("version latest", "GET", "/subjects/users-value/versions/latest")
step("version -1", "GET", "/subjects/users-value/versions/-1")
step("version 1 schema", "GET", "/subjects/users-value/versions/1/schema")
step("version 3 missing", "GET", "/subjects/users-value/versions/3")
step("version 0 invalid", "GET", "/subjects/users-value/versions/0")
step("version abc invalid", "GET", "/subjects/users-value/versions/abc")
step("by id", "GET", "/schemas/ids/{user1}")
step("by id 2", "GET", "/schemas/ids/{user2}")
step("by id versions", "GET", "/schemas/ids/{user1}/versions", sort=True)
step("by id subjects", "GET", "/schemas/ids/{user1}/subjects", sort=True)
step("by id schema", "GET", "/schemas/ids/{user1}/schema")
step("lookup in subject", "POST", "/subjects/users-value", {"schema": USER})
step("lookup in subject, spaced", "POST", "/subjects/users-value", {"schema": USER_SPACED})
step("lookup not in subject", "POST", "/subjects/users-value",
     {"schema": avro("Other", [{"name": "x", "type": "int"}])})
step("lookup in unknown subject", "POST", "/subjects/nope", {"schema": USER})
step("schemas list", "GET", "/schemas", sort=True)

# --- bad input
reg("invalid avro: not JSON", "bad-value", "{not json")
reg("invalid avro: unknown type", "bad-value", avro("B", [{"name": "x", "type": "nosuchtype"}]))
reg("invalid avro: default of wrong type", "bad-default-value", avro("B", [{"name": "x", "type": "int", "default": "s"}]))
# Karapace takes it (see ACCEPTED); the subject goes again so that later lists compare.
step("invalid avro: default of wrong type, soft delete", "DELETE", "/subjects/bad-default-value")
step("invalid avro: default of wrong type, permanent delete", "DELETE", "/subjects/bad-default-value?permanent=true")
reg("invalid avro: duplicate field", "bad-value", avro("B", [{"name": "x", "type": "int"}, {"name": "x", "type": "int"}]))
reg("invalid schemaType", "bad-value", USER, stype="XML")
step("body without schema", "POST", "/subjects/bad-value/versions", {"schemaType": "AVRO"})
step("body not JSON", "POST", "/subjects/bad-value/versions", b"{oops")
reg("invalid json schema", "bad-json", json.dumps({"type": "object", "properties": 3}), stype="JSON")
reg("invalid protobuf", "bad-proto", 'syntax = "proto3"; message M { int32 a = ; }', stype="PROTOBUF")
reg("reference to a missing schema", "bad-ref", avro("R", [{"name": "u", "type": "com.example.Missing"}]),
    refs=[{"name": "com.example.Missing", "subject": "missing-subject", "version": 1}])
step("subjects after bad input", "GET", "/subjects", sort=True)

# --- config: global and per subject; 42203
step("subject config unset", "GET", "/config/users-value")
step("subject config defaultToGlobal", "GET", "/config/users-value?defaultToGlobal=true")
step("set subject config FULL", "PUT", "/config/users-value", {"compatibility": "FULL"})
step("subject config FULL", "GET", "/config/users-value")
step("set subject config invalid", "PUT", "/config/users-value", {"compatibility": "SIDEWAYS"})
step("set subject config lower case", "PUT", "/config/users-value", {"compatibility": "backward"})
step("set global config NONE", "PUT", "/config", {"compatibility": "NONE"})
step("global config NONE", "GET", "/config")
step("set global config invalid", "PUT", "/config", {"compatibility": "MAYBE"})
step("set global config BACKWARD", "PUT", "/config", {"compatibility": "BACKWARD"})
step("delete subject config", "DELETE", "/config/users-value")
step("subject config after delete", "GET", "/config/users-value")
step("config of unknown subject", "GET", "/config/nope")
step("set config of a subject with no schema", "PUT", "/config/future-value", {"compatibility": "FORWARD"})
step("config of a subject with no schema", "GET", "/config/future-value")
step("subject mode", "GET", "/mode/users-value")
step("unknown subject mode", "GET", "/mode/nope")
step("subject mode defaultToGlobal", "GET", "/mode/users-value?defaultToGlobal=true")
step("mode: set subject READONLY", "PUT", "/mode/ro-value", {"mode": "READONLY"})
step("mode: set global READWRITE", "PUT", "/mode", {"mode": "READWRITE"})
step("mode: set invalid", "PUT", "/mode/ro-value", {"mode": "SOMETIMES"})

# --- incompatible registration (409) and the compatibility endpoint
INCOMPAT = avro("User", [{"name": "id", "type": "string"}, {"name": "name", "type": "string"}], namespace="com.example")
reg("incompatible registration 409", "users-value", INCOMPAT)
step("compatibility check incompatible", "POST", "/compatibility/subjects/users-value/versions/latest", {"schema": INCOMPAT})
step("compatibility check incompatible verbose", "POST",
     "/compatibility/subjects/users-value/versions/latest?verbose=true", {"schema": INCOMPAT})
step("compatibility check compatible", "POST", "/compatibility/subjects/users-value/versions/1", {"schema": USER2})
step("compatibility check unknown version", "POST", "/compatibility/subjects/users-value/versions/9", {"schema": USER2})
step("compatibility check unknown subject", "POST", "/compatibility/subjects/nope/versions/latest", {"schema": USER2})
step("compatibility check invalid schema", "POST", "/compatibility/subjects/users-value/versions/latest", {"schema": "{x"})

# --- JSON Schema and PROTOBUF registration
JS = json.dumps({"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"}}})
reg("json register", "js-value", JS, stype="JSON", save="js1")
reg("json register same again", "js-value", JS, stype="JSON")
reg("json register same, other key order", "js-value",
    json.dumps({"properties": {"name": {"type": "string"}, "id": {"type": "integer"}}, "type": "object"}), stype="JSON")
step("json by id", "GET", "/schemas/ids/{js1}")
step("json version 1", "GET", "/subjects/js-value/versions/1")
step("json lookup", "POST", "/subjects/js-value", {"schema": JS, "schemaType": "JSON"})
step("json lookup without schemaType", "POST", "/subjects/js-value", {"schema": JS})

PROTO = 'syntax = "proto3";\npackage com.example;\n\nmessage Order {\n  int32 id = 1;\n  string name = 2;\n}\n'
reg("protobuf register", "orders-value", PROTO, stype="PROTOBUF", save="pb1")
reg("protobuf register same again", "orders-value", PROTO, stype="PROTOBUF")
reg("protobuf register same, other spacing", "orders-value",
    'syntax = "proto3"; package com.example; message Order { int32 id = 1; string name = 2; }', stype="PROTOBUF")
step("protobuf by id", "GET", "/schemas/ids/{pb1}")
step("protobuf version 1", "GET", "/subjects/orders-value/versions/1")
step("protobuf lookup", "POST", "/subjects/orders-value", {"schema": PROTO, "schemaType": "PROTOBUF"})
step("schemas list, all types", "GET", "/schemas", sort=True)

# --- references. Karapace 3.16 takes references in PROTOBUF schemas only (see ACCEPTED): the
# Avro and JSON Schema ones ("avro ref:", "json ref:") are compared, then their subjects go again.
ADDRESS = avro("Address", [{"name": "street", "type": "string"}], namespace="com.example")
reg("avro referenced schema", "address", ADDRESS, save="addr")
CUSTOMER = avro("Customer", [{"name": "name", "type": "string"}, {"name": "address", "type": "com.example.Address"}],
                namespace="com.example")
AREF = [{"name": "com.example.Address", "subject": "address", "version": 1}]
reg("avro ref: register", "customer-value", CUSTOMER, refs=AREF, save="cust")
reg("avro ref: register again", "customer-value", CUSTOMER, refs=AREF)
reg("avro ref: version latest", "customer2-value", CUSTOMER,
    refs=[{"name": "com.example.Address", "subject": "address", "version": -1}])
step("avro ref: referencing schema by id", "GET", "/schemas/ids/{cust}")
step("avro ref: referencing schema version", "GET", "/subjects/customer-value/versions/1")
step("avro ref: referencedby", "GET", "/subjects/address/versions/1/referencedby", ids_list=True)
step("avro ref: lookup referencing schema", "POST", "/subjects/customer-value", {"schema": CUSTOMER, "references": AREF})
step("referencedby, nothing", "GET", "/subjects/users-value/versions/1/referencedby", ids_list=True)
step("referencedby, unknown version", "GET", "/subjects/address/versions/7/referencedby")
JS_DEP = json.dumps({"$id": "https://example.com/price.json", "type": "object",
                     "properties": {"amount": {"type": "number"}}})
reg("json referenced schema", "price.json", JS_DEP, stype="JSON")
JS_MAIN = json.dumps({"type": "object", "properties": {"price": {"$ref": "https://example.com/price.json"}}})
reg("json ref: register", "item-value", JS_MAIN, stype="JSON",
    refs=[{"name": "https://example.com/price.json", "subject": "price.json", "version": 1}], save="item")
step("json ref: referencing schema by id", "GET", "/schemas/ids/{item}")
for subj in ("customer-value", "customer2-value", "item-value"):
    step(f"avro ref: soft delete {subj}", "DELETE", f"/subjects/{subj}")
    step(f"avro ref: permanent delete {subj}", "DELETE", f"/subjects/{subj}?permanent=true")
step("referencedby after the referencing subjects went", "GET", "/subjects/address/versions/1/referencedby", ids_list=True)

PROTO_DEP = 'syntax = "proto3";\npackage com.example;\n\nmessage Money {\n  int64 units = 1;\n  string currency = 2;\n}\n'
reg("protobuf referenced file", "money.proto", PROTO_DEP, stype="PROTOBUF")
PROTO_MAIN = ('syntax = "proto3";\npackage com.example;\nimport "money.proto";\n\n'
              'message Invoice {\n  string id = 1;\n  com.example.Money total = 2;\n}\n')
PREF = [{"name": "money.proto", "subject": "money.proto", "version": 1}]
reg("protobuf with an import", "invoice-value", PROTO_MAIN, stype="PROTOBUF", refs=PREF, save="inv")
reg("protobuf with an import, again", "invoice-value", PROTO_MAIN, stype="PROTOBUF", refs=PREF)
step("protobuf importing schema by id", "GET", "/schemas/ids/{inv}")
step("protobuf importing schema version", "GET", "/subjects/invoice-value/versions/1")
step("protobuf lookup importing schema", "POST", "/subjects/invoice-value",
     {"schema": PROTO_MAIN, "schemaType": "PROTOBUF", "references": PREF})
step("protobuf referencedby", "GET", "/subjects/money.proto/versions/1/referencedby", ids_list=True)
step("protobuf delete referenced version 42206", "DELETE", "/subjects/money.proto/versions/1")
step("protobuf delete referenced subject 42206", "DELETE", "/subjects/money.proto")
reg("protobuf unresolved import", "invoice2-value", PROTO_MAIN, stype="PROTOBUF")
reg("protobuf reference to a missing version", "invoice2-value", PROTO_MAIN, stype="PROTOBUF",
    refs=[{"name": "money.proto", "subject": "money.proto", "version": 5}])

# --- normalize=true
N1 = avro("Norm", [{"name": "a", "type": "int"}])
N2 = json.dumps({"fields": [{"type": "int", "name": "a"}], "name": "Norm", "type": "record"})
reg("normalize: register", "norm-value", N1, query="?normalize=true", save="n1")
reg("normalize: reordered keys", "norm-value", N2, query="?normalize=true")
step("normalize: lookup", "POST", "/subjects/norm-value?normalize=true", {"schema": N2})
N3 = json.dumps({"type": "record", "name": "Norm", "fields": [{"name": "a", "type": {"type": "int"}}]})
reg("normalize: int as an object", "norm-value", N3, query="?normalize=true")
reg("no normalize: int as an object", "norm2-value", N1)
reg("no normalize: int as an object, again", "norm2-value", N3)
step("no normalize: versions", "GET", "/subjects/norm2-value/versions")
PN = 'syntax = "proto3";\npackage n;\n\nmessage A {\n  string s = 2;\n  int32 i = 1;\n}\n'
reg("normalize: protobuf fields out of order", "pnorm-value", PN, stype="PROTOBUF", query="?normalize=true")
reg("normalize: protobuf fields in order", "pnorm-value",
    'syntax = "proto3";\npackage n;\n\nmessage A {\n  int32 i = 1;\n  string s = 2;\n}\n', stype="PROTOBUF", query="?normalize=true")
step("normalize: versions", "GET", "/subjects/pnorm-value/versions")

# ---------------------------------------------------------------------------------------------
# Compatibility: a table of changes, each checked and then registered under each level.
LEVELS = ["NONE", "BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE"]


def rec(*fields):
    return avro("R", list(fields), namespace="c")


F_ID = {"name": "id", "type": "int"}
F_NAME = {"name": "name", "type": "string"}
AVRO_CHANGES = {
    # change: ([earlier versions...], new)
    "add field with default": ([rec(F_ID)], rec(F_ID, {"name": "n", "type": "int", "default": 0})),
    "add field without default": ([rec(F_ID)], rec(F_ID, {"name": "n", "type": "int"})),
    "remove field without default": ([rec(F_ID, F_NAME)], rec(F_ID)),
    "remove field with default": ([rec(F_ID, {"name": "n", "type": "int", "default": 0})], rec(F_ID)),
    "rename field": ([rec(F_ID, F_NAME)], rec(F_ID, {"name": "title", "type": "string"})),
    "rename field with alias": ([rec(F_ID, F_NAME)], rec(F_ID, {"name": "title", "type": "string", "aliases": ["name"]})),
    "int to long": ([rec(F_ID)], rec({"name": "id", "type": "long"})),
    "long to int": ([rec({"name": "id", "type": "long"})], rec(F_ID)),
    "int to string": ([rec(F_ID)], rec({"name": "id", "type": "string"})),
    "string to bytes": ([rec(F_NAME)], rec({"name": "name", "type": "bytes"})),
    "field made nullable": ([rec(F_NAME)], rec({"name": "name", "type": ["null", "string"], "default": None})),
    "nullable made required": ([rec({"name": "name", "type": ["null", "string"], "default": None})], rec(F_NAME)),
    "enum symbol added": ([rec({"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}})],
                          rec({"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]}})),
    "enum symbol removed": ([rec({"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]}})],
                            rec({"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}})),
    "enum symbol added, enum default": (
        [rec({"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"], "default": "A"}})],
        rec({"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B", "C"], "default": "A"}})),
    "record renamed": ([rec(F_ID)], avro("S", [F_ID], namespace="c")),
    # three versions: the newest is compatible with the latest, not with the first
    "chain: backward only with the latest": (
        [rec(F_ID), rec(F_ID, {"name": "n", "type": "int", "default": 0})], rec(F_ID, {"name": "n", "type": "int"})),
    "chain: forward only with the latest": (
        [rec(F_ID, {"name": "n", "type": "int"}), rec(F_ID, {"name": "n", "type": "int", "default": 0})], rec(F_ID)),
    "chain: full only with the latest": (
        [rec(F_ID, {"name": "n", "type": "int", "default": 0}), rec(F_ID)],
        rec(F_ID, {"name": "n", "type": "string", "default": ""})),
}


def js(props, required=None, additional=None):
    d = {"type": "object", "properties": props}
    if required:
        d["required"] = required
    if additional is not None:
        d["additionalProperties"] = additional
    return json.dumps(d)


P_ID = {"id": {"type": "integer"}}
JSON_CHANGES = {
    "add property, open model": ([js(P_ID)], js(dict(P_ID, n={"type": "string"}))),
    "add property, closed model": ([js(P_ID, additional=False)], js(dict(P_ID, n={"type": "string"}), additional=False)),
    "remove property, open model": ([js(dict(P_ID, n={"type": "string"}))], js(P_ID)),
    "remove property, closed model": ([js(dict(P_ID, n={"type": "string"}), additional=False)], js(P_ID, additional=False)),
    "add required property": ([js(P_ID, additional=False)], js(dict(P_ID, n={"type": "string"}), required=["n"], additional=False)),
    "integer to number": ([js(P_ID)], js({"id": {"type": "number"}})),
    "number to integer": ([js({"id": {"type": "number"}})], js(P_ID)),
    "integer to string": ([js(P_ID)], js({"id": {"type": "string"}})),
    "enum value added": ([js({"e": {"enum": ["A", "B"]}})], js({"e": {"enum": ["A", "B", "C"]}})),
    "enum value removed": ([js({"e": {"enum": ["A", "B", "C"]}})], js({"e": {"enum": ["A", "B"]}})),
    "maxLength lowered": ([js({"s": {"type": "string", "maxLength": 10}})], js({"s": {"type": "string", "maxLength": 5}})),
}


def pb(body, extra=""):
    return f'syntax = "proto3";\npackage c;\n{extra}\nmessage M {{\n{body}\n}}\n'


PROTO_CHANGES = {
    "add field": ([pb("  int32 id = 1;")], pb("  int32 id = 1;\n  string n = 2;")),
    "remove field": ([pb("  int32 id = 1;\n  string n = 2;")], pb("  int32 id = 1;")),
    "rename field": ([pb("  int32 id = 1;\n  string n = 2;")], pb("  int32 id = 1;\n  string title = 2;")),
    "field number changed": ([pb("  int32 id = 1;\n  string n = 2;")], pb("  int32 id = 1;\n  string n = 3;")),
    "int32 to int64": ([pb("  int32 id = 1;")], pb("  int64 id = 1;")),
    "int32 to string": ([pb("  int32 id = 1;")], pb("  string id = 1;")),
    "string to bytes": ([pb("  string s = 1;")], pb("  bytes s = 1;")),
    "message renamed": ([pb("  int32 id = 1;")], 'syntax = "proto3";\npackage c;\n\nmessage N {\n  int32 id = 1;\n}\n'),
    "field moved into a oneof": ([pb("  int32 id = 1;\n  string n = 2;")],
                                 pb("  int32 id = 1;\n  oneof o {\n    string n = 2;\n  }")),
    "enum value added": ([pb("  E e = 1;", "enum E {\n  A = 0;\n  B = 1;\n}")],
                         pb("  E e = 1;", "enum E {\n  A = 0;\n  B = 1;\n  C = 2;\n}")),
}


def slug(s):
    return re.sub(r"[^a-z0-9]+", "-", s.lower()).strip("-")


for stype, table in (("AVRO", AVRO_CHANGES), ("JSON", JSON_CHANGES), ("PROTOBUF", PROTO_CHANGES)):
    for change, (olds, new) in table.items():
        for level in LEVELS:
            subject = f"compat-{stype.lower()}-{slug(change)}-{level.lower()}"
            tag = f"compat {stype} {level}: {change}"
            step(f"{tag}: set level", "PUT", f"/config/{subject}", {"compatibility": level})
            for i, old in enumerate(olds):
                reg(f"{tag}: register v{i + 1}", subject, old, stype=None if stype == "AVRO" else stype)
            body = {"schema": new}
            if stype != "AVRO":
                body["schemaType"] = stype
            step(f"{tag}: check latest", "POST", f"/compatibility/subjects/{subject}/versions/latest", body)
            step(f"{tag}: register new", "POST", f"/subjects/{subject}/versions", body)

# ---------------------------------------------------------------------------------------------
# Deletes: soft, permanent, and what reads see after each.
D1 = avro("D", [{"name": "a", "type": "int"}])
D2 = avro("D", [{"name": "a", "type": "int"}, {"name": "b", "type": "int", "default": 1}])
D3 = avro("D", [{"name": "a", "type": "int"}, {"name": "b", "type": "int", "default": 1},
                {"name": "c", "type": "int", "default": 2}])
reg("delete: register v1", "del-value", D1, save="d1")
reg("delete: register v2", "del-value", D2, save="d2")
reg("delete: register v3", "del-value", D3)
step("delete: permanent before soft 40407", "DELETE", "/subjects/del-value/versions/1?permanent=true")
step("delete: soft v1", "DELETE", "/subjects/del-value/versions/1")
step("delete: soft v1 again 40406", "DELETE", "/subjects/del-value/versions/1")
step("delete: v1 is gone", "GET", "/subjects/del-value/versions/1")
step("delete: v1 with deleted=true", "GET", "/subjects/del-value/versions/1?deleted=true")
step("delete: versions", "GET", "/subjects/del-value/versions")
step("delete: versions deleted=true", "GET", "/subjects/del-value/versions?deleted=true")
step("delete: id still readable", "GET", "/schemas/ids/{d1}")
step("delete: id versions", "GET", "/schemas/ids/{d1}/versions", sort=True)
step("delete: id versions deleted=true", "GET", "/schemas/ids/{d1}/versions?deleted=true", sort=True)
step("delete: lookup soft-deleted", "POST", "/subjects/del-value", {"schema": D1})
step("delete: lookup soft-deleted, deleted=true", "POST", "/subjects/del-value?deleted=true", {"schema": D1})
reg("delete: register soft-deleted again", "del-value", D1)
step("delete: versions after re-register", "GET", "/subjects/del-value/versions")
step("delete: permanent v1", "DELETE", "/subjects/del-value/versions/1?permanent=true")
step("delete: v1 deleted=true after permanent", "GET", "/subjects/del-value/versions/1?deleted=true")
step("delete: latest", "DELETE", "/subjects/del-value/versions/latest")
step("delete: versions after latest", "GET", "/subjects/del-value/versions")
step("delete: unknown version 40402", "DELETE", "/subjects/del-value/versions/42")
step("delete: unknown subject 40401", "DELETE", "/subjects/nope")
step("delete: unknown subject version 40401", "DELETE", "/subjects/nope/versions/1")
step("delete: subject permanent before soft 40405", "DELETE", "/subjects/del-value?permanent=true")
step("delete: subject soft", "DELETE", "/subjects/del-value")
step("delete: subject soft again 40404", "DELETE", "/subjects/del-value")
step("delete: subjects", "GET", "/subjects", sort=True)
step("delete: subjects deleted=true", "GET", "/subjects?deleted=true", sort=True)
step("delete: versions of soft-deleted subject", "GET", "/subjects/del-value/versions")
step("delete: versions of soft-deleted subject deleted=true", "GET", "/subjects/del-value/versions?deleted=true")
step("delete: latest of soft-deleted subject", "GET", "/subjects/del-value/versions/latest")
step("delete: subject permanent", "DELETE", "/subjects/del-value?permanent=true")
step("delete: subjects deleted=true after permanent", "GET", "/subjects?deleted=true", sort=True)
step("delete: id of permanently deleted", "GET", "/schemas/ids/{d2}")
reg("delete: register into a deleted subject", "del-value", D1)
step("delete: versions after new start", "GET", "/subjects/del-value/versions")
step("delete: subject config survives?", "GET", "/config/del-value")

step("final subjects", "GET", "/subjects", sort=True)
step("final schemas", "GET", "/schemas", sort=True)


# ---------------------------------------------------------------------------------------------
# Run

def fill(path, reg_name):
    return re.sub(r"\{(\w+)\}", lambda m: str(SAVED[reg_name].get(m.group(1), "0")), path)


def run():
    counts = {"equal": 0, "accepted": 0, "unexplained": 0}
    unexplained = []
    t0 = time.time()
    for st in STEPS:
        if ONLY and ONLY not in st["name"]:
            continue
        answers = {}
        for name, base in (("spate", SPATE), ("karapace", KARAPACE)):
            answers[name] = call(base, st["method"], fill(st["path"], name), st["body"], st["ctype"])
            status, body, _ = answers[name]
            if st["save"] and isinstance(body, dict) and isinstance(body.get("id"), int):
                SAVED[name][st["save"]] = body["id"]
        (ss, sb, sct), (ks, kb, kct) = answers["spate"], answers["karapace"]
        diffs = []
        if ss != ks:
            diffs.append(f"status {ss} vs {ks}")
        if sct != kct:
            diffs.append(f"content type {sct} vs {kct}")
        if st["ids_list"] and isinstance(sb, list) and isinstance(kb, list) and len(sb) == len(kb):
            for s_id, k_id in zip(sorted(sb), sorted(kb)):
                if not IDS.same(s_id, k_id):
                    diffs.append(f"ids {sorted(sb)} vs {sorted(kb)}")
                    break
        else:
            compare(sb, kb, "", diffs, set_like=st["sort"])
        if not diffs:
            counts["equal"] += 1
            continue
        open_ = []
        why = []
        for d in diffs:
            hit = next((a for a in ACCEPTED if re.search(a["step"], st["name"]) and re.search(a["diff"], d)), None)
            if hit:
                seen_accepted.add(hit["id"])
                why.append(hit["id"])
            else:
                open_.append(d)
        if open_:
            counts["unexplained"] += 1
            unexplained.append(st["name"])
            print(f"DIFF  {st['name']}: " + " | ".join(open_), flush=True)
            if why:
                print(f"        (also accepted: {', '.join(sorted(set(why)))})")
        else:
            counts["accepted"] += 1
            print(f"ok~   {st['name']} (accepted: {', '.join(sorted(set(why)))})", flush=True)
        if VERBOSE or open_:
            print(f"        {st['method']} {st['path']}")
            print(f"        spate:    {ss} {short(sb, 400)}")
            print(f"        karapace: {ks} {short(kb, 400)}")
    unused = [a["id"] for a in ACCEPTED if a["id"] not in seen_accepted]
    if unused and not ONLY:
        print("accepted differences that explained nothing this run: " + ", ".join(unused))
    total = sum(counts.values())
    print(f"\n{total} steps in {time.time() - t0:.1f} s: {counts['equal']} equal, "
          f"{counts['accepted']} with accepted differences only, {counts['unexplained']} unexplained")
    print(f"{counts['equal'] + counts['accepted']} passed, {counts['unexplained']} failed")
    return 1 if counts["unexplained"] else 0


if __name__ == "__main__":
    sys.exit(run())
