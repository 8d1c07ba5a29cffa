"""Searchable topics whose values carry the schema registry's wire format, end to end with
clients nobody on this team wrote: confluent-kafka's AvroSerializer and ProtobufSerializer
produce to topics with search.value.format=schema (and one with auto, mixing Avro, JSON and
text), then _search over HTTP finds records by their fields (term on a keyword, range on a
number and on a timestamp, match on text), _source is the decoded object, and every count
equals a brute-force scan of what was produced. Values that cannot be decoded (garbage after
magic byte 0, a known id with a cut payload) are still indexed as text and counted in
spate_search_undecodable_values_total. Then kill -9 right after producing records of the
registered schema and of a version registered just before the kill: after the restart on the
same data dir every one of them is searchable by field, none indexed as text (the registry has
read `_schemas` again before the indexers decode), and the records indexed before are still
found.

    python3 scripts/schema_search_e2e.py      (SPATE_BIN overrides target/debug/spate)
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BINARY = os.environ.get("SPATE_BIN", os.path.join(ROOT, "target", "debug", "spate"))
FAILED = []

ORDER_AVRO = json.dumps({
    "type": "record", "name": "Order", "namespace": "shop", "fields": [
        {"name": "id", "type": "string"},
        {"name": "qty", "type": "int"},
        {"name": "price", "type": "double"},
        {"name": "status", "type": {"type": "enum", "name": "Status",
                                    "symbols": ["NEW", "PAID", "SHIPPED"]}},
        {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
            {"name": "name", "type": "string"},
            {"name": "city", "type": ["null", "string"], "default": None}]}},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": "long"}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ]})
STATUSES = ["NEW", "PAID", "SHIPPED"]
BASE_MS = 1_700_000_000_000


def order(i):
    return {
        "id": f"o-{i}", "qty": i % 17, "price": round(i * 1.25, 2), "status": STATUSES[i % 3],
        "customer": {"name": f"cust{i % 11}", "city": None if i % 4 == 0 else f"city{i % 5}"},
        "note": None if i % 2 else f"please deliver parcel {i} before noon",
        "tags": ["t%d" % (i % 3), "all"], "attrs": {"weight": i * 10},
        "at": BASE_MS + i * 60_000,
    }


def iso(ms):
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + ".%03dZ" % (ms % 1000)


def decoded_order(o):
    """What spate's _source shows for an Avro order: the union's branch value, the enum's
    symbol, the timestamp as RFC 3339."""
    d = dict(o)
    d["customer"] = dict(o["customer"])
    d["at"] = iso(o["at"])
    return d


def proto_class():
    """shop.Event { string id; int32 level; Kind kind; Origin origin; repeated string labels;
    int64 bytes } with a nested message and a nested enum, built in code (no protoc)."""
    T = descriptor_pb2.FieldDescriptorProto
    f = descriptor_pb2.FileDescriptorProto(name="shop/event.proto", package="shop", syntax="proto3")
    m = f.message_type.add(name="Event")
    kind = m.enum_type.add(name="Kind")
    for n, v in [("UNKNOWN", 0), ("CLICK", 1), ("VIEW", 2)]:
        kind.value.add(name=n, number=v)
    origin = m.nested_type.add(name="Origin")
    origin.field.add(name="host", number=1, type=T.TYPE_STRING, label=T.LABEL_OPTIONAL)
    origin.field.add(name="port", number=2, type=T.TYPE_INT32, label=T.LABEL_OPTIONAL)
    for name, number, ftype, type_name, label in [
            ("id", 1, T.TYPE_STRING, None, T.LABEL_OPTIONAL),
            ("level", 2, T.TYPE_INT32, None, T.LABEL_OPTIONAL),
            ("kind", 3, T.TYPE_ENUM, ".shop.Event.Kind", T.LABEL_OPTIONAL),
            ("origin", 4, T.TYPE_MESSAGE, ".shop.Event.Origin", T.LABEL_OPTIONAL),
            ("labels", 5, T.TYPE_STRING, None, T.LABEL_REPEATED),
            ("size", 6, T.TYPE_INT64, None, T.LABEL_OPTIONAL),
            ("text", 7, T.TYPE_STRING, None, T.LABEL_OPTIONAL)]:
        fd = m.field.add(name=name, number=number, type=ftype, label=label)
        if type_name:
            fd.type_name = type_name
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Event"))


def event(i):
    return {"id": f"e-{i}", "level": i % 9, "kind": ["UNKNOWN", "CLICK", "VIEW"][i % 3],
            "origin": {"host": f"host{i % 4}", "port": 8000 + i % 3},
            "labels": [f"l{i % 2}", "x"], "size": 5_000_000_000 + i,
            "text": f"user {i % 6} opened the settings page"}


class Spate:
    def __init__(self, data):
        self.out = open(os.path.join(data, "stdout"), "w+")
        self.err = open(os.path.join(data, "stderr"), "w")
        self.proc = subprocess.Popen(
            [BINARY, "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
             "--schema-registry-listen", "127.0.0.1:0", "--data-dir", os.path.join(data, "d")],
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

    def stop(self):
        if self.proc.poll() is None:
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


def post(spate, path, body):
    req = urllib.request.Request(spate.http + path, data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def search(spate, topic, query, size=1000):
    status, body = post(spate, f"/{topic}/_search",
                        {"query": query, "size": size, "track_total_hits": True})
    assert status == 200, (status, body)
    return body


def hit_ids(body):
    return {h["_id"] for h in body["hits"]["hits"]}


def create_topic(spate, name, fmt):
    admin = AdminClient({"bootstrap.servers": spate.bootstrap})
    fs = admin.create_topics([NewTopic(name, 2, 1, config={
        "search.enabled": "true", "search.value.format": fmt})])
    for f in fs.values():
        f.result(timeout=20)


def produce(spate, topic, values):
    """Produces raw values (already serialized) round-robin over 2 partitions; answers the
    `_id` (partition-offset) of each, in order."""
    ids = [None] * len(values)
    p = Producer({"bootstrap.servers": spate.bootstrap, "acks": "all", "linger.ms": 5})
    for i, v in enumerate(values):
        def done(err, m, i=i):
            assert err is None, err
            ids[i] = f"{m.partition()}-{m.offset()}"
        p.produce(topic, value=v, partition=i % 2, on_delivery=done)
    assert p.flush(30) == 0
    assert None not in ids
    return ids


def wait_searchable(spate, topic, n):
    deadline = time.time() + 60
    while True:
        status, body = post(spate, f"/{topic}/_count", {"query": {"match_all": {}}})
        if status == 200 and body["count"] == n:
            return
        assert time.time() < deadline, f"{topic}: {body} after 60 s, want {n}"
        time.sleep(0.1)


def undecodable(spate, topic):
    with urllib.request.urlopen(spate.http + "/metrics", timeout=30) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("spate_search_undecodable_values_total{") and f'topic="{topic}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def expect(spate, topic, query, docs, keep):
    """The hits of `query` are exactly the records `keep` picks, by brute force."""
    want = {i for i, d in docs.items() if keep(d)}
    assert want, f"the query {query} picks nothing: a weak check"
    body = search(spate, topic, query)
    got = hit_ids(body)
    assert body["hits"]["total"]["value"] == len(want), (query, body["hits"]["total"], len(want))
    assert got == want, (query, sorted(got - want)[:5], sorted(want - got)[:5])


def run(spate):
    avro_docs = {}

    @check("Avro (search.value.format=schema): AvroSerializer's records are searchable by field")
    def _():
        create_topic(spate, "avro-orders", "schema")
        ser = AvroSerializer(spate.client, ORDER_AVRO)
        ctx = SerializationContext("avro-orders", MessageField.VALUE)
        orders = [order(i) for i in range(240)]
        values = [ser(o, ctx) for o in orders]
        assert values[0][0] == 0, "the serializer writes the wire format"
        # Garbage after magic byte 0 (an id no schema has), and a known id with its payload
        # cut short: both still indexed, as text.
        known = values[0][:5]
        junk = [b"\x00\xff\xff\xff\xfe garbagemarker \xc3\x28",
                known + b"\x02\x41 truncatedmarker"]
        ids = produce(spate, "avro-orders", values + junk)
        avro_docs.update({ids[i]: decoded_order(o) for i, o in enumerate(orders)})
        wait_searchable(spate, "avro-orders", len(values) + len(junk))
        docs = avro_docs
        expect(spate, "avro-orders", {"term": {"status.keyword": "PAID"}}, docs,
               lambda d: d["status"] == "PAID")
        expect(spate, "avro-orders", {"term": {"customer.name.keyword": "cust3"}}, docs,
               lambda d: d["customer"]["name"] == "cust3")
        expect(spate, "avro-orders", {"range": {"qty": {"gte": 5, "lt": 9}}}, docs,
               lambda d: 5 <= d["qty"] < 9)
        expect(spate, "avro-orders", {"range": {"price": {"gt": 100.0}}}, docs,
               lambda d: d["price"] > 100.0)
        expect(spate, "avro-orders", {"range": {"attrs.weight": {"lte": 500}}}, docs,
               lambda d: d["attrs"]["weight"] <= 500)
        expect(spate, "avro-orders", {"match": {"note": "parcel"}}, docs,
               lambda d: d["note"] is not None)
        expect(spate, "avro-orders", {"match_phrase": {"note": "parcel 42 before"}}, docs,
               lambda d: d["note"] is not None and "parcel 42 before" in d["note"])
        expect(spate, "avro-orders", {"term": {"tags.keyword": "t1"}}, docs,
               lambda d: "t1" in d["tags"])
        expect(spate, "avro-orders", {"term": {"customer.city.keyword": "city2"}}, docs,
               lambda d: d["customer"]["city"] == "city2")
        # timestamp-millis decoded to RFC 3339: a date, so a range of dates finds it.
        lo, hi = BASE_MS + 10 * 60_000, BASE_MS + 50 * 60_000
        expect(spate, "avro-orders", {"range": {"at": {"gte": iso(lo), "lt": iso(hi)}}}, docs,
               lambda d: iso(lo) <= d["at"] < iso(hi))
        expect(spate, "avro-orders", {"bool": {
            "must": [{"term": {"status.keyword": "NEW"}}],
            "filter": [{"range": {"qty": {"gt": 10}}}]}}, docs,
            lambda d: d["status"] == "NEW" and d["qty"] > 10)

    @check("Avro: _source is the decoded object (union branches, enum symbols, RFC 3339 timestamps)")
    def _():
        body = search(spate, "avro-orders", {"term": {"id.keyword": "o-42"}})
        hits = body["hits"]["hits"]
        assert len(hits) == 1, body["hits"]
        assert hits[0]["_source"] == avro_docs[hits[0]["_id"]], hits[0]["_source"]
        assert hits[0]["_source"]["note"] == "please deliver parcel 42 before noon"
        # Every hit of a match_all shows its decoded object.
        for h in search(spate, "avro-orders", {"match_all": {}})["hits"]["hits"]:
            if h["_id"] in avro_docs:
                assert h["_source"] == avro_docs[h["_id"]], (h["_id"], h["_source"])

    @check("Avro: values that cannot be decoded are indexed as text and counted")
    def _():
        for word in ["garbagemarker", "truncatedmarker"]:
            body = search(spate, "avro-orders", {"match": {"value": word}})
            assert body["hits"]["total"]["value"] == 1, (word, body["hits"])
            src = body["hits"]["hits"][0]["_source"]
            assert word in src["value"], src
        n = undecodable(spate, "avro-orders")
        assert n == 2, f"spate_search_undecodable_values_total for avro-orders is {n}, want 2"

    @check("Protobuf (search.value.format=schema): ProtobufSerializer's records are searchable by field")
    def _():
        Event = proto_class()
        create_topic(spate, "proto-events", "schema")
        ser = ProtobufSerializer(Event, spate.client, {"use.deprecated.format": False})
        ctx = SerializationContext("proto-events", MessageField.VALUE)
        events = [event(i) for i in range(180)]
        values = []
        for e in events:
            m = Event(id=e["id"], level=e["level"], kind=e["kind"], labels=e["labels"],
                      size=e["size"], text=e["text"])
            m.origin.host, m.origin.port = e["origin"]["host"], e["origin"]["port"]
            values.append(ser(m, ctx))
        ids = produce(spate, "proto-events", values)
        docs = {ids[i]: e for i, e in enumerate(events)}
        wait_searchable(spate, "proto-events", len(values))
        expect(spate, "proto-events", {"term": {"kind.keyword": "VIEW"}}, docs,
               lambda d: d["kind"] == "VIEW")
        expect(spate, "proto-events", {"term": {"origin.host.keyword": "host2"}}, docs,
               lambda d: d["origin"]["host"] == "host2")
        expect(spate, "proto-events", {"range": {"level": {"gte": 3, "lte": 5}}}, docs,
               lambda d: 3 <= d["level"] <= 5)
        expect(spate, "proto-events", {"range": {"size": {"gte": 5_000_000_100}}}, docs,
               lambda d: d["size"] >= 5_000_000_100)
        expect(spate, "proto-events", {"match": {"text": "user 4"}}, docs,
               lambda d: "4" in d["text"].split() or "user" in d["text"].split())
        expect(spate, "proto-events", {"match_phrase": {"text": "user 4 opened"}}, docs,
               lambda d: "user 4 opened" in d["text"])
        expect(spate, "proto-events", {"term": {"labels.keyword": "l1"}}, docs,
               lambda d: "l1" in d["labels"])
        # Default values are fields too: level 0 and kind UNKNOWN are searchable.
        expect(spate, "proto-events", {"term": {"level": 0}}, docs, lambda d: d["level"] == 0)
        body = search(spate, "proto-events", {"term": {"id.keyword": "e-7"}})
        (h,) = body["hits"]["hits"]
        assert h["_source"] == docs[h["_id"]], h["_source"]
        assert undecodable(spate, "proto-events") == 0

    @check("auto: values of known schemas decode beside JSON and text; unknown ids stay text")
    def _():
        create_topic(spate, "auto-mixed", "auto")
        ser = AvroSerializer(spate.client, ORDER_AVRO)
        ctx = SerializationContext("auto-mixed", MessageField.VALUE)
        orders = [order(i) for i in range(60)]
        jsons = [{"id": f"j-{i}", "qty": i % 17, "status": "PAID"} for i in range(30)]
        texts = [f"plain line {i} status PAID" for i in range(20)]
        values = ([ser(o, ctx) for o in orders] + [json.dumps(j).encode() for j in jsons]
                  + [t.encode() for t in texts] + [b"\x00\xff\xff\xff\xfd unknownidmarker"])
        ids = produce(spate, "auto-mixed", values)
        docs = {ids[i]: decoded_order(o) for i, o in enumerate(orders)}
        docs.update({ids[len(orders) + i]: j for i, j in enumerate(jsons)})
        wait_searchable(spate, "auto-mixed", len(values))
        expect(spate, "auto-mixed", {"term": {"status.keyword": "PAID"}}, docs,
               lambda d: d["status"] == "PAID")
        expect(spate, "auto-mixed", {"range": {"qty": {"lt": 4}}}, docs, lambda d: d["qty"] < 4)
        expect(spate, "auto-mixed", {"term": {"customer.name.keyword": "cust5"}}, docs,
               lambda d: d.get("customer", {}).get("name") == "cust5")
        body = search(spate, "auto-mixed", {"match": {"value": "unknownidmarker"}})
        assert body["hits"]["total"]["value"] == 1, body["hits"]
        body = search(spate, "auto-mixed", {"match": {"value": "plain"}})
        assert body["hits"]["total"]["value"] == len(texts), body["hits"]["total"]
        # An id no schema has is text under auto, not an error.
        assert undecodable(spate, "auto-mixed") == 0


ORDER_AVRO_V2 = json.dumps({**json.loads(ORDER_AVRO), "fields": json.loads(ORDER_AVRO)["fields"] + [
    {"name": "channel", "type": "string", "default": "web"}]})


def across_restart(data, spate):
    """Produces orders of v1 and of a v2 registered just now, kills spate (-9) at once,
    restarts it on the same data dir and checks every order of the topic by field. Answers
    the restarted spate."""
    docs = {}
    hits = search(spate, "avro-orders", {"exists": {"field": "id"}})["hits"]["hits"]
    docs.update({h["_id"]: h["_source"] for h in hits})
    assert len(docs) == 240, f"{len(docs)} orders indexed before the restart, want 240"
    ctx = SerializationContext("avro-orders", MessageField.VALUE)
    v1 = AvroSerializer(spate.client, ORDER_AVRO)
    v2 = AvroSerializer(spate.client, ORDER_AVRO_V2)
    late = [order(i) for i in range(240, 300)]
    newer = [{**order(i), "channel": "app"} for i in range(300, 340)]
    values = [v1(o, ctx) for o in late] + [v2(o, ctx) for o in newer]
    assert values[0][1:5] != values[-1][1:5], "v2 has an id of its own"
    ids = produce(spate, "avro-orders", values)
    # How many of them the indexer had reached, told not checked: the kill follows at once.
    at_kill = post(spate, "/avro-orders/_count", {"query": {"match_all": {}}})[1].get("count", 0) - 242
    spate.stop()
    print(f"      {at_kill} of the {len(values)} new orders were searchable at the kill", flush=True)
    docs.update({ids[i]: decoded_order(o) for i, o in enumerate(late + newer)})
    spate = Spate(data)
    wait_searchable(spate, "avro-orders", 240 + 2 + len(values))
    assert undecodable(spate, "avro-orders") == 0, "records indexed as text after the restart"
    expect(spate, "avro-orders", {"exists": {"field": "id"}}, docs, lambda d: True)
    expect(spate, "avro-orders", {"term": {"status.keyword": "PAID"}}, docs,
           lambda d: d["status"] == "PAID")
    expect(spate, "avro-orders", {"term": {"channel.keyword": "app"}}, docs,
           lambda d: d.get("channel") == "app")
    expect(spate, "avro-orders", {"range": {"qty": {"gte": 5, "lt": 9}}}, docs,
           lambda d: 5 <= d["qty"] < 9)
    body = search(spate, "avro-orders", {"term": {"id.keyword": "o-333"}})
    (h,) = body["hits"]["hits"]
    assert h["_source"] == docs[h["_id"]], h["_source"]
    return spate


def main():
    with tempfile.TemporaryDirectory() as data:
        spate = Spate(data)
        try:
            run(spate)
            name = ("kill -9 right after producing v1 and v2 orders, restart: all 340 searchable "
                    "by field, none as text")

            @check(name)
            def _():
                nonlocal spate
                spate = across_restart(data, spate)
        finally:
            spate.stop()
    if FAILED:
        sys.exit(f"{len(FAILED)} check(s) failed: {FAILED}")
    print("schema search e2e: all checks passed")


if __name__ == "__main__":
    main()
