"""The built-in schema registry on a 3-node cluster (scripts/with-spate-cluster.sh with
--schema-registry-listen): every node answers reads from its replica of _schemas; the node
leading _schemas takes writes and the others refuse them with 50003 naming it; after kill -9
of that node, registration goes on at the new leader with ids and versions continuing (none
handed out twice), and confluent-kafka's AvroSerializer/AvroDeserializer work across nodes.
Needs SPATE_BOOTSTRAP, SPATE_LOG and SPATE_NODE_PIDS (with-spate-cluster.sh)."""
import json
import os
import re
import signal
import time
import urllib.error
import urllib.request

from confluent_kafka import Consumer, OFFSET_BEGINNING, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

CT = "application/vnd.schemaregistry.v1+json"
work = os.path.dirname(os.path.dirname(os.environ["SPATE_LOG"]))
pids = dict(p.split("=") for p in os.environ["SPATE_NODE_PIDS"].split())
registries = {}
for n in ("1", "2", "3"):
    line = open(os.path.join(work, f"node{n}", "stdout")).read()
    registries[n] = "http://" + re.search(r"schema registry on ([^,\s]+)", line).group(1)


def http(base, method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", CT)
    try:
        with urllib.request.urlopen(req, timeout=40) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")
    except OSError as e:
        return 0, {"error": str(e)}


def record(i):
    return json.dumps({"type": "record", "name": f"R{i}", "fields": [{"name": "f", "type": "long"}]})


def register(node, subject, i):
    return http(registries[node], "POST", f"/subjects/{subject}/versions", {"schema": record(i)})


def wait_for_writer(nodes, subject, i, seconds):
    """The node that takes a registration (retrying while _schemas has no leader), and the id."""
    deadline = time.time() + seconds
    seen = {}
    while time.time() < deadline:
        for n in nodes:
            status, v = register(n, subject, i)
            if status == 200:
                return n, v["id"]
            seen[n] = (status, v)
        time.sleep(0.2)
    raise AssertionError(f"no node took the registration within {seconds} s: {seen}")


def eventually(f, what, seconds=20):
    deadline = time.time() + seconds
    while True:
        got = f()
        if got:
            return got
        assert time.time() < deadline, what
        time.sleep(0.1)


nodes = ["1", "2", "3"]
# Each subject at NONE so unrelated records follow each other.
leader, first = wait_for_writer(nodes, "s", 0, 60)
print(f"node {leader} leads _schemas; first id {first}", flush=True)
assert http(registries[leader], "PUT", "/config", {"compatibility": "NONE"})[0] == 200
ids = [first] + [register(leader, "s", i)[1]["id"] for i in range(1, 5)]
assert ids == list(range(first, first + 5)), ids
for n in nodes:
    if n == leader:
        continue
    status, v = register(n, "s", 99)
    assert status == 500 and v["error_code"] == 50003 and f"node {leader}" in v["message"], (n, status, v)
    # Reads on every node, once its replica has caught up.
    eventually(lambda n=n: http(registries[n], "GET", "/subjects/s/versions")[1] == [1, 2, 3, 4, 5],
               f"node {n} never showed the five versions")
    stored = http(registries[n], "GET", f"/schemas/ids/{ids[-1]}")[1]["schema"]
    assert json.loads(stored) == json.loads(record(4)), stored
print("reads on every node, writes refused off the leader (50003)", flush=True)

# Avro through the leader's registry, read back through another node's.
bootstrap = os.environ["SPATE_BOOTSTRAP"]
admin = AdminClient({"bootstrap.servers": bootstrap})
for f in admin.create_topics([NewTopic("avro-cluster", 1, 3)]).values():
    f.result(timeout=30)
user = json.dumps({"type": "record", "name": "User", "fields": [{"name": "id", "type": "long"}]})
ser = AvroSerializer(SchemaRegistryClient({"url": registries[leader]}), user)
producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
ctx = SerializationContext("avro-cluster", MessageField.VALUE)
for i in range(10):
    producer.produce("avro-cluster", value=ser({"id": i}, ctx))
assert producer.flush(30) == 0
other = next(n for n in nodes if n != leader)
eventually(lambda: http(registries[other], "GET", "/subjects/avro-cluster-value/versions")[0] == 200,
           "the Avro subject never reached another node")
de = AvroDeserializer(SchemaRegistryClient({"url": registries[other]}))
consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "sr-cluster", "enable.auto.commit": False})
consumer.assign([TopicPartition("avro-cluster", 0, OFFSET_BEGINNING)])
got, deadline = [], time.time() + 30
while len(got) < 10:
    assert time.time() < deadline, f"read {len(got)} of 10"
    m = consumer.poll(0.5)
    if m is not None and m.error() is None:
        got.append(de(m.value(), ctx))
consumer.close()
assert got == [{"id": i} for i in range(10)], got
print("AvroSerializer via the leader, AvroDeserializer via another node", flush=True)

# Kill the node that hands out ids; registration goes on at the new leader.
highest = max(http(registries[other], "GET", "/subjects/avro-cluster-value/versions/latest")[1]["id"], ids[-1])
os.kill(int(pids[leader]), signal.SIGKILL)
rest = [n for n in nodes if n != leader]
new_leader, new_id = wait_for_writer(rest, "s", 5, 90)
print(f"after kill -9 of node {leader}: node {new_leader} took the registration, id {new_id}", flush=True)
assert new_id > highest, (new_id, highest)
versions = http(registries[new_leader], "GET", "/subjects/s/versions")[1]
assert versions == [1, 2, 3, 4, 5, 6], versions
# The surviving follower agrees.
follower = next(n for n in rest if n != new_leader)
eventually(lambda: http(registries[follower], "GET", "/subjects/s/versions/latest")[1].get("id") == new_id,
           "the surviving follower never saw the new version")
print("schema registry cluster e2e: all checks passed")
