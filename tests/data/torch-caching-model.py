#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tests/data/torch-caching-model.py - replay a trace (EMM_LOG or RMM CSV,
device events only, one stream) through a model of PyTorch's caching
allocator (c10/cuda/CUDACachingAllocator.cpp, default settings: 512 B
rounding; <= 1 MiB from 2 MiB segments, < 10 MiB from 20 MiB segments,
larger rounded to 2 MiB; best fit by (size, address); a small block split
when >= 512 B remain, a large one when > 1 MiB remain; freed blocks merge
with free neighbours; no max_split_size, no garbage collection), one pool
for every thread as in PyTorch, and the same per thread ("arenas") to show
what keeping each thread's blocks apart costs. Prints a Markdown table of
peak allocated and reserved; with --peak, only the one-pool peak reserved
in bytes (tests/tools/test-replay-cli.sh compares it with emm-replay's).

    torch-caching-model.py TRACE.csv [--peak]
"""
import bisect
import csv
import sys

K512 = 512
SMALL = 1 << 20
SMALL_BUF = 2 << 20
LARGE_BUF = 20 << 20
MIN_LARGE = 10 << 20
ROUND_LARGE = 2 << 20


def round_size(s, div=0):
    if s < K512:
        return K512
    if div and s > K512:
        p = 1 << (s.bit_length() - 1)
        step = max(K512, p // div)
        return (s + step - 1) // step * step
    return (s + K512 - 1) // K512 * K512


def alloc_size(s):
    if s <= SMALL:
        return SMALL_BUF
    if s < MIN_LARGE:
        return LARGE_BUF
    return (s + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE


class Block:
    __slots__ = ("addr", "size", "prev", "next", "free", "small")

    def __init__(self, addr, size, small):
        self.addr, self.size, self.small = addr, size, small
        self.prev = self.next = None
        self.free = True


class Pool:
    def __init__(self):
        self.keys = []  # sorted (size, addr)
        self.blocks = {}

    def add(self, b):
        bisect.insort(self.keys, (b.size, b.addr))
        self.blocks[(b.size, b.addr)] = b

    def remove(self, b):
        k = (b.size, b.addr)
        i = bisect.bisect_left(self.keys, k)
        assert self.keys[i] == k
        del self.keys[i]
        del self.blocks[k]

    def best_fit(self, size):
        i = bisect.bisect_left(self.keys, (size, -1))
        if i == len(self.keys):
            return None
        return self.blocks[self.keys[i]]


class Alloc:
    def __init__(self, div=0, large_seg=LARGE_BUF):
        self.small, self.large = Pool(), Pool()
        self.reserved = self.allocated = 0
        self.next_addr = 1 << 40
        self.div = div
        self.large_seg = large_seg
        self.segments = 0

    def malloc(self, req):
        size = round_size(req, self.div)
        small = size <= SMALL
        pool = self.small if small else self.large
        b = pool.best_fit(size)
        if b is None:
            if small:
                a = SMALL_BUF
            elif size < self.large_seg // 2:
                a = self.large_seg
            else:
                a = (size + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE
            b = Block(self.next_addr, a, small)
            self.next_addr += a + (1 << 30)
            self.reserved += a
            self.segments += 1
        else:
            pool.remove(b)
        rem = b.size - size
        split = rem >= K512 if small else rem > SMALL
        if split:
            r = Block(b.addr + size, rem, small)
            r.prev, r.next = b, b.next
            if b.next:
                b.next.prev = r
            b.next = r
            b.size = size
            pool.add(r)
        b.free = False
        self.allocated += b.size
        return b

    def free(self, b):
        pool = self.small if b.small else self.large
        self.allocated -= b.size
        b.free = True
        for n in (b.prev, b.next):
            if n is not None and n.free:
                pool.remove(n)
                if n is b.prev:
                    b.addr, b.size, b.prev = n.addr, b.size + n.size, n.prev
                    if n.prev:
                        n.prev.next = b
                else:
                    b.size, b.next = b.size + n.size, n.next
                    if n.next:
                        n.next.prev = b
        pool.add(b)


def find_idle(pool, sz):
    i = bisect.bisect_left(pool.keys, (sz, -1))
    while i < len(pool.keys):
        b = pool.blocks[pool.keys[i]]
        if b.prev is None and b.next is None:
            return b
        i += 1
    return None


def run(path, arenas=1, div=0, large_seg=LARGE_BUF, cross=False, migrate=False, stats=None):
    allocs = [Alloc(div, large_seg) for _ in range(arenas)]
    tid_slot = {}
    live = {}
    peak_res = peak_all = 0
    traced = peak_traced = 0
    with open(path) as f:
        for row in csv.DictReader(f):
            if row.get("Memory", "device") != "device":
                continue
            tid = row["Thread"]
            if tid not in tid_slot:
                tid_slot[tid] = len(tid_slot) % arenas
            ptr = row["Pointer"]
            size = int(row["Size"])
            if row["Action"] == "allocate":
                a = allocs[tid_slot[tid]]
                b = None
                if cross and arenas > 1:
                    # miss in own arena: try the others before a new segment
                    sz = round_size(size, div)
                    pool = a.small if sz <= SMALL else a.large
                    if pool.best_fit(sz) is None:
                        for o in allocs:
                            if o is not a:
                                p2 = o.small if sz <= SMALL else o.large
                                if p2.best_fit(sz) is not None:
                                    a = o
                                    break
                if migrate and arenas > 1:
                    sz = round_size(size, div)
                    pool = a.small if sz <= SMALL else a.large
                    if pool.best_fit(sz) is None:
                        for o in allocs:
                            if o is a:
                                continue
                            p2 = o.small if sz <= SMALL else o.large
                            s2 = find_idle(p2, sz)
                            if s2 is not None:
                                p2.remove(s2)
                                o.reserved -= s2.size
                                a.reserved += s2.size
                                pool.add(s2)
                                if stats is not None:
                                    stats["migrations"] = stats.get("migrations", 0) + 1
                                break
                if cross and a is not allocs[tid_slot[tid]] and stats is not None:
                    stats["cross"] = stats.get("cross", 0) + 1
                b = a.malloc(size)
                live[ptr] = (a, b, size)
                traced += size
            elif row["Action"] == "free":
                a, b, size = live.pop(ptr)
                a.free(b)
                traced -= size
            res = sum(x.reserved for x in allocs)
            al = sum(x.allocated for x in allocs)
            peak_res = max(peak_res, res)
            peak_all = max(peak_all, al)
            peak_traced = max(peak_traced, traced)
    return peak_traced, peak_all, peak_res, sum(x.segments for x in allocs)


if __name__ == "__main__":
    path = sys.argv[1]
    if sys.argv[2:] == ["--peak"]:
        print(run(path)[2])
        sys.exit(0)
    M = 1 << 20
    print("| model | traced peak MiB | peak allocated MiB | peak reserved MiB | segments |")
    print("|---|---:|---:|---:|---:|")
    for name, kw in [("PyTorch (one pool)", {}),
                     ("PyTorch, roundup_power2_divisions=4", {"div": 4}),
                     ("one pool per thread (2 arenas)", {"arenas": 2}),
                     ("2 arenas, miss tries the other arena", {"arenas": 2, "cross": True}),
                     ("2 arenas, miss takes an idle segment of the other", {"arenas": 2, "migrate": True})]:
        st = {}
        t, a, r, s = run(path, stats=st, **kw)
        print("| %s | %.1f | %.1f | %.1f | %d |%s" % (name, t / M, a / M, r / M, s,
              " %d blocks from the other arena" % st["cross"] if "cross" in st else
              " %d segments moved" % st["migrations"] if "migrations" in st else ""))
