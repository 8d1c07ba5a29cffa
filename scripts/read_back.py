"""Reads records back from the start of a partition, for the end-to-end scripts that check
what a client wrote (the schema registry e2es): one bounded loop instead of one per script."""

import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition


def read_back(conf, topic, n, decode=lambda m: m.value(), partition=0, seconds=30):
    """`decode(message)` of the first `n` records of `topic`'s `partition`.

    `conf` is the consumer's configuration (bootstrap, credentials, group.id); a record with
    an error fails the read, and so does having fewer than `n` after `seconds`."""
    consumer = Consumer({"enable.auto.commit": False, **conf})
    consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
    out, deadline = [], time.time() + seconds
    try:
        while len(out) < n:
            assert time.time() < deadline, f"read {len(out)} of {n} records of {topic}"
            m = consumer.poll(0.5)
            if m is None:
                continue
            assert m.error() is None, m.error()
            out.append(decode(m))
    finally:
        consumer.close()
    return out
