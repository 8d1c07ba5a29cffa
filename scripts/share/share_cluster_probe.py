#!/usr/bin/env python3
"""Finds a share-partition's share coordinator, for scripts/share-groups-cluster-e2e.sh.

    share_cluster_probe.py partition KEY PARTITIONS
        the __share_group_state partition holding KEY ("<group>:<topicId>:<partition>", the
        topic id as Kafka prints it): Utils.abs(KEY.hashCode()) % PARTITIONS, as Kafka's
        share coordinator places a share-partition (Java's String.hashCode over UTF-16 code
        units, 32-bit overflow; Utils.abs maps Integer.MIN_VALUE to 0).
    share_cluster_probe.py hashcode STRING
        Java's STRING.hashCode(), for checking the above against Java.
    share_cluster_probe.py find-coordinator BOOTSTRAP KEY_TYPE KEY
        asks the brokers in BOOTSTRAP (host:port,...; the first that answers) FindCoordinator
        (v4+, KEY_TYPE 0 group, 1 transaction, 2 share) for KEY; prints the node id, or
        "error CODE MESSAGE" when the broker answers with an error (exit 0 either way), and
        exits 1 when no broker answers.

Standard library only.
"""
import socket
import struct
import sys

FIND_COORDINATOR = 10
API_VERSIONS = 18


def java_hash(s):
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def state_partition(key, partitions):
    h = java_hash(key)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


def uvarint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


class Reader:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, n):
        v = self.data[self.pos:self.pos + n]
        if len(v) != n:
            raise ValueError("short response")
        self.pos += n
        return v

    def i8(self):
        return struct.unpack(">b", self.take(1))[0]

    def i16(self):
        return struct.unpack(">h", self.take(2))[0]

    def i32(self):
        return struct.unpack(">i", self.take(4))[0]

    def uvarint(self):
        shift = n = 0
        while True:
            b = self.take(1)[0]
            n |= (b & 0x7F) << shift
            if not b & 0x80:
                return n
            shift += 7

    def compact_str(self):
        n = self.uvarint()
        return None if n == 0 else self.take(n - 1).decode()

    def skip_tags(self):
        for _ in range(self.uvarint()):
            self.uvarint()
            self.take(self.uvarint())


def call(sock, api_key, version, body, flexible, corr):
    client = b"share-cluster-probe"
    header = struct.pack(">hhih", api_key, version, corr, len(client)) + client
    if flexible:
        header += b"\x00"
    msg = header + body
    sock.sendall(struct.pack(">i", len(msg)) + msg)
    size = struct.unpack(">i", recv_exact(sock, 4))[0]
    r = Reader(recv_exact(sock, size))
    if r.i32() != corr:
        raise ValueError("correlation id mismatch")
    if flexible:
        r.skip_tags()
    return r


def recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed")
        buf += chunk
    return buf


def find_coordinator(bootstrap, key_type, key):
    last = None
    for addr in bootstrap.split(","):
        host, port = addr.rsplit(":", 1)
        try:
            with socket.create_connection((host, int(port)), timeout=10) as sock:
                r = call(sock, API_VERSIONS, 0, b"", False, 1)
                err = r.i16()
                top = None
                for _ in range(r.i32()):
                    k, _lo, hi = r.i16(), r.i16(), r.i16()
                    if k == FIND_COORDINATOR:
                        top = hi
                if err or top is None or top < 4:
                    return f"error -1 FindCoordinator v4+ not offered (ApiVersions error {err}, max {top})"
                version = min(top, 6)
                k = key.encode()
                body = struct.pack(">b", key_type) + uvarint(2) + uvarint(len(k) + 1) + k + b"\x00"
                r = call(sock, FIND_COORDINATOR, version, body, True, 2)
                r.i32()  # throttle_time_ms
                n = r.uvarint() - 1
                if n < 1:
                    return "error -1 no coordinator entry in the response"
                r.compact_str()  # key
                node = r.i32()
                r.compact_str()  # host
                r.i32()  # port
                code = r.i16()
                message = r.compact_str()
                if code:
                    return f"error {code} {message or ''}".rstrip()
                return str(node)
        except (OSError, ValueError) as e:
            last = f"{addr}: {e}"
    print(f"no broker answered FindCoordinator ({last})", file=sys.stderr)
    sys.exit(1)


def main():
    args = sys.argv[1:]
    if len(args) == 3 and args[0] == "partition":
        print(state_partition(args[1], int(args[2])))
    elif len(args) == 2 and args[0] == "hashcode":
        print(java_hash(args[1]))
    elif len(args) == 4 and args[0] == "find-coordinator":
        print(find_coordinator(args[1], int(args[2]), args[3]))
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
