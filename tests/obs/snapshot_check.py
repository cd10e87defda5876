# SPDX-License-Identifier: MIT
"""tests/obs/snapshot_check.py - what a libemm EMM_SNAPSHOT pickle must hold
to be PyTorch's memory snapshot format (allocator/snapshot.h), checked
without PyTorch, and compared with the EMM_STATS JSON written at the same
moment. Used by tests/obs/check-obs.py (CPU) and tests/gpu/snapshot_viz.py
(which also loads it with torch.cuda._memory_viz).

problems(snapshot, stats=None) returns a list of strings (empty: fine);
wait_for(path) waits for a file another process writes."""
import os
import time

SEGMENT_KEYS = {"device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream",
                "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks"}
BLOCK_KEYS = {"address", "size", "requested_size", "state", "frames"}
STATES = {"active_allocated", "active_pending_free", "inactive"}
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom"}


def problems(s, stats=None):
    out = []
    if not isinstance(s, dict) or set(s) != {"segments", "device_traces"}:
        return ["top level: want a dict with segments and device_traces, got %r" % (type(s),)]
    for i, seg in enumerate(s["segments"]):
        where = "segment %d" % i
        if set(seg) != SEGMENT_KEYS:
            out.append("%s: keys %s" % (where, sorted(set(seg) ^ SEGMENT_KEYS)))
            continue
        if seg["segment_type"] not in ("small", "large") or seg["segment_pool_id"] != (0, 0):
            out.append("%s: segment_type/pool id" % where)
        addr, alloc, active, req = seg["address"], 0, 0, 0
        for j, b in enumerate(seg["blocks"]):
            if set(b) != BLOCK_KEYS or b["state"] not in STATES:
                out.append("%s block %d: keys or state %r" % (where, j, b))
                continue
            if b["address"] != addr:
                out.append("%s block %d: at %#x, the previous block ends at %#x" % (where, j, b["address"], addr))
            addr = b["address"] + b["size"]
            if b["state"] != "inactive":
                active += b["size"]
            if b["state"] == "active_allocated":
                alloc += b["size"]
                req += b["requested_size"]
                if not 0 < b["requested_size"] <= b["size"]:
                    out.append("%s block %d: requested %d of %d" % (where, j, b["requested_size"], b["size"]))
            elif b["requested_size"] != 0:
                out.append("%s block %d: a free block with a requested size" % (where, j))
        if addr != seg["address"] + seg["total_size"]:
            out.append("%s: blocks end at %#x, the segment at %#x" % (where, addr, seg["address"] + seg["total_size"]))
        if (alloc, active, req) != (seg["allocated_size"], seg["active_size"], seg["requested_size"]):
            out.append("%s: sums %s, stated %s" % (where, (alloc, active, req),
                                                    (seg["allocated_size"], seg["active_size"], seg["requested_size"])))
    if not isinstance(s["device_traces"], list) or not all(isinstance(d, list) for d in s["device_traces"]):
        out.append("device_traces: want a list of lists")
    else:
        for d in s["device_traces"]:
            for e in d:
                keys = {"action", "addr", "size", "stream", "time_us", "frames"} | (
                    {"device_free"} if e.get("action") == "oom" else set())
                if set(e) != keys or e["action"] not in ACTIONS:
                    out.append("trace entry %r" % (e,))
    if stats is not None:
        for dev in stats["devices"]:
            segs = [x for x in s["segments"] if x["device"] == dev["device"]]
            live = sum(1 for x in segs for b in x["blocks"] if b["state"] == "active_allocated")
            want = (dev["segments"], dev["reserved_bytes"], dev["allocated_bytes"], dev["live_blocks"])
            got = (len(segs), sum(x["total_size"] for x in segs), sum(x["allocated_size"] for x in segs), live)
            if got != want:
                out.append("device %d: (segments, reserved, allocated, live blocks) %s in the snapshot, %s in "
                           "the statistics" % (dev["device"], got, want))
    return out


def wait_for(path, timeout=10.0):
    """True once `path` exists and is not empty (within `timeout` seconds)."""
    end = time.time() + timeout
    while time.time() < end:
        if os.path.exists(path) and os.path.getsize(path) > 0:
            return True
        time.sleep(0.02)
    return False
