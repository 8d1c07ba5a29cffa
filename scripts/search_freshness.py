"""Time-to-searchable of a searchable topic: produce at a fixed rate with librdkafka
(confluent-kafka) and, in parallel, poll the search endpoint for the newest searchable offset
of every partition. A record's freshness is the time from its acknowledgement to the first
poll that saw its offset searchable. Prints p50/p90/p99/max; asserts nothing.

    search_freshness.py BOOTSTRAP HTTP TOPIC PARTITIONS RATE SECONDS [SIZE]

SIZE `corpus` sends JSON log lines of scripts/search_corpus.py instead of SIZE-byte text.
"""

import collections
import json
import sys
import threading
import time
import urllib.request

from confluent_kafka import Producer


def newest_searchable(http, topic, partitions, known):
    """The highest searchable offset of each partition, by a terms aggregation over only the
    records above the lowest offset `known` already (so a poll stays cheap as the index grows).
    One range clause, not one per partition: each range reads the offset column of the whole
    topic index, and a clause per partition would make the poll itself the load."""
    floor = min((known.get(p, -1) for p in range(partitions)), default=-1)
    body = json.dumps({
        "size": 0,
        "query": {"range": {"offset": {"gt": floor}}},
        "aggs": {"p": {"terms": {"field": "partition", "size": partitions},
                       "aggs": {"top": {"max": {"field": "offset"}}}}},
    }).encode()
    req = urllib.request.Request(f"http://{http}/{topic}/_search", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        v = json.load(r)
    out = dict(known)
    for b in v.get("aggregations", {}).get("p", {}).get("buckets", []):
        if b["top"]["value"] is not None:
            out[int(b["key"])] = max(out.get(int(b["key"]), -1), int(b["top"]["value"]))
    return out


def main():
    bootstrap, http, topic = sys.argv[1], sys.argv[2], sys.argv[3]
    partitions, rate, seconds = int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
    corpus = None
    if len(sys.argv) > 7 and sys.argv[7] == "corpus":
        sys.path.insert(0, __import__("os").path.dirname(__file__))
        from search_corpus import Corpus
        corpus = Corpus()
        size = 0
    else:
        size = int(sys.argv[7]) if len(sys.argv) > 7 else 512
    words = "alpha beta gamma delta error warn info debug trace fatal".split()
    # Per partition, acknowledged offsets not yet seen searchable, in offset order.
    unseen = {p: collections.deque() for p in range(partitions)}
    lock = threading.Lock()
    stop = threading.Event()
    samples = []
    counts = {"acked": 0}

    def on_delivery(err, msg):
        if err is None:
            with lock:
                unseen[msg.partition()].append((msg.offset(), time.monotonic()))
                counts["acked"] += 1

    def poll_search():
        newest = {}
        while not stop.is_set():
            try:
                newest = newest_searchable(http, topic, partitions, newest)
            except Exception as e:  # a failed poll is retried; it is not a freshness sample
                print(f"poll failed: {e}", file=sys.stderr)
                time.sleep(0.05)
                continue
            now = time.monotonic()
            with lock:
                for p, q in unseen.items():
                    top = newest.get(p, -1)
                    while q and q[0][0] <= top:
                        samples.append(now - q.popleft()[1])
            time.sleep(0.01)

    poller = threading.Thread(target=poll_search, daemon=True)
    poller.start()
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "1", "linger.ms": 5})
    started = time.monotonic()
    sent = 0
    while time.monotonic() - started < seconds:
        due = int((time.monotonic() - started) * rate)
        while sent < due:
            if corpus is not None:
                doc = corpus.doc(sent, int(time.time() * 1000))
                value = json.dumps(doc, separators=(",", ":")).encode()
            else:
                text = " ".join(words[(sent * 7 + i) % len(words)] for i in range(size // 6))
                value = f"r{sent} {text}"[:size].encode()
            producer.produce(topic, value=value, partition=sent % partitions,
                             on_delivery=on_delivery)
            sent += 1
            if sent % 1000 == 0:
                producer.poll(0)
        producer.poll(0.001)
    producer.flush(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with lock:
            if not any(unseen.values()):
                break
        time.sleep(0.05)
    stop.set()
    poller.join(5)
    with lock:
        samples.sort()
        missing = sum(len(q) for q in unseen.values())
    if not samples:
        print("no samples")
        return
    pct = lambda q: samples[min(len(samples) - 1, int(q * len(samples)))] * 1000
    print(f"freshness over {len(samples)} records at {rate}/s: p50 {pct(0.5):.0f} ms "
          f"p90 {pct(0.9):.0f} ms p99 {pct(0.99):.0f} ms max {samples[-1] * 1000:.0f} ms"
          f" (never seen: {missing})")


if __name__ == "__main__":
    main()
