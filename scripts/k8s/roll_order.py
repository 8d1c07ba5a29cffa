#!/usr/bin/env python3
"""Checks from a kube-apiserver audit log that a StatefulSet rolled one pod at a time under
the operator: after each of the operator's StatefulSet writes (a partition step), exactly one
pod is deleted, re-created and reported ready (kwok's status patch) before the next write.

  roll_order.py AUDIT_LOG SINCE_RFC3339 STS_NAME ORDINALS(e.g. 2,1,0)

Prints the timeline; exits 1 when the order is wrong."""
import json
import sys

log, since, sts, ordinals = sys.argv[1], sys.argv[2], sys.argv[3], [int(x) for x in sys.argv[4].split(",")]
events = []
for line in open(log):
    e = json.loads(line)
    t = e["requestReceivedTimestamp"]
    if t < since or e["responseStatus"]["code"] >= 300:
        continue
    o, ua = e["objectRef"], e.get("userAgent", "")
    name, res, sub = o.get("name", ""), o.get("resource"), o.get("subresource", "")
    if res == "statefulsets" and name == sts and not sub and "fieldManager=spate-operator" in e["requestURI"]:
        events.append((t, "step", None))
    elif res == "pods" and name.startswith(sts + "-") and not sub:
        k = int(name.rsplit("-", 1)[1])
        if e["verb"] == "delete" and ua.startswith("kube-controller-manager"):
            events.append((t, "delete", k))
        elif e["verb"] == "create":
            events.append((t, "create", k))
    elif res == "pods" and name.startswith(sts + "-") and sub == "status" and ua.startswith("kwok"):
        events.append((t, "ready", int(name.rsplit("-", 1)[1])))
events.sort()
t0 = events[0][0] if events else since
def ms(t):
    def secs(x):
        hms = x[11:-1].split(":")
        return int(hms[0]) * 3600 + int(hms[1]) * 60 + float(hms[2])
    return (secs(t) - secs(t0)) * 1000
for t, kind, k in events:
    print(f"  +{ms(t):7.1f} ms  {kind:6} {'' if k is None else f'{sts}-{k}'}")
# Expected: for each ordinal: step, delete k, create k, ready k; nothing else interleaved
# except further ready patches of pods already rolled.
seq = [(kind, k) for _, kind, k in events]
want = []
for k in ordinals:
    want += [("step", None), ("delete", k), ("create", k), ("ready", k)]
got = []
rolled = set()
for kind, k in seq:
    if kind == "ready" and (k in rolled and ("ready", k) in got):
        continue
    got.append((kind, k))
    if kind == "create":
        rolled.add(k)
if got[: len(want)] != want:
    print(f"FAIL: expected {want}\n  got {got}")
    sys.exit(1)
print(f"one pod at a time: {' -> '.join(f'{sts}-{k}' for k in ordinals)}, each ready before the next step")
