"""A real search client against spate: opensearch-py's search(), count() and the
search_after helper loop, over records produced with confluent-kafka, checked against a
brute-force scan of what was produced. Needs SPATE_BOOTSTRAP and SPATE_HTTP (with-spate.sh)."""
import json
import os
import sys
import time

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from opensearchpy import OpenSearch
from opensearchpy.exceptions import RequestError, TransportError

bootstrap, http = os.environ["SPATE_BOOTSTRAP"], os.environ["SPATE_HTTP"]
host, port = http.rsplit(":", 1)
topic = "py-search"
admin = AdminClient({"bootstrap.servers": bootstrap})
fs = admin.create_topics([NewTopic(topic, 2, 1, config={
    "search.enabled": "true", "search.fields": "level:keyword,code:number,msg:text"})])
for f in fs.values():
    f.result(timeout=20)
records = []
producer = Producer({"bootstrap.servers": bootstrap, "compression.type": "gzip", "acks": "all"})
for i in range(200):
    doc = {"level": ["info", "warn", "error"][i % 3], "code": i, "msg": f"request {i} took {i % 7} ms"}
    producer.produce(topic, key=f"k{i}", value=json.dumps(doc), partition=i % 2,
                     on_delivery=lambda err, m, d=doc: records.append((f"{m.partition()}-{m.offset()}", d)) if err is None else None)
producer.flush(30)
assert len(records) == 200, len(records)

client = OpenSearch(hosts=[{"host": host, "port": int(port)}], use_ssl=False, timeout=30)
deadline = time.time() + 60


def count():
    # 503 while the topic's indexes open (all shards failed), as Elasticsearch while shards start.
    try:
        return client.count(index=topic)["count"]
    except TransportError as e:
        assert e.status_code == 503, e
        return -1


while count() != 200:
    assert time.time() < deadline, "records never became searchable"
    time.sleep(0.05)

def ids(resp):
    return {h["_id"] for h in resp["hits"]["hits"]}

checks = [
    ({"term": {"level": "error"}}, lambda d: d["level"] == "error"),
    ({"match": {"msg": "took 3"}}, lambda d: "3" in d["msg"].split() or "took" in d["msg"].split()),
    ({"match_phrase": {"msg": "took 3 ms"}}, lambda d: "took 3 ms" in d["msg"]),
    ({"range": {"code": {"gte": 50, "lt": 60}}}, lambda d: 50 <= d["code"] < 60),
    ({"bool": {"must": [{"term": {"level": "warn"}}], "must_not": [{"range": {"code": {"gt": 100}}}]}},
     lambda d: d["level"] == "warn" and d["code"] <= 100),
]
for query, keep in checks:
    want = {i for i, d in records if keep(d)}
    got = client.search(index=topic, body={"query": query, "size": 1000})
    assert ids(got) == want, (query, len(ids(got)), len(want))
    assert got["hits"]["total"]["value"] == len(want)

# Deep paging with search_after, as a client pages through everything.
seen, after = [], None
while True:
    body = {"size": 30, "sort": [{"code": "asc"}], "query": {"match_all": {}}}
    if after:
        body["search_after"] = after
    page = client.search(index=topic, body=body)["hits"]["hits"]
    if not page:
        break
    seen += [h["_source"]["code"] for h in page]
    after = page[-1]["sort"]
assert seen == list(range(200)), seen[:10]

aggs = client.search(index=topic, body={"size": 0, "aggs": {"levels": {"terms": {"field": "level"}}}})
counts = {b["key"]: b["doc_count"] for b in aggs["aggregations"]["levels"]["buckets"]}
assert counts == {"info": 67, "warn": 67, "error": 66}, counts

try:
    client.search(index=topic, body={"size": 10_000_000})
    sys.exit("size=10M was accepted")
except RequestError as e:
    assert e.status_code == 400 and e.error == "illegal_argument_exception", e

print("search client e2e: 8 passed, 0 failed")
