#!/usr/bin/env python3
"""Prints N free loopback ports (default 3), all held until all are chosen, below the kernel's
ephemeral range: a port the kernel hands out for outgoing connections can be taken by one
between being probed here and a broker binding it (that broker then never starts or joins)."""
import random
import socket
import sys

n = int(sys.argv[1]) if len(sys.argv) > 1 else 3
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
held = []
for _ in range(100 * n):
    if len(held) == n:
        break
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", random.randrange(10000, max(low, 10001))))
        held.append(s)
    except OSError:
        s.close()
if len(held) < n:
    sys.exit(f"free-ports: found {len(held)} of {n} free ports below {low}")
print(*[x.getsockname()[1] for x in held])
