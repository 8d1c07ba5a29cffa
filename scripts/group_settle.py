"""Time for a librdkafka consumer group of 3 to settle when a 4th member joins.

Starts 3 consumers on a fresh 12-partition topic, waits until they share all partitions, then
starts a 4th and measures from its subscribe() until all 4 hold assignments covering every
partition once. Repeats ROUNDS times and prints each time and the median.
    python3 scripts/group_settle.py BOOTSTRAP [ROUNDS]
"""
import statistics
import sys
import threading
import time
import uuid

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic

PARTITIONS = 12


def run(bootstrap, rounds):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = f"settle-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])[topic].result()
    times = []
    for r in range(rounds):
        group = f"settle-{uuid.uuid4().hex[:8]}"
        stop = threading.Event()
        assignments = {}
        lock = threading.Lock()

        def member(name):
            c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "client.id": name,
                          "session.timeout.ms": 10000, "heartbeat.interval.ms": 1000,
                          "partition.assignment.strategy": "range"})
            c.subscribe([topic])
            while not stop.is_set():
                c.poll(0.05)
                with lock:
                    assignments[name] = sorted(tp.partition for tp in c.assignment())
            c.close()

        def settled(n):
            with lock:
                parts = [p for a in assignments.values() for p in a]
                return len(assignments) == n and all(assignments.values()) and sorted(parts) == list(range(PARTITIONS))

        threads = [threading.Thread(target=member, args=(f"m{i}",)) for i in range(3)]
        for t in threads:
            t.start()
        deadline = time.time() + 60
        while not settled(3) and time.time() < deadline:
            time.sleep(0.01)
        t0 = time.time()
        extra = threading.Thread(target=member, args=("m3",))
        extra.start()
        threads.append(extra)
        while not settled(4) and time.time() < deadline + 60:
            time.sleep(0.005)
        took = time.time() - t0
        stop.set()
        for t in threads:
            t.join()
        if settled(4):
            times.append(took)
            print(f"round {r}: settled in {took * 1000:.0f} ms")
        else:
            print(f"round {r}: did not settle")
    if times:
        print(f"median settle time after a join: {statistics.median(times) * 1000:.0f} ms over {len(times)} rounds")


if __name__ == "__main__":
    run(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 5)
