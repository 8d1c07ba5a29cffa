"""A minimal cluster DNS for scripts/image/kubelet-operator-e2e.sh (no CoreDNS here: no image
registry, and the test needs only the Service records a StatefulSet's pods use).

  cluster_dns.py LISTEN_IP:PORT KUBECONFIG [DOMAIN]

Polls the apiserver (Services and EndpointSlices, every 0.5 s) and answers A queries over UDP:
  <hostname>.<service>.<ns>.svc.<domain>  the pod behind a headless Service's endpoint
                                          (the names spate's peers and advertised
                                          addresses use; not-ready endpoints too when the
                                          Service publishes them, as CoreDNS does)
  <service>.<ns>.svc.<domain>             a headless Service: its endpoints' addresses;
                                          a ClusterIP Service: its READY endpoints'
                                          addresses, not the ClusterIP, since no kube-proxy
                                          runs on the test node (the one deviation from
                                          CoreDNS's kubernetes plugin)
Any other name is NXDOMAIN (no upstream: the test network is closed); a known name asked
for another type (AAAA) gets an empty NOERROR answer. TTL 1 s, so a re-created pod's new
address is seen at once. Prints per-name answer counts on SIGTERM.
"""

import json
import signal
import socket
import ssl
import struct
import sys
import threading
import time
import urllib.request


def kubeconfig(path):
    server = token = None
    for line in open(path):
        line = line.strip()
        if line.startswith("server:"):
            server = line.split(None, 1)[1]
        elif line.startswith("token:"):
            token = line.split(None, 1)[1]
    assert server and token, f"{path}: no server or token"
    return server, token


class Records:
    def __init__(self, server, token, domain):
        self.server, self.token, self.domain = server, token, domain
        self.ctx = ssl.create_default_context()
        self.ctx.check_hostname = False
        self.ctx.verify_mode = ssl.CERT_NONE
        self.names = {}
        self.errors = 0

    def get(self, path):
        req = urllib.request.Request(self.server + path,
                                     headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(req, context=self.ctx, timeout=5) as r:
            return json.load(r)["items"]

    def refresh(self):
        services = self.get("/api/v1/services")
        slices = self.get("/apis/discovery.k8s.io/v1/endpointslices")
        svc = {(s["metadata"]["namespace"], s["metadata"]["name"]): s["spec"] for s in services}
        names = {}
        for es in slices:
            ns = es["metadata"]["namespace"]
            name = es["metadata"].get("labels", {}).get("kubernetes.io/service-name")
            spec = svc.get((ns, name))
            if spec is None or es.get("addressType") != "IPv4":
                continue
            headless = spec.get("clusterIP") == "None"
            publish = spec.get("publishNotReadyAddresses", False)
            base = f"{name}.{ns}.svc.{self.domain}"
            names.setdefault(base, [])
            for ep in es.get("endpoints") or []:
                ready = ep.get("conditions", {}).get("ready", False)
                if not (ready or (headless and publish)):
                    continue
                names[base].extend(ep["addresses"])
                if headless and ep.get("hostname"):
                    names.setdefault(f"{ep['hostname']}.{base}", []).extend(ep["addresses"])
        self.names = names

    def loop(self):
        while True:
            try:
                self.refresh()
            except Exception as e:  # the apiserver restarting or slow: keep the last records
                self.errors += 1
                if self.errors <= 5:
                    print(f"cluster_dns: refresh failed: {e}", file=sys.stderr, flush=True)
            time.sleep(0.5)


def answer(query, records, counts):
    if len(query) < 12:
        return None
    qid, flags, qd = struct.unpack(">HHH", query[:6])
    if qd != 1:
        return None
    labels, i = [], 12
    while i < len(query) and query[i] != 0:
        n = query[i]
        labels.append(query[i + 1:i + 1 + n].decode("ascii", "replace").lower())
        i += 1 + n
    qtype, _qclass = struct.unpack(">HH", query[i + 1:i + 5])
    question = query[12:i + 5]
    name = ".".join(labels)
    addrs = records.names.get(name)
    rd = flags & 0x0100
    if addrs is None:
        counts[("NXDOMAIN", name)] = counts.get(("NXDOMAIN", name), 0) + 1
        return struct.pack(">HHHHHH", qid, 0x8400 | rd | 3, 1, 0, 0, 0) + question
    answers = b""
    n = 0
    if qtype == 1:
        for a in dict.fromkeys(addrs):
            answers += struct.pack(">HHHIH", 0xC00C, 1, 1, 1, 4) + socket.inet_aton(a)
            n += 1
        counts[("A", name)] = counts.get(("A", name), 0) + 1
    # rcode NOERROR; authoritative; an existing name without records is an empty answer
    return struct.pack(">HHHHHH", qid, 0x8400 | rd, 1, n, 0, 0) + question + answers


def main():
    host, port = sys.argv[1].rsplit(":", 1)
    server, token = kubeconfig(sys.argv[2])
    domain = sys.argv[3] if len(sys.argv) > 3 else "cluster.local"
    records = Records(server, token, domain)
    records.refresh()
    threading.Thread(target=records.loop, daemon=True).start()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((host, int(port)))
    counts = {}

    def stop(*_):
        for (kind, name), n in sorted(counts.items()):
            print(f"cluster_dns: {kind} {name} x{n}", file=sys.stderr)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    print(f"cluster_dns: serving {domain} on {host}:{port}", file=sys.stderr, flush=True)
    while True:
        data, peer = sock.recvfrom(4096)
        try:
            reply = answer(data, records, counts)
        except Exception as e:  # a malformed query: no answer
            print(f"cluster_dns: bad query from {peer}: {e}", file=sys.stderr, flush=True)
            continue
        if reply:
            sock.sendto(reply, peer)


if __name__ == "__main__":
    main()
