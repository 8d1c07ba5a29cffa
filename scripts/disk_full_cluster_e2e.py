"""A follower with a full disk in a 3-node cluster (issue 30), with confluent-kafka: the
follower drops out of the ISR, acks=all goes on with two replicas (NOT_ENOUGH_REPLICAS when
min.insync.replicas needs the third), DeleteRecords frees the follower's space and it rejoins
the ISR; the partition the full node led is handed to an in-sync replica with space and takes
acks=all writes there. Run by scripts/disk-full-cluster-e2e.sh; exits non-zero on the first
mismatch."""

import json
import os
import sys
import time
import urllib.request

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

BOOTSTRAP = os.environ["SPATE_BOOTSTRAP"]
HTTP3 = os.environ["SPATE_HTTP3"]
TOPIC = "disk-fill-cluster"
# Led by node 3 (first in its assignment) until node 3's disk fills.
LED = "led-by-the-full-node"
PAD = b"x" * 1000


def check(ok, what):
    if not ok:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


def health3():
    with urllib.request.urlopen(f"http://{HTTP3}/health", timeout=10) as r:
        return json.loads(r.read())


def wait_until(pred, what, limit_s=30):
    deadline = time.time() + limit_s
    while time.time() < deadline:
        if pred():
            check(True, what)
            return
        time.sleep(0.3)
    check(False, f"{what} within {limit_s} s")


def isr(admin, topic=TOPIC):
    p = admin.list_topics(topic, timeout=10).topics[topic].partitions[0]
    return p.leader, sorted(p.isrs)


def set_config(admin, name, value):
    res = admin.incremental_alter_configs([ConfigResource(
        ConfigResource.Type.TOPIC, TOPIC,
        incremental_configs=[ConfigEntry(name, value,
                                         incremental_operation=AlterConfigOpType.SET)])])
    for f in res.values():
        f.result(30)


def main():
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    # Node 1 leads (first in the assignment); node 3, the one with the small disk, follows.
    topic = NewTopic(TOPIC, num_partitions=1, replica_assignment=[[1, 2, 3]],
                     config={"segment.bytes": "1048576", "min.insync.replicas": "2"})
    admin.create_topics([topic])[TOPIC].result(30)
    wait_until(lambda: isr(admin) == (1, [1, 2, 3]), "node 1 leads, ISR 1,2,3")
    admin.create_topics([NewTopic(LED, num_partitions=1, replica_assignment=[[3, 1, 2]])])[
        LED].result(30)
    wait_until(lambda: isr(admin, LED) == (3, [1, 2, 3]), f"node 3 leads {LED}, ISR 1,2,3")

    acked, errors = {}, []

    def report(err, msg):
        if err is not None:
            errors.append(err)
        else:
            acked[msg.value()] = msg.offset()

    p = Producer({"bootstrap.servers": BOOTSTRAP, "acks": "all", "linger.ms": 5,
                  "message.timeout.ms": 60000})
    seq = 0

    def produce(n):
        nonlocal seq
        for _ in range(n):
            while True:
                try:
                    p.produce(TOPIC, b"%012d" % seq + PAD, partition=0, on_delivery=report)
                    break
                except BufferError:
                    p.poll(0.05)
            seq += 1
        p.poll(0)

    # Fill until node 3 is below its watermark and stays there. Between two samples of the
    # file system (every 500 ms) a node counts what it wrote against the room left, which
    # can call it full a little early: the next sample can find it above the watermark again
    # (a CI run stopped filling right there, and nothing had to move).
    def stays_full():
        if not health3()["disk"]["full"]:
            return False
        time.sleep(1.2)
        return health3()["disk"]["full"]

    deadline = time.time() + 90
    while not stays_full() and time.time() < deadline:
        produce(2000)
        p.flush(60)
    check(health3()["disk"]["full"], f"node 3 went below its watermark after {len(acked)} records")
    # The full node hands the leadership it held to an in-sync replica with space, which
    # takes acks=all writes (node 3 would refuse every one).
    wait_until(lambda: isr(admin, LED)[0] in (1, 2),
               f"node 3 handed the leadership of {LED} to an in-sync replica with space")
    handed = []
    led = Producer({"bootstrap.servers": BOOTSTRAP, "acks": "all",
                    "message.timeout.ms": 30000})
    led.produce(LED, b"after-the-handoff", partition=0,
                on_delivery=lambda err, msg: handed.append(err))
    led.flush(30)
    check(handed == [None], f"acks=all to {LED} accepted by its new leader: {handed}")
    # acks=all goes on: node 3 drops out of the ISR as a lagging replica.
    produce(3000)
    left = p.flush(60)
    check(left == 0 and not errors, f"acks=all writes accepted while node 3 is full "
                                     f"({len(acked)} acknowledged, errors {errors[:3]})")
    wait_until(lambda: isr(admin) == (1, [1, 2]), "node 3 left the ISR")
    check(health3()["disk"]["full"], "node 3 is still below its watermark (it copied nothing)")

    # With min.insync.replicas=3 the leader refuses acks=all, writing nothing.
    set_config(admin, "min.insync.replicas", "3")
    refused = []
    strict = Producer({"bootstrap.servers": BOOTSTRAP, "acks": "all", "retries": 0})
    strict.produce(TOPIC, b"needs-three", partition=0,
                   on_delivery=lambda err, msg: refused.append(err))
    strict.flush(30)
    check(len(refused) == 1 and refused[0] is not None
          and refused[0].code() == KafkaError.NOT_ENOUGH_REPLICAS,
          f"acks=all with min.insync.replicas=3 answers NOT_ENOUGH_REPLICAS: {refused}")
    set_config(admin, "min.insync.replicas", "2")

    # DeleteRecords: node 3 follows the leader's log start, frees space, catches up.
    end = max(acked.values()) + 1
    cut = end * 3 // 4
    for f in admin.delete_records([TopicPartition(TOPIC, 0, cut)]).values():
        check(f.result(30).low_watermark == cut, f"DeleteRecords moved the start to {cut}")
    wait_until(lambda: not health3()["disk"]["full"], "node 3 above its watermark again")
    wait_until(lambda: isr(admin) == (1, [1, 2, 3]), "node 3 caught up and rejoined the ISR",
               limit_s=60)

    # Everything acknowledged at or after the cut is read back.
    c = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": "disk-cluster",
                  "enable.auto.commit": False})
    c.assign([TopicPartition(TOPIC, 0, cut)])
    seen = {}
    deadline = time.time() + 60
    while len(seen) < end - cut and time.time() < deadline:
        for m in c.consume(1000, timeout=1):
            if m.error() is not None:
                check(False, f"consumer error {m.error()}")
            seen[m.value()] = m.offset()
    c.close()
    want = {v: o for v, o in acked.items() if o >= cut}
    check(seen == want, f"read back the {len(want)} acknowledged records from {cut} "
                        f"(read {len(seen)})")

    # The watermark as a broker config through the quorum: node 3 applies it from the
    # metadata, and deleting it goes back to node 3's flag.
    def set_watermark(value):
        op = AlterConfigOpType.SET if value else AlterConfigOpType.DELETE
        res = admin.incremental_alter_configs([ConfigResource(
            ConfigResource.Type.BROKER, "3",
            incremental_configs=[ConfigEntry("disk.min.free.bytes", value or "",
                                             incremental_operation=op)])])
        for f in res.values():
            f.result(30)

    huge = str(1 << 60)
    set_watermark(huge)
    wait_until(lambda: health3()["disk"]["full"],
               "disk.min.free.bytes=1 EiB set for broker 3 through the quorum applies there")
    shown = list(admin.describe_configs(
        [ConfigResource(ConfigResource.Type.BROKER, "3")]).values())[0].result(30)
    check(shown["disk.min.free.bytes"].value == huge,
          f"DescribeConfigs of broker 3 shows it ({shown['disk.min.free.bytes'].value})")
    set_watermark(None)
    wait_until(lambda: not health3()["disk"]["full"], "deleting it goes back to node 3's flag")


if __name__ == "__main__":
    main()
