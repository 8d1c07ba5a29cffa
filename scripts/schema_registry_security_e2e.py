"""The schema registry with security on (see scripts/schema-registry-security-e2e.sh): users
admin (super user), alice (Write on topic orders, nothing on the cluster) and bob (Read on topic
other only). confluent-kafka's SchemaRegistryClient with basic.auth.user.info works for alice,
AvroSerializer and AvroDeserializer included; no credentials or a wrong password is 401
(40101); bob gets 403 (40301) on orders-value and does not see it listed; the global config
needs AlterConfigs on the cluster (admin may, alice may not); the node's HTTP listener path to
the registry checks the same credentials; a schema whose references name a subject of a topic
the caller may not describe is 403. Every HTTP listener serves HTTPS (a plain-HTTP request
gets no answer), trusted through SCHEMA_REGISTRY_CA. Needs SPATE_BOOTSTRAP, SPATE_HTTP and
SPATE_LOG (with-spate.sh) and SCHEMA_REGISTRY_CA."""
import base64
import http.client
import json
import os
import re
import ssl
import time
import urllib.error
import urllib.request

from confluent_kafka import Producer
from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, AdminClient,
                                   NewTopic, ResourcePatternType, ResourceType)
from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

from read_back import read_back

CT = "application/vnd.schemaregistry.v1+json"
work = os.path.dirname(os.environ["SPATE_LOG"])
line = open(os.path.join(work, "stdout")).read()
registry_addr = re.search(r"schema registry on ([^,\s]+)", line).group(1)
registry = "https://" + registry_addr
bootstrap = os.environ["SPATE_BOOTSTRAP"]
http_listener = "https://" + os.environ["SPATE_HTTP"]
CA = os.environ["SCHEMA_REGISTRY_CA"]
TLS = ssl.create_default_context(cafile=CA)
USERS = {"admin": "admin-secret", "alice": "alice-secret", "bob": "bob-secret"}


def kafka(user):
    return {"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN", "sasl.username": user, "sasl.password": USERS[user]}


def client(user=None, password=None):
    conf = {"url": registry, "ssl.ca.location": CA}
    if user:
        conf["basic.auth.user.info"] = f"{user}:{password or USERS[user]}"
    return SchemaRegistryClient(conf)


def refused(f, status, code):
    """Calls f and checks it fails with this HTTP status and Confluent error code."""
    try:
        got = f()
    except SchemaRegistryError as e:
        assert (e.http_status_code, e.error_code) == (status, code), (e.http_status_code, e.error_code, e)
        return
    raise AssertionError(f"expected {status}/{code}, got {got!r}")


def raw(base, method, path, user=None, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", CT)
    if user:
        token = base64.b64encode(f"{user}:{USERS[user]}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(req, timeout=30, context=TLS) as r:
            return r.status, dict(r.headers), json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read() or b"null")


# ACLs, created by the super user through the Kafka protocol.
admin = AdminClient(kafka("admin"))
topics = [NewTopic(t, 1, 1) for t in ("orders", "other", "shared", "secret")]
for f in admin.create_topics(topics).values():
    f.result(timeout=30)
acls = [
    AclBinding(ResourceType.TOPIC, "orders", ResourcePatternType.LITERAL, "User:alice", "*",
               AclOperation.WRITE, AclPermissionType.ALLOW),
    AclBinding(ResourceType.TOPIC, "other", ResourcePatternType.LITERAL, "User:bob", "*",
               AclOperation.READ, AclPermissionType.ALLOW),
    AclBinding(ResourceType.TOPIC, "shared", ResourcePatternType.LITERAL, "User:alice", "*",
               AclOperation.DESCRIBE, AclPermissionType.ALLOW),
]
for f in admin.create_acls(acls).values():
    f.result(timeout=30)
print("ACLs: alice Write on orders and Describe on shared, bob Read on other", flush=True)

# Every HTTP listener speaks HTTPS only: a plain-HTTP request gets no answer.
for addr in (registry_addr, os.environ["SPATE_HTTP"]):
    try:
        with urllib.request.urlopen(f"http://{addr}/subjects", timeout=10) as r:
            raise AssertionError(f"plain HTTP to {addr} answered {r.status}")
    except (OSError, http.client.HTTPException) as e:
        assert not isinstance(e, urllib.error.HTTPError), f"plain HTTP to {addr} answered {e.code}"
print("plain HTTP to the registry and to the HTTP listener: refused (HTTPS only)", flush=True)

# alice: registers through the serializer (Write on orders), reads back (Describe implied).
user_schema = json.dumps({"type": "record", "name": "Order",
                          "fields": [{"name": "id", "type": "long"}]})
deadline = time.time() + 30
while True:
    # ACLs reach the authorizer asynchronously: retried briefly while still refused.
    try:
        alice = client("alice")
        ser = AvroSerializer(alice, user_schema)
        ctx = SerializationContext("orders", MessageField.VALUE)
        first = ser({"id": 0}, ctx)
        break
    except SchemaRegistryError as e:
        assert e.http_status_code == 403 and time.time() < deadline, e
        time.sleep(0.2)
producer = Producer(kafka("alice"))
producer.produce("orders", value=first)
for i in range(1, 5):
    producer.produce("orders", value=ser({"id": i}, ctx))
assert producer.flush(30) == 0
de = AvroDeserializer(client("alice"))
got = read_back({**kafka("admin"), "group.id": "sr-security"}, "orders", 5, lambda m: de(m.value(), ctx))
assert got == [{"id": i} for i in range(5)], got
alice = client("alice")
latest = alice.get_latest_version("orders-value")
assert alice.get_subjects() == ["orders-value"]
print(f"alice: AvroSerializer registered id {latest.schema_id}; AvroDeserializer read 5 records", flush=True)

# No credentials, a wrong password, an unknown user: 401 (40101) with a Basic challenge.
refused(lambda: client().get_subjects(), 401, 40101)
refused(lambda: client("alice", "wrong").get_subjects(), 401, 40101)
refused(lambda: client("mallory", "x").get_latest_version("orders-value"), 401, 40101)
status, headers, body = raw(registry, "GET", "/subjects")
assert status == 401 and body["error_code"] == 40101, (status, body)
assert headers.get("WWW-Authenticate", headers.get("www-authenticate", "")).startswith("Basic"), headers
print("no or wrong credentials: 401 (40101)", flush=True)

# bob: no ACL on orders.
bob = client("bob")
refused(lambda: bob.register_schema("orders-value", Schema(user_schema, "AVRO")), 403, 40301)
refused(lambda: bob.get_latest_version("orders-value"), 403, 40301)
refused(lambda: bob.get_schema(latest.schema_id), 403, 40301)
refused(lambda: bob.delete_subject("orders-value"), 403, 40301)
assert bob.get_subjects() == [], bob.get_subjects()
# bob may use subjects of the topic he reads (Describe is implied by Read) but not register.
refused(lambda: bob.register_schema("other-value", Schema(user_schema, "AVRO")), 403, 40301)
refused(lambda: bob.get_latest_version("other-value"), 404, 40401)
print("bob: 403 (40301) on orders-value, not listed; cannot register under other-value", flush=True)

# References: alice may build on a subject whose topic she may describe (shared), not on one
# she may not (secret), neither to register nor to look up.
admin_sr = client("admin")
for subject, name in (("shared-value", "Shared"), ("secret-value", "Secret")):
    admin_sr.register_schema(subject, Schema(json.dumps(
        {"type": "record", "name": name, "fields": [{"name": "a", "type": "long"}]}), "AVRO"))


def key_using(name, subject):
    text = json.dumps({"type": "record", "name": "Key", "fields": [{"name": "k", "type": name}]})
    return Schema(text, "AVRO", [SchemaReference(name, subject, 1)])


refused(lambda: alice.register_schema("orders-key", key_using("Secret", "secret-value")), 403, 40301)
refused(lambda: alice.lookup_schema("orders-key", key_using("Secret", "secret-value")), 403, 40301)
key_id = alice.register_schema("orders-key", key_using("Shared", "shared-value"))
assert alice.lookup_schema("orders-key", key_using("Shared", "shared-value")).schema_id == key_id
print("references: 403 (40301) naming secret-value, registered naming shared-value", flush=True)

# The global config: AlterConfigs on the cluster. alice may not, admin (super user) may.
refused(lambda: alice.set_compatibility(level="NONE"), 403, 40301)
refused(lambda: alice.delete_subject("orders-value"), 403, 40301)
admin_sr.set_compatibility(level="FULL")
assert admin_sr.get_compatibility() == "FULL"
assert alice.get_compatibility() == "FULL"
print("global config: 403 for alice, set by admin", flush=True)

# The HTTP listener's path to the registry (used for forwarded writes) checks the same.
path = "/_spate/schema-registry/subjects/orders-value/versions"
status, _, body = raw(http_listener, "POST", path, body={"schema": user_schema})
assert status == 401 and body["error_code"] == 40101, (status, body)
status, _, body = raw(http_listener, "POST", path, user="bob", body={"schema": user_schema})
assert status == 403 and body["error_code"] == 40301, (status, body)
status, _, body = raw(http_listener, "POST", path, user="alice", body={"schema": user_schema})
assert status == 200 and body == {"id": latest.schema_id}, (status, body)
print("the HTTP listener's registry path: 401, 403 and 200 as on the registry's own", flush=True)
print("schema registry security e2e: all checks passed")
