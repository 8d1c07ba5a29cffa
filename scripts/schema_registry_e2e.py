"""spate's built-in schema registry with clients nobody on this team wrote: confluent-kafka's
SchemaRegistryClient, AvroSerializer/AvroDeserializer, JSONSerializer/JSONDeserializer and
ProtobufSerializer/ProtobufDeserializer producing to and consuming from a real spate (started
here on free loopback ports with a temp data dir); HTTP ingest of Avro, JSON Schema and
Protobuf records (REST Proxy v2 shape) read back with those deserializers; schema evolution,
compatibility levels, deletes, references and normalization through the client; bad input
answered with Confluent's error codes; and a kill -9 and restart after which ids, versions,
configs, modes and deletes are as they were.

    python3 scripts/schema_registry_e2e.py      (SPATE_BIN overrides target/debug/spate)
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf import timestamp_pb2  # noqa: F401 - puts timestamp.proto in the default pool
from confluent_kafka.serialization import MessageField, SerializationContext

from read_back import read_back

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BINARY = os.environ.get("SPATE_BIN", os.path.join(ROOT, "target", "debug", "spate"))
CT = "application/vnd.schemaregistry.v1+json"
FAILED = []


class Spate:
    """A spate process with the registry on; `restart` kills it with SIGKILL and starts it
    again on the same data dir (new ports)."""

    def __init__(self, data):
        self.data, self.proc = data, None
        self.start()

    def start(self):
        self.out = open(os.path.join(self.data, "stdout"), "w+")
        self.err = open(os.path.join(self.data, "stderr"), "a")
        self.proc = subprocess.Popen(
            [BINARY, "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
             "--schema-registry-listen", "127.0.0.1:0", "--data-dir", os.path.join(self.data, "d")],
            stdout=self.out, stderr=self.err)
        deadline = time.time() + 60
        line = ""
        while "schema registry on" not in line:
            assert self.proc.poll() is None, "spate exited at start; see " + self.err.name
            assert time.time() < deadline, "spate did not start within 60 s"
            time.sleep(0.05)
            self.out.seek(0)
            line = self.out.read()
        self.bootstrap = re.search(r"spate listening on (\S+)", line).group(1)
        self.registry = "http://" + re.search(r"schema registry on ([^,\s]+)", line).group(1)
        self.http = "http://" + re.search(r"http on ([^,\s]+)", line).group(1)
        self.client = SchemaRegistryClient({"url": self.registry})

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def check(name):
    def wrap(f):
        started = time.time()
        try:
            f()
            print(f"ok    {name} ({time.time() - started:.1f} s)", flush=True)
        except Exception as e:  # noqa: BLE001 - every failure is reported the same way
            FAILED.append(name)
            print(f"FAIL  {name}: {type(e).__name__}: {e}", flush=True)
        return f
    return wrap


def http(spate, method, path, body=None, content_type=CT, raw=None):
    """(status, decoded JSON body) of one request to the registry."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(spate.registry + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def ingest(spate, topic, fmt, body):
    """(status, decoded JSON) of one REST Proxy v2 produce to spate's HTTP ingest."""
    req = urllib.request.Request(f"{spate.http}/topics/{topic}", data=json.dumps(body).encode(),
                                 method="POST")
    req.add_header("Content-Type", f"application/vnd.kafka.{fmt}.v2+json")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def consume_raw(spate, topic, n):
    """The first `n` messages of partition 0 of `topic` (key and value bytes)."""
    return read_back({"bootstrap.servers": spate.bootstrap, "group.id": "sr-e2e-raw"}, topic, n,
                     lambda m: (m.key(), m.value()))


def create_topic(spate, topic):
    admin = AdminClient({"bootstrap.servers": spate.bootstrap})
    for f in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        f.result(timeout=20)


def produce(spate, topic, values, serializer):
    producer = Producer({"bootstrap.servers": spate.bootstrap, "acks": "all"})
    ctx = SerializationContext(topic, MessageField.VALUE)
    errors = []
    for v in values:
        producer.produce(topic, value=serializer(v, ctx),
                         on_delivery=lambda err, _m: errors.append(err) if err else None)
    assert producer.flush(30) == 0, "records not delivered"
    assert not errors, errors


def consume(spate, topic, n, deserializer):
    """The first `n` values of partition 0 of `topic`, deserialized."""
    ctx = SerializationContext(topic, MessageField.VALUE)
    return read_back({"bootstrap.servers": spate.bootstrap, "group.id": "sr-e2e"}, topic, n,
                     lambda m: deserializer(m.value(), ctx))


def registry_error(f):
    """The (http status, error code) f raises as a SchemaRegistryError."""
    try:
        f()
    except SchemaRegistryError as e:
        return e.http_status_code, e.error_code
    raise AssertionError("no error raised")


USER_V1 = json.dumps({"type": "record", "name": "User", "namespace": "com.acme", "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": "string"}]})
USER_V2 = json.dumps({"type": "record", "name": "User", "namespace": "com.acme", "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": "string"},
    {"name": "email", "type": ["null", "string"], "default": None}]})
USER_BAD = json.dumps({"type": "record", "name": "User", "namespace": "com.acme", "fields": [
    {"name": "id", "type": "long"}, {"name": "name", "type": "string"}, {"name": "age", "type": "int"}]})
ORDER_JSON = json.dumps({"$schema": "http://json-schema.org/draft-07/schema#", "title": "Order",
                         "type": "object", "properties": {
                             "id": {"type": "integer"}, "item": {"type": "string"},
                             "qty": {"type": "integer", "minimum": 1}},
                         "required": ["id", "item"]})


def proto_file(name, package, deps, messages):
    """A FileDescriptorProto built in code (no protoc needed): messages are (name, [(field,
    number, type, type_name, label)])."""
    f = descriptor_pb2.FileDescriptorProto(name=name, package=package, syntax="proto3")
    f.dependency.extend(deps)
    for mname, fields in messages:
        m = f.message_type.add(name=mname)
        for fname, number, ftype, type_name, label in fields:
            fd = m.field.add(name=fname, number=number, type=ftype,
                             label=label or descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
            if type_name:
                fd.type_name = type_name
    return f


def proto_classes():
    """Message classes for acme/address.proto (Address) and acme/order.proto (Order, importing
    it and google/protobuf/timestamp.proto), in a pool of their own beside the default one."""
    T = descriptor_pb2.FieldDescriptorProto
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    address = proto_file("acme/address.proto", "acme", [], [
        ("Address", [("city", 1, T.TYPE_STRING, None, None), ("zip", 2, T.TYPE_STRING, None, None)])])
    order = proto_file("acme/order.proto", "acme",
                       ["acme/address.proto", "google/protobuf/timestamp.proto"], [
        ("Order", [("id", 1, T.TYPE_STRING, None, None), ("qty", 2, T.TYPE_INT32, None, None),
                   ("at", 3, T.TYPE_MESSAGE, ".google.protobuf.Timestamp", None),
                   ("ship_to", 4, T.TYPE_MESSAGE, ".acme.Address", None),
                   ("tags", 5, T.TYPE_STRING, None, T.LABEL_REPEATED)])])
    pool.Add(address)
    pool.Add(order)
    return (message_factory.GetMessageClass(pool.FindMessageTypeByName("acme.Order")),
            message_factory.GetMessageClass(pool.FindMessageTypeByName("acme.Address")))


def run(spate):
    state = {}

    @check("Avro: AvroSerializer registers the schema, AvroDeserializer reads the records back")
    def _():
        create_topic(spate, "users")
        ser = AvroSerializer(spate.client, USER_V1)
        users = [{"id": i, "name": f"user-{i}"} for i in range(20)]
        produce(spate, "users", users, ser)
        got = consume(spate, "users", 20, AvroDeserializer(SchemaRegistryClient({"url": spate.registry})))
        assert got == users, got[:3]
        latest = spate.client.get_latest_version("users-value")
        assert latest.version == 1 and latest.schema.schema_type == "AVRO", latest
        state["v1_id"] = latest.schema_id

    @check("Avro: a compatible v2 (new field with a default) gets a new id; old and new records both read")
    def _():
        ser = AvroSerializer(spate.client, USER_V2)
        produce(spate, "users", [{"id": 100, "name": "new", "email": "n@example.com"}], ser)
        got = consume(spate, "users", 21, AvroDeserializer(SchemaRegistryClient({"url": spate.registry})))
        assert got[20] == {"id": 100, "name": "new", "email": "n@example.com"}, got[20]
        assert got[0] == {"id": 0, "name": "user-0"}, got[0]
        # A fresh client: this one caches the latest version it saw.
        v2 = SchemaRegistryClient({"url": spate.registry}).get_latest_version("users-value")
        assert v2.version == 2 and v2.schema_id != state["v1_id"], v2
        assert spate.client.get_versions("users-value") == [1, 2]
        # Read with the v2 reader schema: old records get the default.
        reader = AvroDeserializer(SchemaRegistryClient({"url": spate.registry}), USER_V2)
        assert consume(spate, "users", 1, reader)[0] == {"id": 0, "name": "user-0", "email": None}

    @check("Avro: an incompatible schema is refused with 409, through the serializer and the client")
    def _():
        assert registry_error(lambda: spate.client.register_schema(
            "users-value", Schema(USER_BAD, "AVRO"))) == (409, 409)
        ser = AvroSerializer(spate.client, USER_BAD)
        try:
            ser({"id": 1, "name": "x", "age": 3}, SerializationContext("users", MessageField.VALUE))
            raise AssertionError("the serializer registered an incompatible schema")
        except SchemaRegistryError as e:
            assert e.error_code == 409, e
        assert not spate.client.test_compatibility("users-value", Schema(USER_BAD, "AVRO"))
        assert spate.client.test_compatibility("users-value", Schema(USER_V2, "AVRO"))

    @check("JSON Schema: JSONSerializer and JSONDeserializer round-trip through the registry")
    def _():
        create_topic(spate, "orders")
        ser = JSONSerializer(ORDER_JSON, spate.client)
        orders = [{"id": i, "item": f"thing-{i}", "qty": i + 1} for i in range(15)]
        produce(spate, "orders", orders, ser)
        de = JSONDeserializer(None, schema_registry_client=SchemaRegistryClient({"url": spate.registry}))
        assert consume(spate, "orders", 15, de) == orders
        latest = spate.client.get_latest_version("orders-value")
        assert latest.schema.schema_type == "JSON", latest
        # Closing the content model breaks backward compatibility (BACKWARD is the default).
        closed = json.loads(ORDER_JSON)
        closed["additionalProperties"] = False
        assert registry_error(lambda: spate.client.register_schema(
            "orders-value", Schema(json.dumps(closed), "JSON"))) == (409, 409)
        state["order_id"] = latest.schema_id

    @check("Protobuf: ProtobufSerializer registers the schema and its import, ProtobufDeserializer reads back")
    def _():
        Order, Address = proto_classes()
        state["Order"] = Order
        create_topic(spate, "proto-orders")
        ser = ProtobufSerializer(Order, spate.client)
        orders = []
        for i in range(12):
            o = Order(id=f"o-{i}", qty=i + 1, tags=["a", f"t{i}"])
            o.at.seconds = 1_700_000_000 + i
            o.ship_to.CopyFrom(Address(city=f"city-{i}", zip=str(10000 + i)))
            orders.append(o)
        produce(spate, "proto-orders", orders, ser)
        de = ProtobufDeserializer(Order, {}, SchemaRegistryClient({"url": spate.registry}))
        got = consume(spate, "proto-orders", 12, de)
        assert got == orders, (got[:1], orders[:1])
        latest = spate.client.get_latest_version("proto-orders-value")
        assert latest.schema.schema_type == "PROTOBUF", latest
        # The import was registered under its file name (the serializer's default reference
        # strategy) and is referenced by name; the well-known type was not registered.
        refs = [(r.name, r.subject) for r in latest.schema.references]
        assert refs == [("acme/address.proto", "acme/address.proto")], refs
        assert "google/protobuf/timestamp.proto" not in spate.client.get_subjects()
        text = latest.schema.schema_str
        assert "import \"google/protobuf/timestamp.proto\";" in text, text
        assert ".acme.Address ship_to = 4;" in text, text
        assert "PROTOBUF" in http(spate, "GET", "/schemas/types")[1]
        state["proto_id"] = latest.schema_id

    @check("Protobuf: the same schema as .proto text gets the descriptor's id; wire-incompatible changes are 409")
    def _():
        text = spate.client.get_latest_version("proto-orders-value").schema.schema_str
        refs = spate.client.get_latest_version("proto-orders-value").schema.references
        # The text rewritten by hand: other layout, relative names, a comment.
        hand = ("syntax = \"proto3\";\npackage acme;\nimport \"acme/address.proto\";\n"
                "import \"google/protobuf/timestamp.proto\";\n// an order\n"
                "message Order { string id = 1; int32 qty = 2; google.protobuf.Timestamp at = 3;\n"
                "  Address ship_to = 4; repeated string tags = 5; }\n")
        found = SchemaRegistryClient({"url": spate.registry}).lookup_schema(
            "proto-orders-value", Schema(hand, "PROTOBUF", refs))
        assert found.schema_id == state["proto_id"], (found.schema_id, state["proto_id"])
        bad = text.replace("int32 qty = 2;", "string qty = 2;")
        assert bad != text
        assert registry_error(lambda: spate.client.register_schema(
            "proto-orders-value", Schema(bad, "PROTOBUF", refs))) == (409, 409)
        got = http(spate, "POST", "/compatibility/subjects/proto-orders-value/versions/latest?verbose=true",
                   {"schema": bad, "schemaType": "PROTOBUF",
                    "references": [{"name": r.name, "subject": r.subject, "version": r.version} for r in refs]})
        assert got[1]["is_compatible"] is False and "FIELD_SCALAR_KIND_CHANGED" in got[1]["messages"][0], got
        more = text.replace("repeated string tags = 5;", "repeated string tags = 5;\n  int64 total = 6;")
        assert spate.client.register_schema("proto-orders-value", Schema(more, "PROTOBUF", refs)) != state["proto_id"]
        # A schema whose import has no reference is invalid (42201).
        assert registry_error(lambda: spate.client.register_schema(
            "proto-bad-value", Schema(hand, "PROTOBUF"))) == (422, 42201)

    @check("HTTP ingest, Avro: value_schema registers, records in Avro's JSON encoding; AvroDeserializer reads them")
    def _():
        create_topic(spate, "http-avro")
        schema = json.dumps({"type": "record", "name": "Click", "namespace": "web", "fields": [
            {"name": "url", "type": "string"}, {"name": "ms", "type": "long"},
            {"name": "ref", "type": ["null", "string"], "default": None},
            {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["VIEW", "BUY"]}}]})
        records = [{"key": f"user-{i}", "value": {"url": f"/p/{i}", "ms": 1000 + i,
                                                 "ref": {"string": "home"} if i % 2 else None,
                                                 "kind": "BUY" if i % 3 == 0 else "VIEW"}}
                   for i in range(6)]
        status, body = ingest(spate, "http-avro", "avro",
                              {"key_schema": json.dumps("string"), "value_schema": schema, "records": records})
        assert status == 200, (status, body)
        assert body["value_schema_id"] and body["key_schema_id"], body
        assert [o["offset"] for o in body["offsets"]] == list(range(6)), body
        # The same schema again by id (another request): the same id, no new version.
        status, again = ingest(spate, "http-avro", "avro", {"value_schema_id": body["value_schema_id"],
                                                           "records": [{"value": records[0]["value"]}]})
        assert status == 200 and again["value_schema_id"] == body["value_schema_id"], again
        assert again["key_schema_id"] is None, again
        assert spate.client.get_versions("http-avro-value") == [1]
        de = AvroDeserializer(SchemaRegistryClient({"url": spate.registry}))
        key_ctx = SerializationContext("http-avro", MessageField.KEY)
        value_ctx = SerializationContext("http-avro", MessageField.VALUE)
        got = consume_raw(spate, "http-avro", 7)
        want = [{"url": f"/p/{i}", "ms": 1000 + i, "ref": "home" if i % 2 else None,
                 "kind": "BUY" if i % 3 == 0 else "VIEW"} for i in range(6)]
        assert [de(v, value_ctx) for _, v in got[:6]] == want, got[:2]
        assert [de(k, key_ctx) for k, _ in got[:6]] == [f"user-{i}" for i in range(6)]
        assert got[6][0] is None and de(got[6][1], value_ctx) == want[0]
        state["http_avro_id"] = body["value_schema_id"]

    @check("HTTP ingest, JSON Schema: records validated and written as JSON; JSONDeserializer reads them")
    def _():
        create_topic(spate, "http-json")
        records = [{"value": {"id": i, "item": f"thing-{i}", "qty": i + 1}} for i in range(5)]
        status, body = ingest(spate, "http-json", "jsonschema", {"value_schema": ORDER_JSON, "records": records})
        assert status == 200 and body["value_schema_id"], (status, body)
        de = JSONDeserializer(None, schema_registry_client=SchemaRegistryClient({"url": spate.registry}))
        assert consume(spate, "http-json", 5, de) == [r["value"] for r in records]
        assert spate.client.get_latest_version("http-json-value").schema.schema_type == "JSON"
        # qty below its minimum: the record is named, nothing is written.
        bad = [records[0], {"value": {"id": 9, "item": "x", "qty": 0}}]
        status, err = ingest(spate, "http-json", "jsonschema", {"value_schema_id": body["value_schema_id"],
                                                               "records": bad})
        assert (status, err["error_code"]) == (422, 42203), (status, err)
        assert "records[1].value" in err["message"] and "/qty" in err["message"], err

    @check("HTTP ingest, Protobuf: .proto value_schema, records in Protobuf's JSON mapping; ProtobufDeserializer reads them")
    def _():
        create_topic(spate, "http-proto")
        proto = ("syntax = \"proto3\";\npackage shop;\n"
                 "message Item { string sku = 1; int32 count = 2; repeated string tags = 3; }\n")
        records = [{"value": {"sku": f"s-{i}", "count": i, "tags": ["x", str(i)]}} for i in range(4)]
        status, body = ingest(spate, "http-proto", "protobuf", {"value_schema": proto, "records": records})
        assert status == 200 and body["value_schema_id"], (status, body)
        T = descriptor_pb2.FieldDescriptorProto
        pool = descriptor_pool.DescriptorPool()
        pool.Add(proto_file("item.proto", "shop", [], [("Item", [
            ("sku", 1, T.TYPE_STRING, None, None), ("count", 2, T.TYPE_INT32, None, None),
            ("tags", 3, T.TYPE_STRING, None, T.LABEL_REPEATED)])]))
        Item = message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Item"))
        de = ProtobufDeserializer(Item, {}, SchemaRegistryClient({"url": spate.registry}))
        got = consume(spate, "http-proto", 4, de)
        assert got == [Item(sku=f"s-{i}", count=i, tags=["x", str(i)]) for i in range(4)], got
        status, err = ingest(spate, "http-proto", "protobuf", {"value_schema_id": body["value_schema_id"],
                                                              "records": [{"value": {"sku": 5}}]})
        assert (status, err["error_code"]) == (422, 42203) and "records[0].value" in err["message"], err

    @check("HTTP ingest, bad cases: no schema 42202, invalid schema 42201, unknown id 40403, incompatible 409, wrong type")
    def _():
        cases = [
            ("avro", {"records": [{"value": {"a": 1}}]}, 42202, "value_schema"),
            ("avro", {"value_schema_id": state["http_avro_id"], "records": [{"key": "k", "value": {}}]},
             42201, "records[0].key"),
            ("avro", {"value_schema": "{\"type\": \"recrod\"}", "records": [{"value": {}}]}, 42201,
             "value_schema: invalid schema"),
            ("avro", {"value_schema_id": 987654, "records": [{"value": {}}]}, 40403, "987654"),
            ("avro", {"value_schema": json.dumps({"type": "record", "name": "Click", "namespace": "web",
                                                  "fields": [{"name": "other", "type": "int"}]}),
                      "records": [{"value": {"other": 1}}]}, 409, "incompatible"),
            ("protobuf", {"value_schema_id": state["http_avro_id"], "records": [{"value": {}}]}, 42201,
             "AVRO schema, not PROTOBUF"),
            ("avro", {"value_schema_id": state["http_avro_id"],
                      "records": [{"value": {"url": "/", "ms": 1, "kind": "VIEW"}},
                                  {"value": {"url": "/", "ms": "soon", "kind": "VIEW"}}]},
             42203, "records[1].value: ms: expected a long"),
        ]
        for fmt, body, code, text in cases:
            status, err = ingest(spate, "http-avro", fmt, body)
            assert (status, err["error_code"]) == (422, code), (body, status, err)
            assert text in err["message"], (text, err)
        # Nothing of a refused request was written: still the 7 records of the first check.
        c = Consumer({"bootstrap.servers": spate.bootstrap, "group.id": "sr-e2e-wm"})
        try:
            assert c.get_watermark_offsets(TopicPartition("http-avro", 0), timeout=10)[1] == 7
        finally:
            c.close()

    @check("ids are global: the same schema in another subject gets the same id, a new version there")
    def _():
        sid = spate.client.register_schema("copy-value", Schema(USER_V1, "AVRO"))
        assert sid == state["v1_id"], (sid, state["v1_id"])
        assert spate.client.get_latest_version("copy-value").version == 1
        subjects = spate.client.get_subjects()
        assert {"users-value", "orders-value", "copy-value"} <= set(subjects), subjects
        versions = {(v.subject, v.version) for v in spate.client.get_schema_versions(sid)}
        assert versions == {("users-value", 1), ("copy-value", 1)}, versions

    @check("references: a record referencing another subject's record; referencedby; delete refused")
    def _():
        address = json.dumps({"type": "record", "name": "Address", "namespace": "com.acme",
                              "fields": [{"name": "city", "type": "string"}]})
        spate.client.register_schema("address", Schema(address, "AVRO"))
        person = json.dumps({"type": "record", "name": "Person", "namespace": "com.acme",
                             "fields": [{"name": "home", "type": "Address"}]})
        ref = SchemaReference("com.acme.Address", "address", 1)
        pid = spate.client.register_schema("person-value", Schema(person, "AVRO", [ref]))
        assert spate.client.get_referenced_by("address", 1) == [pid]
        assert registry_error(lambda: spate.client.delete_version("address", 1)) == (422, 42206)
        got = spate.client.get_schema(pid)
        assert [r.name for r in got.references] == ["com.acme.Address"], got
        missing = SchemaReference("com.acme.Nope", "no-such-subject", 1)
        assert registry_error(lambda: spate.client.register_schema(
            "person2-value", Schema(person, "AVRO", [missing]))) == (422, 42201)

    @check("normalize: two spellings of one schema are one schema when normalized")
    def _():
        a = json.dumps({"type": "record", "name": "N", "namespace": "x",
                        "fields": [{"name": "a", "type": {"type": "string"}}]})
        b = json.dumps({"name": "x.N", "type": "record", "fields": [{"type": "string", "name": "a"}]})
        sid = spate.client.register_schema("norm", Schema(a, "AVRO"), normalize_schemas=True)
        found = spate.client.lookup_schema("norm", Schema(b, "AVRO"), normalize_schemas=True)
        assert found.schema_id == sid and found.version == 1, found
        # The registry stored the normalized form (b is written that way already): without
        # normalizing, a's spelling is not found (a fresh client: lookups are cached).
        plain = SchemaRegistryClient({"url": spate.registry})
        assert plain.lookup_schema("norm", Schema(b, "AVRO")).schema_id == sid
        assert registry_error(lambda: plain.lookup_schema("norm", Schema(a, "AVRO"))) == (404, 40403)

    @check("compatibility levels per subject and globally; modes")
    def _():
        assert spate.client.get_compatibility() == "BACKWARD"
        spate.client.set_compatibility("users-value", "NONE")
        assert spate.client.get_compatibility("users-value") == "NONE"
        spate.client.register_schema("users-value", Schema(USER_BAD, "AVRO"))
        spate.client.set_compatibility("copy-value", "FULL_TRANSITIVE")
        spate.client.set_compatibility(level="FORWARD")
        assert spate.client.get_compatibility() == "FORWARD"
        spate.client.update_mode("locked", "READONLY")
        assert spate.client.get_mode("locked") == "READONLY"
        assert registry_error(lambda: spate.client.register_schema(
            "locked", Schema(USER_V1, "AVRO"))) == (422, 42205)
        assert registry_error(lambda: spate.client.set_compatibility(level="SIDEWAYS")) == (422, 42203)

    @check("deletes: soft, then permanent; soft-deleted versions hidden but listed with deleted=true")
    def _():
        spate.client.register_schema("gone-value", Schema(USER_V1, "AVRO"))
        spate.client.register_schema("gone-value", Schema(USER_V2, "AVRO"))
        assert spate.client.delete_version("gone-value", 1) == 1
        assert spate.client.get_versions("gone-value") == [2]
        assert http(spate, "GET", "/subjects/gone-value/versions?deleted=true") == (200, [1, 2])
        assert registry_error(lambda: spate.client.delete_subject("gone-value", permanent=True)) == (404, 40405)
        assert spate.client.delete_subject("gone-value") == [2]
        assert "gone-value" not in spate.client.get_subjects()
        assert "gone-value" in spate.client.get_subjects(deleted=True)
        spate.client.register_schema("purged-value", Schema(json.dumps(
            {"type": "record", "name": "Purged", "fields": [{"name": "p", "type": "int"}]}), "AVRO"))
        spate.client.delete_subject("purged-value")
        assert spate.client.delete_subject("purged-value", permanent=True) == [1]
        assert "purged-value" not in spate.client.get_subjects(deleted=True)

    @check("bad input: Confluent's error codes")
    def _():
        cases = [
            ("GET", "/subjects/nobody/versions", None, 404, 40401),
            ("GET", "/subjects/users-value/versions/99", None, 404, 40402),
            ("GET", "/subjects/users-value/versions/first", None, 422, 42202),
            ("GET", "/schemas/ids/987654", None, 404, 40403),
            ("POST", "/subjects/x-value/versions", {"schema": "{\"type\": \"recrod\"}"}, 422, 42201),
            ("POST", "/subjects/x-value/versions", {"schema": "this is not json"}, 422, 42201),
            ("POST", "/subjects/x-value/versions", {"schema": "{\"type\": \"strin\"}", "schemaType": "JSON"}, 422, 42201),
            ("POST", "/subjects/x-value/versions", {"schema": "message M {", "schemaType": "PROTOBUF"}, 422, 42201),
            ("POST", "/subjects/x-value/versions", {"schema": "\"" + "a" * (5 << 20) + "\""}, 422, 42201),
            ("PUT", "/mode", {"mode": "SOMETIMES"}, 422, 42204),
        ]
        for method, path, body, status, code in cases:
            got = http(spate, method, path, body)
            assert (got[0], (got[1] or {}).get("error_code")) == (status, code), (method, path, got)
        got = http(spate, "POST", "/subjects/x-value/versions", raw=b"{not json")
        assert got[0] == 400 and got[1]["error_code"] == 400, got
        got = http(spate, "POST", "/subjects/x-value/versions", raw=b"{}", content_type="text/plain")
        assert got[0] == 415, got
        # A body declared over 16 MiB is refused before it is sent.
        host, port = spate.registry[len("http://"):].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(b"POST /subjects/big/versions HTTP/1.1\r\nHost: x\r\nContent-Type: " + CT.encode()
                      + b"\r\nContent-Length: " + str(17 << 20).encode() + b"\r\n\r\n" + b"{" * 1024)
            answer = s.recv(65536).decode(errors="replace")
        assert answer.startswith("HTTP/1.1 413") and '"error_code":413' in answer, answer[:300]

    @check("metrics: the registry's counters are on /metrics")
    def _():
        # The HTTP listener is not printed with the registry's; find it in the start line.
        spate.out.seek(0)
        http_addr = re.search(r"http on ([^,\s]+)", spate.out.read()).group(1)
        text = urllib.request.urlopen(f"http://{http_addr}/metrics", timeout=10).read().decode()
        assert "spate_schema_registry_requests_total" in text
        assert 'spate_schema_registry_errors_total{error_code="40401"}' in text
        assert re.search(r"^spate_schema_registry_schemas [1-9]", text, re.M), "no schemas counted"
        subjects = spate.client.get_subjects()
        counted = re.search(r"^spate_schema_registry_subjects (\S+)$", text, re.M)
        assert counted and float(counted.group(1)) == len(subjects), (counted, subjects)
        assert re.search(r"^spate_schema_registry_requests_total [1-9]", text, re.M), "no requests"

    @check("/admin shows the registry's state: listen address, leader, counts, mode, compatibility")
    def _():
        def admin(path):
            return json.loads(urllib.request.urlopen(spate.http + path, timeout=10).read())
        st = admin("/admin/schema-registry")
        text = urllib.request.urlopen(spate.http + "/metrics", timeout=10).read().decode()
        schemas = int(float(re.search(r"^spate_schema_registry_schemas (\S+)$", text, re.M).group(1)))
        ids = [spate.client.get_latest_version(s).schema_id for s in spate.client.get_subjects()]
        assert st["enabled"] is True and st["leader"] is True and st["writer"] is None, st
        assert "http://" + st["listen"] == spate.registry, (st, spate.registry)
        assert st["subjects"] == len(spate.client.get_subjects()), st
        assert st["schemas"] == schemas and st["next_id"] > max(ids), (st, schemas, ids)
        assert st["mode"] == http(spate, "GET", "/mode")[1]["mode"], st
        assert st["compatibility"] == http(spate, "GET", "/config")[1]["compatibilityLevel"], st
        assert admin("/admin/broker")["schema_registry"] == st

    # Everything a client can see, before and after kill -9.
    views = ["/subjects", "/subjects?deleted=true", "/subjects/users-value/versions",
             "/subjects/gone-value/versions?deleted=true", "/subjects/users-value/versions/latest",
             "/subjects/person-value/versions/1", "/schemas/ids/1", "/schemas/ids/1/versions",
             "/config", "/config/users-value", "/config/copy-value", "/mode/locked",
             "/subjects/address/versions/1/referencedby"]

    @check("kill -9 and restart: ids, versions, configs, modes and deletes survive; ids go on")
    def _():
        before = [http(spate, "GET", v) for v in views]
        max_id = max(spate.client.get_latest_version(s).schema_id for s in spate.client.get_subjects())
        spate.kill9()
        spate.start()
        after = [http(spate, "GET", v) for v in views]
        for v, b, a in zip(views, before, after):
            assert a == b, (v, b, a)
        # The records written before the kill still decode, their schemas fetched by id from
        # the restarted registry.
        got = consume(spate, "users", 21, AvroDeserializer(spate.client))
        assert got[0] == {"id": 0, "name": "user-0"} and got[20]["email"] == "n@example.com"
        de = JSONDeserializer(None, schema_registry_client=spate.client)
        assert consume(spate, "orders", 1, de)[0]["item"] == "thing-0"
        de = ProtobufDeserializer(state["Order"], {}, SchemaRegistryClient({"url": spate.registry}))
        assert consume(spate, "proto-orders", 1, de)[0].ship_to.city == "city-0"
        new = spate.client.register_schema("after-restart", Schema(json.dumps(
            {"type": "record", "name": "Fresh", "fields": [{"name": "f", "type": "int"}]}), "AVRO"))
        assert new > max_id, (new, max_id)


def main():
    with tempfile.TemporaryDirectory() as data:
        spate = Spate(data)
        try:
            run(spate)
        finally:
            spate.stop()
    if FAILED:
        sys.exit(f"{len(FAILED)} check(s) failed: {FAILED}")
    print("schema registry e2e: all checks passed")


if __name__ == "__main__":
    main()
