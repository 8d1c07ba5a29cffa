"""kafka-python's KafkaAdminClient against spate (SPATE_BOOTSTRAP): every call checked
against what was produced, and bad input answered with Kafka's errors. Exits non-zero on the
first mismatch."""

import os
import sys

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import KafkaError

BOOTSTRAP = os.environ["SPATE_BOOTSTRAP"]


def check(ok, what):
    if not ok:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


def main():
    admin = KafkaAdminClient(bootstrap_servers=BOOTSTRAP, client_id="kp-admin")
    # The release kafka-python infers from the versions ApiVersions advertises: spate
    # advertises Kafka 4.3's (ListOffsets v11, DescribeLogDirs v5 are its markers).
    inferred = admin._client.check_version()
    check(inferred == (4, 3), f"kafka-python infers broker version {inferred} (Kafka 4.3)")

    admin.create_topics([NewTopic("kp-admin", 2, 1)])
    producer = KafkaProducer(bootstrap_servers=BOOTSTRAP)
    for i in range(200):
        producer.send("kp-admin", value=b"v%d" % i, partition=i % 2)
    producer.flush()

    # delete_records: the new low watermark, then the earliest offset and a consumer agree.
    tp = TopicPartition("kp-admin", 0)
    done = admin.delete_records({tp: 40})
    check(done[tp]["low_watermark"] == 40 and done[tp]["error_code"] == 0,
          f"delete_records moves partition 0's start to 40: {done[tp]}")
    consumer = KafkaConsumer(bootstrap_servers=BOOTSTRAP)
    check(consumer.beginning_offsets([tp])[tp] == 40, "beginning_offsets after delete_records is 40")
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    got = []
    for _ in range(50):
        for records in consumer.poll(timeout_ms=500).values():
            got.extend(r.offset for r in records)
        if len(got) >= 60:
            break
    check(got[:1] == [40] and len(got) == 60, f"a consumer from the beginning reads offsets 40..99 ({len(got)} records)")
    try:
        bad = admin.delete_records({tp: 10_000})
        code = bad[tp]["error_code"]
    except KafkaError as e:
        code = getattr(e, "errno", None)
    check(code == 1, f"delete_records past the high watermark is OFFSET_OUT_OF_RANGE (got {code})")

    # describe_log_dirs: one log dir with both partitions and its capacity.
    dirs = admin.describe_log_dirs()
    d = dirs[0]["log_dirs"][0]
    parts = {p["partition_index"]: p for t in d["topics"] if t["name"] == "kp-admin" for p in t["partitions"]}
    check(sorted(parts) == [0, 1] and all(p["partition_size"] > 0 for p in parts.values()),
          "describe_log_dirs lists both partitions with their sizes")
    check(d["total_bytes"] > 0 and 0 <= d["usable_bytes"] <= d["total_bytes"],
          f"describe_log_dirs reports the dir's capacity ({d['usable_bytes']} of {d['total_bytes']} bytes usable)")

    # describe_topic_partitions, paged one partition at a time.
    seen, cursor = [], None
    for _ in range(10):
        r = admin.describe_topic_partitions(["kp-admin"], response_partition_limit=1, cursor=cursor)
        seen += [(t["name"], p["partition_index"]) for t in r["topics"] for p in t["partitions"]]
        cursor = r["next_cursor"]
        if cursor is None:
            break
        cursor = {"topic_name": cursor["topic_name"], "partition_index": cursor["partition_index"]}
    check(seen == [("kp-admin", 0), ("kp-admin", 1)], f"describe_topic_partitions pages with its cursor: {seen}")

    resources = admin.list_config_resources()
    check("kp-admin" in resources.get("topic", []), f"list_config_resources lists the topic: {resources}")
    features = admin.describe_features()
    check(features["metadata.version"]["finalized"] == (30, 30),
          f"describe_features: metadata.version finalized at 4.3-IV0 (30): {features['metadata.version']}")
    print("all kafka-python admin checks passed")


if __name__ == "__main__":
    main()
