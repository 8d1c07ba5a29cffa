"""A full disk with confluent-kafka (librdkafka) against spate on a small tmpfs (issue 30):
fill until refused, check the refusal (KAFKA_STORAGE_ERROR; a delivery report does not carry
librdkafka's retriable flag, so retriability is shown by a producer with retries whose records
wait while full and are delivered once space is freed), read back everything acknowledged,
commit while full,
free space with DeleteRecords and with retention.ms lowered at run time, and see produce
resume without a restart. A searchable topic takes small records while the disk fills (its
index writes meet the full disk too): search answers while full, and once space is back every
acknowledged record of it is found, once. Run by scripts/disk-full-e2e.sh; exits non-zero on the first
mismatch."""

import json
import os
import sys
import time
import urllib.error
import urllib.request

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

BOOTSTRAP = os.environ["SPATE_BOOTSTRAP"]
HTTP = os.environ["SPATE_HTTP"]
TOPIC = "disk-fill"
SEARCH_TOPIC = "disk-search"
# watermark: refused by the free-space watermark; enospc: no watermark, the file system fills.
MODE = os.environ.get("SPATE_DISK_MODE", "watermark")
PAD = b"x" * 1000


def check(ok, what):
    if not ok:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


def http(method, path, body=None, content_type=None):
    req = urllib.request.Request(f"http://{HTTP}{path}", method=method, data=body)
    if content_type:
        req.add_header("content-type", content_type)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            raw = r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        raw = e.read()
        status = e.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def health():
    return http("GET", "/health")[1]


def metric(name):
    """The value of the one sample of `name` in /metrics (None when missing)."""
    text = http("GET", "/metrics")[1]
    if not isinstance(text, str):
        return None
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def wait_until(pred, what, limit_s=20):
    deadline = time.time() + limit_s
    while time.time() < deadline:
        if pred():
            return
        time.sleep(0.2)
    check(False, f"{what} within {limit_s} s")


# The searchable topic's acknowledged records, as search names them ("partition-offset").
search_acked = set()


def search_count():
    status, body = http("POST", f"/{SEARCH_TOPIC}/_count",
                        json.dumps({"query": {"match_all": {}}}).encode(), "application/json")
    return status, body


def search_ids():
    status, body = http("POST", f"/{SEARCH_TOPIC}/_search",
                        json.dumps({"query": {"match_all": {}}, "size": 10000,
                                    "track_total_hits": True}).encode(),
                        "application/json")
    check(status == 200, f"search answers: {status} {str(body)[:200]}")
    ids = [h["_id"] for h in body["hits"]["hits"]]
    return ids, body["hits"]["total"]["value"]


def fill(seq):
    """Produces 1 KiB records without retries until the broker refuses, and a small JSON
    record to the searchable topic every 100 of them; returns the acknowledged values with
    their offsets, the errors seen and the next sequence number."""
    acked, errors = {}, []

    def report(err, msg):
        if err is not None:
            errors.append(err)
        else:
            acked[msg.value()] = msg.offset()

    def search_report(err, msg):
        if err is None:
            search_acked.add(f"{msg.partition()}-{msg.offset()}")

    p = Producer({
        "bootstrap.servers": BOOTSTRAP,
        "acks": "all",
        "retries": 0,
        "linger.ms": 5,
        "message.timeout.ms": 15000,
    })
    deadline = time.time() + 90
    while not errors and time.time() < deadline:
        for _ in range(500):
            value = b"%012d" % seq + PAD
            try:
                p.produce(TOPIC, value, partition=0, on_delivery=report)
                if seq % 100 == 0:
                    p.produce(SEARCH_TOPIC, json.dumps({"seq": seq, "word": "spate"}).encode(),
                              partition=0, on_delivery=search_report)
                seq += 1
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    left = p.flush(30)
    check(left == 0, f"every produce answered ({left} left)")
    return acked, errors, seq


def read_all(group, end):
    """Reads partition 0 from its start up to `end` in group `group`; value -> offset."""
    c = Consumer({
        "bootstrap.servers": BOOTSTRAP,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })
    c.assign([TopicPartition(TOPIC, 0, 0)])
    seen = {}
    last = -1
    deadline = time.time() + 60
    while last + 1 < end and time.time() < deadline:
        for m in c.consume(1000, timeout=1):
            if m.error():
                check(False, f"consumer error {m.error()}")
            seen[m.value()] = m.offset()
            last = m.offset()
    return c, seen, last


def main():
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    # Small segments, so DeleteRecords and retention free whole files.
    fs = admin.create_topics([
        NewTopic(TOPIC, 1, 1, config={"segment.bytes": "1048576"}),
        NewTopic(SEARCH_TOPIC, 1, 1, config={"search.enabled": "true"}),
    ])
    for f in fs.values():
        f.result(30)
    # The searchable topic's index is opened in the background after the topic is created; it
    # must exist before the disk fills for "search answers while full" to mean anything (the
    # fill takes a fraction of a second on the 64 MiB tmpfs).
    deadline = time.time() + 30
    while search_count()[0] != 200 and time.time() < deadline:
        time.sleep(0.1)
    check(search_count()[0] == 200, f"the search index of {SEARCH_TOPIC} answers before the fill")
    check(health().get("status") == "ok", f"healthy before filling: {health()}")

    # 1. Fill until refused: the error is KAFKA_STORAGE_ERROR, which librdkafka retries.
    acked, errors, seq = fill(0)
    codes = {e.code() for e in errors}
    check(len(acked) > 30_000, f"{len(acked)} records acknowledged before the refusal")
    check(codes == {KafkaError.KAFKA_STORAGE_ERROR},
          f"refusals are KAFKA_STORAGE_ERROR: {sorted(str(e) for e in errors)[:3]}")
    h = health()
    check(h.get("status") == "disk_full" and h["disk"]["full"], f"/health reports the full disk: {h}")
    if MODE == "watermark":
        check(h["disk"]["free_bytes"] < h["disk"]["threshold_bytes"], "free bytes below the watermark")
    else:
        check("ENOSPC" in (h["disk"]["reason"] or ""), f"/health names ENOSPC: {h['disk']['reason']}")
    check(http("GET", "/ready")[0] == 200, "/ready stays 200 while full")
    check(metric("spate_disk_full") == 1.0, "spate_disk_full is 1 in /metrics")
    check(metric("spate_disk_watermark_crossings_total") >= 1.0, "the crossing is counted")
    md = admin.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions[0]
    check(md.error is None, f"the partition stays online in Metadata ({md.error})")
    status, body = search_count()
    check(status == 200 and body["count"] <= len(search_acked),
          f"search answers while full: {status} {body} ({len(search_acked)} acknowledged)")

    # 2. HTTP ingest: 507 with a body naming the reason.
    status, body = http("POST", f"/topics/{TOPIC}",
                        json.dumps({"records": [{"value": {"a": 1}}]}).encode(),
                        "application/vnd.kafka.json.v2+json")
    check(status == 507 and "retry once space is freed" in str(body),
          f"HTTP ingest answers 507: {status} {body}")

    # 3. Every acknowledged record is read back, nothing else; a group commits while full.
    end = max(acked.values()) + 1
    c, seen, last = read_all("disk-full-group", end)
    check(seen == acked, f"read back exactly the {len(acked)} acknowledged records "
                         f"(read {len(seen)}, last offset {last})")
    if MODE == "watermark":
        # Commits write on the space below the watermark (with none, there is no reserve).
        c.commit(offsets=[TopicPartition(TOPIC, 0, end)], asynchronous=False)
        got = c.committed([TopicPartition(TOPIC, 0)], timeout=10)[0]
        check(got.offset == end and got.error is None, f"offset commit while full: {got}")
    c.close()

    # 4. A producer that retries keeps its records until space is freed.
    delivered, failed = [], []

    def report(err, msg):
        (failed if err is not None else delivered).append((err, msg.value()))

    retrying = Producer({
        "bootstrap.servers": BOOTSTRAP,
        "acks": "all",
        "message.timeout.ms": 60000,
        "retry.backoff.ms": 200,
    })
    resumed = [b"resume-%d" % i for i in range(100)]
    for v in resumed:
        retrying.produce(TOPIC, v, partition=0, on_delivery=report)
    retrying.poll(2)
    if MODE == "watermark":
        # (Without a watermark these small records may fit in what ENOSPC left over.)
        check(not delivered and not failed,
              f"nothing is written while full, and librdkafka keeps retrying ({len(failed)} failed)")

    # 5. DeleteRecords frees space: produce resumes without a restart.
    cut = end * 3 // 4
    res = admin.delete_records([TopicPartition(TOPIC, 0, cut)])
    for tp, f in res.items():
        check(f.result(30).low_watermark == cut, f"DeleteRecords moved the start to {cut}")
    started = time.time()
    wait_until(lambda: health().get("status") == "ok", "the watermark lifted after DeleteRecords")
    left = retrying.flush(60)
    check(left == 0 and not failed and len(delivered) == len(resumed),
          f"the retrying producer's {len(resumed)} records delivered after DeleteRecords "
          f"({len(delivered)} delivered, {len(failed)} failed, {left} left) "
          f"in {time.time() - started:.1f} s")
    # The index caught up with everything acknowledged while the disk filled: none lost to a
    # failed index write, none indexed twice by the writer's recovery.
    check(len(search_acked) >= 10, f"{len(search_acked)} searchable records acknowledged")
    def indexed():
        status, body = search_count()
        return status == 200 and isinstance(body, dict) and body.get("count") == len(search_acked)

    wait_until(indexed,
               f"all {len(search_acked)} acknowledged searchable records indexed", limit_s=60)
    ids, total = search_ids()
    check(sorted(ids) == sorted(search_acked) and total == len(search_acked),
          f"search finds each acknowledged record once ({len(ids)} hits, total {total})")
    print(f"search writer recoveries: {metric('spate_search_writer_recoveries_total')}")

    # 6. Fill again, then lower retention.ms at run time: retention frees space.
    acked2, errors2, seq = fill(seq)
    check(errors2 and {e.code() for e in errors2} == {KafkaError.KAFKA_STORAGE_ERROR},
          f"refused again once full ({len(acked2)} more acknowledged)")

    def lower_retention():
        res = admin.incremental_alter_configs([ConfigResource(
            ConfigResource.Type.TOPIC, TOPIC,
            incremental_configs=[ConfigEntry("retention.ms", "1000",
                                             incremental_operation=AlterConfigOpType.SET)])])
        for f in res.values():
            f.result(30)

    try:
        lower_retention()
    except KafkaException as e:
        # Without a watermark the fill can leave less than a block free, and the config change
        # must be written too (Kafka's goes to its metadata log, on the same disk): it is
        # refused as KAFKA_STORAGE_ERROR and changes nothing. DeleteRecords, which works with
        # no byte left, frees the oldest tenth first; retention then frees the rest.
        check(MODE != "watermark" and e.args[0].code() == KafkaError.KAFKA_STORAGE_ERROR,
              f"the retention change is refused only for want of a block, as a storage error: {e}")
        c = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": "disk-full-watermarks"})
        low, high = c.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=30)
        c.close()
        res = admin.delete_records([TopicPartition(TOPIC, 0, low + (high - low) // 10)])
        for f in res.values():
            f.result(30)
        lower_retention()
    wait_until(lambda: health().get("status") == "ok", "the watermark lifted after retention.ms=1000",
               limit_s=30)
    p = Producer({"bootstrap.servers": BOOTSTRAP, "acks": "all", "retries": 0})
    outcome = []
    p.produce(TOPIC, b"after-retention", partition=0,
              on_delivery=lambda err, msg: outcome.append(err))
    p.flush(30)
    check(outcome == [None], f"produce works after retention freed space: {outcome}")


if __name__ == "__main__":
    main()
