"""The built-in schema registry on a 3-node cluster (scripts/with-spate-cluster.sh with
--schema-registry-listen): every node answers reads from its replica of _schemas; the node
leading _schemas assigns ids and the others forward writes to it (one hop, answers relayed),
so a registration sent to any node gets the id the leader gives; /admin/schema-registry says
which node leads; after kill -9 of that node, registration through a surviving node that does
not lead goes on with ids and versions continuing (none handed out twice), and
confluent-kafka's AvroSerializer/AvroDeserializer work across nodes.
Needs SPATE_BOOTSTRAP, SPATE_HTTP_ALL, SPATE_LOG and SPATE_NODE_PIDS (with-spate-cluster.sh)."""
import json
import os
import re
import signal
import time
import urllib.error
import urllib.request

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from read_back import read_back

CT = "application/vnd.schemaregistry.v1+json"
work = os.path.dirname(os.path.dirname(os.environ["SPATE_LOG"]))
pids = dict(p.split("=") for p in os.environ["SPATE_NODE_PIDS"].split())
admin_http = dict(zip(("1", "2", "3"), ("http://" + h for h in os.environ["SPATE_HTTP_ALL"].split(","))))
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


def registry_status(node):
    return http(admin_http[node], "GET", "/admin/schema-registry")[1]


def wait_for_leader(nodes, seconds):
    """The node whose /admin/schema-registry says it takes writes, once the others agree."""
    deadline = time.time() + seconds
    seen = {}
    while time.time() < deadline:
        seen = {n: registry_status(n) for n in nodes}
        leaders = [n for n, st in seen.items() if st and st.get("leader")]
        if len(leaders) == 1 and all(st.get("writer") == int(leaders[0])
                                     for n, st in seen.items() if n != leaders[0]):
            return leaders[0]
        time.sleep(0.2)
    raise AssertionError(f"no single registry leader within {seconds} s: {seen}")


def register_through(node, subject, i, seconds):
    """Registers through `node`, retrying while _schemas has no leader (50003); the id."""
    deadline = time.time() + seconds
    while True:
        status, v = register(node, subject, i)
        if status == 200:
            return v["id"]
        assert status == 500 and v.get("error_code") == 50003, (node, status, v)
        assert time.time() < deadline, f"node {node} never took the registration: {v}"
        time.sleep(0.2)


def ingest(node, topic, body):
    """(status, decoded JSON) of one REST Proxy v2 Avro produce to `node`'s HTTP ingest."""
    req = urllib.request.Request(f"{admin_http[node]}/topics/{topic}", data=json.dumps(body).encode(),
                                 method="POST")
    req.add_header("Content-Type", "application/vnd.kafka.avro.v2+json")
    try:
        with urllib.request.urlopen(req, timeout=40) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def metric(node, name):
    req = urllib.request.Request(admin_http[node] + "/metrics")
    with urllib.request.urlopen(req, timeout=10) as r:
        text = r.read().decode()
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def eventually(f, what, seconds=20):
    deadline = time.time() + seconds
    while True:
        got = f()
        if got:
            return got
        assert time.time() < deadline, what
        time.sleep(0.1)


nodes = ["1", "2", "3"]
# The first registration may come before _schemas has a leader: retried through node 1.
first = register_through("1", "s", 0, 60)
leader = wait_for_leader(nodes, 30)
followers = [n for n in nodes if n != leader]
st = registry_status(leader)
assert st["enabled"] and st["listen"] in registries[leader] and st["subjects"] == 1, st
print(f"node {leader} leads _schemas; first id {first}", flush=True)
# Each subject at NONE so unrelated records follow each other; set through a follower.
status, v = http(registries[followers[0]], "PUT", "/config", {"compatibility": "NONE"})
assert (status, v) == (200, {"compatibility": "NONE"}), (status, v)
assert http(registries[leader], "GET", "/config")[1]["compatibilityLevel"] == "NONE"
# New schemas through every node, the leader and both followers: one sequence of ids.
ids = [first]
for i, n in zip(range(1, 5), [leader, followers[0], followers[1], leader]):
    status, v = register(n, "s", i)
    assert status == 200, (n, status, v)
    ids.append(v["id"])
assert ids == list(range(first, first + 5)), ids
for n in nodes:
    # The same schema through any node: the id the leader gave, no new version.
    for i in range(5):
        status, v = register(n, "s", i)
        assert (status, v) == (200, {"id": ids[i]}), (n, i, status, v)
    # Reads on every node, once its replica has caught up.
    eventually(lambda n=n: http(registries[n], "GET", "/subjects/s/versions")[1] == [1, 2, 3, 4, 5],
               f"node {n} never showed the five versions")
    stored = http(registries[n], "GET", f"/schemas/ids/{ids[-1]}")[1]["schema"]
    assert json.loads(stored) == json.loads(record(4)), stored
# A client reads its own writes on the follower it wrote through, at once: the follower reads
# _schemas as far as the leader had applied the write before it answers.
for i in range(10):
    f = followers[i % 2]
    status, v = http(registries[f], "POST", "/subjects/ryw/versions", {"schema": record(100 + i)})
    assert status == 200, (f, status, v)
    status, latest = http(registries[f], "GET", "/subjects/ryw/versions/latest")
    assert status == 200 and latest["id"] == v["id"] and latest["version"] == i + 1, (f, i, status, latest)
    level = ["FULL", "BACKWARD"][i % 2]
    status, c = http(registries[f], "PUT", "/config/ryw", {"compatibility": "NONE" if i < 9 else level})
    assert status == 200, (f, status, c)
    status, c = http(registries[f], "GET", "/config/ryw")
    assert status == 200 and c["compatibilityLevel"] == ("NONE" if i < 9 else level), (f, i, status, c)
print("each write through a follower is readable there at once", flush=True)
# Errors come back as the leader answered them.
status, v = http(registries[followers[1]], "POST", "/subjects/s/versions", {"schema": "{not json"})
assert status == 422 and v["error_code"] == 42201, (status, v)
for n in followers:
    assert metric(n, "spate_schema_registry_forwarded_total") > 0, n
    assert registry_status(n)["writer"] == int(leader)
assert metric(leader, "spate_schema_registry_forwarded_total") == 0
assert metric(leader, "spate_schema_registry_schemas") == 15  # "s" 5, "ryw" 10
print("reads on every node; writes through every node get the leader's ids (forwarded)", flush=True)

# Avro through the leader's registry, read back through another node's.
bootstrap = os.environ["SPATE_BOOTSTRAP"]
admin = AdminClient({"bootstrap.servers": bootstrap})
for f in admin.create_topics([NewTopic("avro-cluster", 1, 3)]).values():
    f.result(timeout=30)
user = json.dumps({"type": "record", "name": "User", "fields": [{"name": "id", "type": "long"}]})
# The serializer registers through a follower: forwarded to the leader.
ser = AvroSerializer(SchemaRegistryClient({"url": registries[followers[0]]}), user)
producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
ctx = SerializationContext("avro-cluster", MessageField.VALUE)
for i in range(10):
    producer.produce("avro-cluster", value=ser({"id": i}, ctx))
assert producer.flush(30) == 0
other = next(n for n in nodes if n != leader)
eventually(lambda: http(registries[other], "GET", "/subjects/avro-cluster-value/versions")[0] == 200,
           "the Avro subject never reached another node")
de = AvroDeserializer(SchemaRegistryClient({"url": registries[other]}))
got = read_back({"bootstrap.servers": bootstrap, "group.id": "sr-cluster"}, "avro-cluster", 10,
                lambda m: de(m.value(), ctx))
assert got == [{"id": i} for i in range(10)], got
print("AvroSerializer via a follower, AvroDeserializer via another node", flush=True)

# HTTP ingest on a follower, with a schema the registry has never seen: registered on the
# leader (forwarded, with the caller's credentials), then the records encoded here with the
# leader's id. Before, this answered 503.
for f in admin.create_topics([NewTopic("ingest-cluster", 1, 3)]).values():
    f.result(timeout=30)
order = json.dumps({"type": "record", "name": "Order", "fields": [{"name": "n", "type": "long"}]})
forwarded = metric(followers[0], "spate_schema_registry_forwarded_total")
status, body = ingest(followers[0], "ingest-cluster",
                      {"value_schema": order, "records": [{"value": {"n": i}} for i in range(5)]})
assert status == 200 and body["offsets"] and all(o.get("error_code") is None for o in body["offsets"]), \
    (status, body)
vid = body["value_schema_id"]
assert metric(followers[0], "spate_schema_registry_forwarded_total") == forwarded + 1
st, latest = http(registries[leader], "GET", "/subjects/ingest-cluster-value/versions/latest")
assert st == 200 and latest["id"] == vid, (st, latest, vid)
# The same schema again on that follower is found in its own copy: no second write.
status, again = ingest(followers[0], "ingest-cluster",
                       {"value_schema": order, "records": [{"value": {"n": 5}}]})
assert status == 200 and again["value_schema_id"] == vid, (status, again)
assert metric(followers[0], "spate_schema_registry_forwarded_total") == forwarded + 1
# A schema the leader refuses (incompatible with the one registered) gets the leader's verdict.
# (The global level is NONE since above: the subject gets BACKWARD.)
status, v = http(registries[followers[0]], "PUT", "/config/ingest-cluster-value", {"compatibility": "BACKWARD"})
assert status == 200, (status, v)
breaking = json.dumps({"type": "record", "name": "Order", "fields": [{"name": "n", "type": "string"}]})
status, err = ingest(followers[0], "ingest-cluster",
                     {"value_schema": breaking, "records": [{"value": {"n": "x"}}]})
assert status == 422 and err.get("error_code") == 409, (status, err)
ctx_ingest = SerializationContext("ingest-cluster", MessageField.VALUE)
got = read_back({"bootstrap.servers": bootstrap, "group.id": "sr-cluster-ingest"}, "ingest-cluster", 6,
                lambda m: de(m.value(), ctx_ingest))
assert got == [{"n": i} for i in range(6)], got
print(f"HTTP ingest on follower {followers[0]} registered a new schema through leader {leader} "
      f"(id {vid}) and its records read back", flush=True)

# Search over schema'd values in the cluster: a searchable topic (search.value.format=schema,
# RF 3) written with AvroSerializer through a follower's registry; every node's _search finds
# the records by their decoded fields, as many as a brute-force count says.
ORDER = {"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "string"}, {"name": "qty", "type": "int"},
    {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}}]}
ORDER_V2 = {**ORDER, "fields": ORDER["fields"] + [{"name": "channel", "type": "string", "default": "web"}]}
for f in admin.create_topics([NewTopic("avro-search", 2, 3, config={
        "search.enabled": "true", "search.value.format": "schema"})]).values():
    f.result(timeout=30)
search_ctx = SerializationContext("avro-search", MessageField.VALUE)
orders = [{"id": f"o-{i}", "qty": i % 7, "status": ["NEW", "PAID"][i % 2]} for i in range(100)]


def produce_orders(schema, values, registry):
    ser = AvroSerializer(SchemaRegistryClient({"url": registry}), json.dumps(schema))
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i, v in enumerate(values):
        p.produce("avro-search", value=ser(v, search_ctx), partition=i % 2)
    assert p.flush(30) == 0


def searched(node, query):
    """(status, body) of a _search on `node`'s HTTP listener."""
    req = urllib.request.Request(f"{admin_http[node]}/avro-search/_search", method="POST",
                                 data=json.dumps({"query": query, "size": 500, "track_total_hits": True}).encode())
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=40) as r:
            return r.status, json.loads(r.read())
    except (urllib.error.HTTPError, OSError) as e:
        return 0, {"error": str(e)}


def search_finds(nodes_, docs, query, keep):
    """Every node's _search of `query` finds exactly the orders `keep` picks, by id."""
    want = sorted(d["id"] for d in docs if keep(d))
    assert want, f"{query} picks nothing: a weak check"
    for n in nodes_:
        def same(n=n):
            status, body = searched(n, query)
            return status == 200 and sorted(h["_source"]["id"] for h in body["hits"]["hits"]) == want \
                and body["hits"]["total"]["value"] == len(want)
        eventually(same, f"node {n}: {query} never found the {len(want)} orders", 60)


produce_orders(ORDER, orders, registries[followers[0]])
search_finds(nodes, orders, {"term": {"status.keyword": "PAID"}}, lambda d: d["status"] == "PAID")
search_finds(nodes, orders, {"range": {"qty": {"gte": 2, "lt": 5}}}, lambda d: 2 <= d["qty"] < 5)
print("search over Avro values in the cluster: every node finds the orders by field", flush=True)

# Kill the node that hands out ids; registration goes on through a surviving node that does
# not lead, forwarded to the new leader.
highest = max(http(registries[other], "GET", "/subjects/avro-cluster-value/versions/latest")[1]["id"], ids[-1], vid)
os.kill(int(pids[leader]), signal.SIGKILL)
rest = [n for n in nodes if n != leader]
new_leader = wait_for_leader(rest, 90)
follower = next(n for n in rest if n != new_leader)
new_id = register_through(follower, "s", 5, 60)
print(f"after kill -9 of node {leader}: node {follower} took the registration for node {new_leader}, "
      f"id {new_id}", flush=True)
assert new_id > highest, (new_id, highest)
assert metric(follower, "spate_schema_registry_forwarded_total") > 0
versions = http(registries[new_leader], "GET", "/subjects/s/versions")[1]
assert versions == [1, 2, 3, 4, 5, 6], versions
newer = register_through(follower, "s", 6, 30)
assert newer == new_id + 1, (newer, new_id)
# Both survivors agree.
for n in rest:
    eventually(lambda n=n: http(registries[n], "GET", "/subjects/s/versions/latest")[1].get("id") == newer,
               f"node {n} never saw the newest version")
# Orders of a version registered through the survivors after the kill are searchable by field
# on both, beside the ones from before.
newer_orders = [{**o, "id": f"o-{100 + i}", "channel": "app"} for i, o in enumerate(orders[:50])]
produce_orders(ORDER_V2, newer_orders, registries[follower])
every = orders + newer_orders
search_finds(rest, every, {"term": {"status.keyword": "PAID"}}, lambda d: d["status"] == "PAID")
search_finds(rest, every, {"term": {"channel.keyword": "app"}}, lambda d: d.get("channel") == "app")
print(f"after the kill: a v2 registered through node {follower}; its orders and the old ones "
      "are found by field on both survivors", flush=True)
print("schema registry cluster e2e: all checks passed")
