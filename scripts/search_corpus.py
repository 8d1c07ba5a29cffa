"""A realistic log corpus for search benchmarks: JSON log lines with varied fields and a large
vocabulary (not a 35-word list), deterministic from a seed, about 400-700 bytes each.

    search_corpus.py produce BOOTSTRAP TOPIC PARTITIONS COUNT   (prints records and bytes)
    search_corpus.py sample N                                   (prints N lines)
"""

import json
import random
import sys
import time

SYLLABLES = ("ka ro mi tu sen val dor ex pri ql un ta ve lo zi gra fen ost pol mar kin "
             "del sho ran tel vor bi ne os ir at um ek sa ly").split()
SERVICES = [f"{a}-{b}" for a in ("checkout", "search", "auth", "billing", "catalog", "ledger",
                                  "gateway", "notify", "media", "inventory")
            for b in ("api", "worker")]
LEVELS = ["info"] * 70 + ["debug"] * 15 + ["warn"] * 10 + ["error"] * 5
METHODS = ["GET"] * 6 + ["POST"] * 3 + ["PUT", "DELETE"]
STATUS = [200] * 80 + [201] * 5 + [204] * 3 + [301, 304] + [400] * 3 + [401, 403] + [404] * 3 + [500, 502, 503]
TEMPLATES = [
    "request {w1} {w2} completed for user {user} in {ms} ms",
    "cache miss on {w1}:{id} falling back to {w2}",
    "connection to {host}:{port} {w1} after {ms} ms",
    "order {id} moved from {w1} to {w2} by {user}",
    "retrying {w1} {w2} attempt {n} of 5",
    "payment {id} {w1} with code {code}",
    "slow query on {w1}_{w2} took {ms} ms rows={n}",
    "user {user} signed in from {ip} agent {w1}/{n}.{n2}",
    "queue {w1} depth {n} lag {ms} ms consumer {w2}",
    "failed to parse {w1} field {w2}: unexpected token at {n}",
]


class Corpus:
    """Log documents; `doc(i, ms)` is the i-th with time `ms`."""

    def __init__(self, seed=7, words=8000):
        self.rng = random.Random(seed)
        r = self.rng
        self.words = sorted({"".join(r.choice(SYLLABLES) for _ in range(r.randint(2, 4)))
                             for _ in range(words * 2)})[:words]
        self.hosts = [f"ip-10-{r.randint(0, 255)}-{r.randint(0, 255)}-{r.randint(0, 255)}"
                      for _ in range(300)]
        self.paths = [f"/{r.choice(self.words)}/{r.choice(self.words)}" for _ in range(2000)]

    def doc(self, i, ms):
        r = self.rng
        w = self.words
        message = r.choice(TEMPLATES).format(
            w1=r.choice(w), w2=r.choice(w), user=f"u{r.randint(1, 50000)}",
            ms=r.randint(1, 5000), id=f"{r.getrandbits(40):010x}", host=r.choice(self.hosts),
            port=r.choice((443, 5432, 6379, 9092)), n=r.randint(1, 999), n2=r.randint(0, 99),
            code=r.choice(("E001", "E042", "D17", "OK")), ip=f"10.{r.randint(0, 255)}.{r.randint(0, 255)}.{r.randint(1, 254)}")
        t = time.gmtime(ms // 1000)
        doc = {
            "@timestamp": time.strftime("%Y-%m-%dT%H:%M:%S", t) + f".{ms % 1000:03d}Z",
            "level": r.choice(LEVELS),
            "service": r.choice(SERVICES),
            "host": r.choice(self.hosts),
            "trace_id": f"{r.getrandbits(64):016x}",
            "message": message,
            "http": {
                "method": r.choice(METHODS),
                "path": r.choice(self.paths) + (f"/{r.randint(1, 99999)}" if r.random() < 0.4 else ""),
                "status": r.choice(STATUS),
                "latency_ms": round(r.lognormvariate(3, 1), 2),
                "bytes": r.randint(0, 200000),
            },
            "tags": r.sample(w[:200], r.randint(0, 3)),
            "seq": i,
        }
        if r.random() < 0.3:
            doc["error"] = {"kind": r.choice(w), "stack": " ".join(r.choice(w) for _ in range(r.randint(5, 25)))}
        if r.random() < 0.5:
            doc["user"] = {"id": f"u{r.randint(1, 50000)}", "region": r.choice(("eu-west", "us-east", "ap-south"))}
        return doc


def produce(bootstrap, topic, partitions, count):
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, "acks": "1", "linger.ms": 20,
                  "batch.size": 1 << 20, "queue.buffering.max.kbytes": 1 << 20})
    c = Corpus()
    start_ms = int(time.time() * 1000) - count  # one record per millisecond, ending now
    total = 0
    failed = []
    for i in range(count):
        v = json.dumps(c.doc(i, start_ms + i), separators=(",", ":")).encode()
        total += len(v)
        while True:
            try:
                p.produce(topic, value=v, partition=i % partitions,
                          on_delivery=lambda e, m: e and failed.append(e))
                break
            except BufferError:
                p.poll(0.05)
        if i % 5000 == 0:
            p.poll(0)
    if p.flush(120) != 0 or failed:
        sys.exit(f"not every record was acknowledged: {failed[:3]}")
    print(count, total)


if __name__ == "__main__":
    if sys.argv[1] == "produce":
        produce(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    elif sys.argv[1] == "sample":
        c = Corpus()
        for i in range(int(sys.argv[2])):
            print(json.dumps(c.doc(i, 1_700_000_000_000 + i * 1000)))
