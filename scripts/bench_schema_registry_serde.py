#!/usr/bin/env python3
"""Serializer overhead for scripts/bench-schema-registry.sh: confluent-kafka-python producing
to spate with AvroSerializer (schema registry in the same spate process) against producing
plain bytes of the same size, then consuming each topic back (AvroDeserializer against raw
bytes). Each phase is bounded by RECORDS and SECONDS. Prints one JSON line per phase: records,
seconds, records/s, client CPU s (this process), spate CPU s (from /proc), and CPU microseconds
per record for each.

Env: SPATE_BOOTSTRAP, SPATE_REGISTRY (http://...), SPATE_PID; SERDE_RECORDS (200000),
SERDE_SECONDS (60)."""
import json
import os
import random
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

BOOTSTRAP = os.environ["SPATE_BOOTSTRAP"]
REGISTRY = os.environ["SPATE_REGISTRY"]
PID = int(os.environ["SPATE_PID"])
N = int(os.environ.get("SERDE_RECORDS", "200000"))
SECONDS = float(os.environ.get("SERDE_SECONDS", "60"))
RUN = f"{os.getpid()}-{int(time.time())}"

SCHEMA = json.dumps({
    "type": "record", "name": "Order", "namespace": "bench",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "currency", "type": {"type": "enum", "name": "Currency", "symbols": ["EUR", "USD", "GBP"]}},
        {"name": "items", "type": {"type": "array", "items": "string"}},
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
})
CUSTOMERS = [f"customer-{i:05d}" for i in range(1000)]
ITEMS = [f"sku-{i:04d}" for i in range(200)]


def record(i, rnd):
    return {"id": i, "customer": rnd.choice(CUSTOMERS), "amount": round(rnd.uniform(1, 500), 2),
            "currency": rnd.choice(["EUR", "USD", "GBP"]),
            "items": [rnd.choice(ITEMS) for _ in range(rnd.randint(1, 4))],
            "note": None if rnd.random() < 0.7 else "leave at the door"}


def spate_cpu():
    f = open(f"/proc/{PID}/stat").read()
    f = f[f.rindex(")") + 2:].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def measure(name, fn):
    c0, s0, t0 = time.process_time(), spate_cpu(), time.time()
    n = fn()
    secs, client, server = time.time() - t0, time.process_time() - c0, spate_cpu() - s0
    out = {"phase": name, "records": n, "seconds": round(secs, 3), "per_sec": round(n / secs, 1),
           "client_cpu_s": round(client, 3), "spate_cpu_s": round(server, 3),
           "client_cpu_us_per_record": round(client / n * 1e6, 2),
           "spate_cpu_us_per_record": round(server / n * 1e6, 2)}
    print(json.dumps(out), flush=True)
    return out


def produce(topic, values):
    """Produces values() until N records or SECONDS; returns how many were acknowledged."""
    p = Producer({"bootstrap.servers": BOOTSTRAP, "linger.ms": 5, "acks": 1, "compression.type": "none",
                  "log_level": 3})
    acked = [0]

    def cb(err, _msg):
        if err is None:
            acked[0] += 1

    deadline = time.time() + SECONDS
    for i, v in enumerate(values()):
        if i >= N or time.time() > deadline:
            break
        while True:
            try:
                p.produce(topic, v, on_delivery=cb)
                break
            except BufferError:
                p.poll(0.05)
        if i % 1000 == 0:
            p.poll(0)
    p.flush(60)
    return acked[0]


def consume(topic, n, decode):
    # Assigned, not subscribed: no group join inside the measured time.
    c = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": f"bench-{topic}", "enable.auto.commit": False,
                  "log_level": 3})
    c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    got, deadline = 0, time.time() + SECONDS
    while got < n and time.time() < deadline:
        for m in c.consume(1000, 1.0):
            if m.error():
                continue
            decode(m)
            got += 1
    c.close()
    return got


def main():
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP, "log_level": 3})
    avro_topic, plain_topic = f"serde-avro-{RUN}", f"serde-plain-{RUN}"
    for f in admin.create_topics([NewTopic(t, 1, 1) for t in (avro_topic, plain_topic)]).values():
        f.result(30)
    sr = SchemaRegistryClient({"url": REGISTRY})
    ser = AvroSerializer(sr, SCHEMA)
    de = AvroDeserializer(sr)
    ctx = SerializationContext(avro_topic, MessageField.VALUE)
    # The plain run sends bytes of the sizes the Avro run produced, precomputed.
    rnd = random.Random(7)
    sizes = [len(ser(record(i, rnd), ctx)) for i in range(5000)]

    def avro_values():
        r = random.Random(1)
        i = 0
        while True:
            yield ser(record(i, r), ctx)
            i += 1

    def plain_values():
        pool = [os.urandom(s) for s in sizes]
        i = 0
        while True:
            yield pool[i % len(pool)]
            i += 1

    results = {"mean_value_bytes": round(sum(sizes) / len(sizes), 1)}
    print(json.dumps(results), flush=True)
    results["produce_plain"] = measure("produce plain bytes", lambda: produce(plain_topic, plain_values))
    results["produce_avro"] = measure("produce AvroSerializer", lambda: produce(avro_topic, avro_values))
    n_plain, n_avro = results["produce_plain"]["records"], results["produce_avro"]["records"]
    results["consume_plain"] = measure("consume plain bytes", lambda: consume(plain_topic, n_plain, lambda m: m.value()))
    results["consume_avro"] = measure(
        "consume AvroDeserializer",
        lambda: consume(avro_topic, n_avro, lambda m: de(m.value(), SerializationContext(avro_topic, MessageField.VALUE))))
    print("RESULT " + json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
