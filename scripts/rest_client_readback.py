"""Reads a topic back with librdkafka and checks that every record the REST client was told
was written is there, at its partition and offset, key and value byte for byte."""
import base64
import json
import sys
import time

from confluent_kafka import Consumer, TopicPartition

bootstrap, topic, sent_path = sys.argv[1:4]
sent = json.load(open(sent_path))
partitions = sorted({s["partition"] for s in sent})
c = Consumer({"bootstrap.servers": bootstrap, "group.id": "rest-client-readback",
              "enable.auto.commit": False, "log_level": 3})
c.assign([TopicPartition(topic, p, 0) for p in partitions])
got = {}
deadline = time.time() + 30
while len(got) < len(sent) and time.time() < deadline:
    m = c.poll(0.5)
    if m is None or m.error():
        continue
    got[(m.partition(), m.offset())] = (m.key(), m.value())
c.close()
bad = 0
for s in sent:
    want = (base64.b64decode(s["key"]) if s["key"] is not None else None,
            base64.b64decode(s["value"]) if s["value"] is not None else None)
    have = got.get((s["partition"], s["offset"]))
    if have != want:
        print(f"rest-client-e2e: at {s['partition']}/{s['offset']} want {want!r}, read {have!r}")
        bad += 1
if bad or len(got) != len(sent):
    print(f"rest-client-e2e: FAILED: {bad} records differ; read {len(got)}, the client wrote {len(sent)}")
    sys.exit(1)
print(f"rest-client-e2e: all {len(sent)} records read back byte for byte")
