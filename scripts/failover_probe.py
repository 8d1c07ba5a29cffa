"""Failover time of a 3-node cluster: kill -9 the leader of a partition of TOPIC while a
producer writes to it with acks=all, one record at a time, and measure from the kill until the
first record written after it is acknowledged (by the new leader).

    python3 scripts/failover_probe.py BOOTSTRAP TOPIC NODE=PID [NODE=PID ...]

PROBE_PARTITION picks the partition (default 0), and so which node is killed.

Prints one line: `failover_ms=<n> killed_node=<id> acked_before=<n>`; exits 1 when no record
was acknowledged within 120 s of the kill. Used by scripts/bench-cluster-vs-kafka.sh for spate
and Kafka alike, with the same client (librdkafka via confluent-kafka).
"""
import os
import signal
import sys
import time

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient


def main():
    bootstrap, topic = sys.argv[1], sys.argv[2]
    pids = {int(k): int(v) for k, v in (a.split("=") for a in sys.argv[3:])}
    partition = int(os.environ.get("PROBE_PARTITION", "0"))
    admin = AdminClient({"bootstrap.servers": bootstrap})
    prod = Producer({
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 0,
        "message.timeout.ms": 120000,
        "retry.backoff.ms": 50,
        "retry.backoff.max.ms": 500,
        "topic.metadata.refresh.interval.ms": 1000,
    })
    result = {}

    def send(i):
        result.clear()
        prod.produce(topic, value=str(i).encode(), partition=partition,
                     on_delivery=lambda err, msg: result.update(err=err))
        deadline = time.monotonic() + 125
        while "err" not in result and time.monotonic() < deadline:
            prod.poll(0.005)
        return result.get("err", "timeout")

    # Warm up: leader known, connections open, a steady flow of acknowledged records.
    for i in range(200):
        err = send(i)
        if err is not None:
            print(f"warm-up record {i} failed: {err}", file=sys.stderr)
            return 1
    leader = admin.list_topics(topic, timeout=10).topics[topic].partitions[partition].leader
    os.kill(pids[leader], signal.SIGKILL)
    killed = time.monotonic()
    err = send(10_000)
    took = time.monotonic() - killed
    if err is not None:
        print(f"no acknowledgement after the kill: {err}", file=sys.stderr)
        return 1
    print(f"failover_ms={took * 1000:.0f} killed_node={leader} partition={partition} acked_before=200")
    return 0


if __name__ == "__main__":
    sys.exit(main())
