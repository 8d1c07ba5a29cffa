"""The client side of scripts/image-e2e.sh, with confluent-kafka (librdkafka):

  e2e.py create  BOOTSTRAP TOPIC PARTITIONS REPLICATION
  e2e.py produce BOOTSTRAP TOPIC ACKED_FILE MAX_RECORDS MAX_SECONDS [STOP_FILE]
  e2e.py check   BOOTSTRAP TOPIC ACKED_FILE

`produce` writes records with acks=all and idempotence until MAX_RECORDS, MAX_SECONDS or
STOP_FILE exists, and appends each acknowledged one (partition, offset, value) to ACKED_FILE;
`check` reads every partition back from the start (scripts/read_back.py) and fails unless every
acknowledged record is at its offset with its value."""

import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from read_back import read_back  # noqa: E402


def create(bootstrap, topic, partitions, replication):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = NewTopic(topic, int(partitions), int(replication),
                   config={"min.insync.replicas": "2"} if int(replication) >= 3 else {})
    deadline = time.time() + 60
    while True:
        try:
            admin.create_topics([new])[topic].result(timeout=30)
            break
        except Exception as e:  # a cluster that has just formed may not have a controller yet
            if "TOPIC_ALREADY_EXISTS" in str(e):
                break
            assert time.time() < deadline, f"create {topic}: {e}"
            time.sleep(1)
    print(f"e2e.py: created {topic} ({partitions} partitions, replication {replication})")


def produce(bootstrap, topic, acked_file, max_records, max_seconds, stop_file=None):
    max_records, max_seconds = int(max_records), float(max_seconds)
    errors = []
    acked = open(acked_file, "a")

    def delivered(err, msg):
        if err is not None:
            errors.append(str(err))
            return
        acked.write(json.dumps([msg.partition(), msg.offset(), msg.value().decode()]) + "\n")

    p = Producer({
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 5,
        # A restarted node's partitions move; the producer retries within this.
        "message.timeout.ms": 60000,
    })
    start, sent = time.time(), 0
    # At most 500 records a second: the load spans the whole rolling restart without filling
    # the machine, and stays bounded by MAX_RECORDS and MAX_SECONDS.
    while sent < max_records and time.time() - start < max_seconds:
        if stop_file and os.path.exists(stop_file):
            break
        for _ in range(20):
            p.produce(topic, key=str(sent).encode(), value=f"record-{sent}".encode(),
                      on_delivery=delivered)
            sent += 1
        p.poll(0)
        time.sleep(max(0.0, start + sent / 500 - time.time()))
    left = p.flush(90)
    acked.close()
    n = sum(1 for _ in open(acked_file))
    print(f"e2e.py: sent {sent}, acknowledged {n}, not delivered {len(errors) + left}"
          + (f" (first error: {errors[0]})" if errors else ""))
    assert n > 0, "nothing was acknowledged"


def check(bootstrap, topic, acked_file):
    acked = [json.loads(line) for line in open(acked_file)]
    by_partition = {}
    for part, off, val in acked:
        by_partition.setdefault(part, {})[off] = val
    lost, values = [], []
    for part, offsets in sorted(by_partition.items()):
        # Plain idempotent produce: offsets run from 0 without gaps.
        records = dict(read_back({"bootstrap.servers": bootstrap, "group.id": "image-e2e-check"},
                                 topic, max(offsets) + 1,
                                 decode=lambda m: (m.offset(), m.value().decode()),
                                 partition=part, seconds=60))
        values.extend(records.values())
        lost.extend((part, off, v) for off, v in offsets.items() if records.get(off) != v)
    dups = len(values) - len(set(values))
    print(f"e2e.py: {len(acked)} acknowledged records in {len(by_partition)} partitions, "
          f"{len(acked) - len(lost)} read back at their offsets; duplicates in the log: {dups}")
    assert not lost, f"lost or changed acknowledged records (first 5): {lost[:5]}"


if __name__ == "__main__":
    {"create": create, "produce": produce, "check": check}[sys.argv[1]](*sys.argv[2:])
