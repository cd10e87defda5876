#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tests/data/gen-synthetic-trace.py [--steps N] [--seed S] [-o FILE]

Writes a synthetic allocation trace in libemm's EMM_LOG format (RMM's
columns: Thread,Time,Action,Pointer,Size,Stream) shaped like a small
transformer training loop, until GPU-recorded traces replace it
(tests/data/record-traces.sh). Deterministic for a given seed.

Threads: the main thread (forward pass, optimizer), the autograd device
thread (backward pass), a data-loader thread (input batches, on the copy
stream) and a metrics thread (loss scalars). Streams: parameters and
optimizer state are allocated synchronously (0x0), activations on the
compute stream, input batches on the copy stream and freed on the compute
stream. The sequence length changes every step, so activation sizes do too
(the fragmentation-heavy case). Gradients are freed by zero_grad and
allocated again by the backward pass each step. The trace ends with one
failed request (a 1 TiB evaluation batch).
"""
import argparse
import random
import sys

COMPUTE = 0x5581C6A3E2F0
COPY = 0x5581C6A3F410
SYNC = 0x0

THREAD_MAIN, THREAD_BACKWARD, THREAD_LOADER, THREAD_METRICS = 40121, 40158, 40133, 40170


class Tracer:
    """Hands out addresses like a caching allocator (freed addresses of the
    same rounded size are reused, most recent first) and writes lines."""

    def __init__(self, out, start):
        self.out = out
        self.time_us = start
        self.next_addr = 0x7F3A40000000
        self.free_by_size = {}
        self.live = {}
        out.write('Thread,Time,Action,Pointer,Size,Stream\n')

    def tick(self, us):
        self.time_us += us

    def _line(self, thread, action, ptr, size, stream):
        self.tick(random.randint(1, 6))
        sec, us = divmod(self.time_us, 1000000)
        self.out.write(f'{thread},{sec}.{us:06d},{action},{ptr:#x},{size},{stream:#x}\n')

    def alloc(self, thread, size, stream):
        rounded = (size + 511) // 512 * 512
        pool = self.free_by_size.get(rounded)
        if pool:
            ptr = pool.pop()
        else:
            ptr = self.next_addr
            self.next_addr += (rounded + 0x1FFFFF) // 0x200000 * 0x200000 if rounded > 0x100000 else rounded
        self.live[ptr] = rounded
        self._line(thread, 'allocate', ptr, size, stream)
        return (ptr, size)

    def free(self, thread, block, stream):
        ptr, size = block
        rounded = self.live.pop(ptr)
        self.free_by_size.setdefault(rounded, []).append(ptr)
        self._line(thread, 'free', ptr, size, stream)

    def fail(self, thread, size, stream):
        self._line(thread, 'allocate failure', 0, size, stream)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--steps', type=int, default=12)
    ap.add_argument('--seed', type=int, default=12)
    ap.add_argument('--layers', type=int, default=4)
    ap.add_argument('--hidden', type=int, default=512)
    ap.add_argument('-o', '--output', default='-')
    args = ap.parse_args()
    random.seed(args.seed)
    out = sys.stdout if args.output == '-' else open(args.output, 'w')
    tr = Tracer(out, 1763675732 * 1000000)
    h, f32 = args.hidden, 4
    vocab, batch = 4096, 8

    # Parameters: embedding, per layer qkv/proj/mlp weights, biases, norms.
    shapes = [vocab * h]
    for _ in range(args.layers):
        shapes += [3 * h * h, 3 * h, h * h, h, 4 * h * h, 4 * h, 4 * h * h, h, h, h, h, h]
    shapes += [h, h]
    params = [tr.alloc(THREAD_MAIN, n * f32, SYNC) for n in shapes]
    grads, adam = [], []

    for step in range(args.steps):
        tr.tick(random.randint(40000, 120000))  # data loading, logging: a gap between steps
        seq = random.choice([96, 128, 160, 200, 256, 320, 384, 448, 512])
        tokens = batch * seq
        # The loader prepares the batch on the copy stream.
        ids = tr.alloc(THREAD_LOADER, tokens * 8, COPY)
        labels = tr.alloc(THREAD_LOADER, tokens * 8, COPY)
        # zero_grad(set_to_none=True): last step's gradients go.
        for g in grads:
            tr.free(THREAD_MAIN, g, SYNC)
        grads = []
        # Forward: saved activations, and temporaries freed at once.
        saved = [tr.alloc(THREAD_MAIN, tokens * h * f32, COMPUTE)]
        for _ in range(args.layers):
            tr.tick(random.randint(1500, 4000))  # the layer's kernels run
            qkv = tr.alloc(THREAD_MAIN, tokens * 3 * h * f32, COMPUTE)
            scores = tr.alloc(THREAD_MAIN, batch * 8 * seq * seq * f32, COMPUTE)
            tmp = tr.alloc(THREAD_MAIN, batch * 8 * seq * f32, COMPUTE)
            tr.free(THREAD_MAIN, tmp, COMPUTE)
            attn = tr.alloc(THREAD_MAIN, tokens * h * f32, COMPUTE)
            mlp = tr.alloc(THREAD_MAIN, tokens * 4 * h * f32, COMPUTE)
            act = tr.alloc(THREAD_MAIN, tokens * 4 * h * f32, COMPUTE)
            out_ = tr.alloc(THREAD_MAIN, tokens * h * f32, COMPUTE)
            saved += [qkv, scores, attn, mlp, act, out_]
            for _ in range(random.randint(2, 5)):  # norms, masks, small scratch
                s = tr.alloc(THREAD_MAIN, random.choice([512, 2048, tokens * 4, tokens * 8, h * f32]), COMPUTE)
                tr.free(THREAD_MAIN, s, COMPUTE)
        logits = tr.alloc(THREAD_MAIN, tokens * 256 * f32, COMPUTE)  # a vocabulary shard
        loss = tr.alloc(THREAD_MAIN, 4, COMPUTE)
        tr.free(THREAD_MAIN, ids, COMPUTE)  # allocated on the copy stream
        # Backward on the autograd device thread, last layer first.
        tr.tick(random.randint(50, 300))
        dlogits = tr.alloc(THREAD_BACKWARD, tokens * 256 * f32, COMPUTE)
        tr.free(THREAD_BACKWARD, logits, COMPUTE)
        tr.free(THREAD_BACKWARD, labels, COMPUTE)
        grad_at = {}
        for i in reversed(range(len(params))):
            tr.tick(random.randint(200, 900))
            grad_at[i] = tr.alloc(THREAD_BACKWARD, params[i][1], COMPUTE)
            if i % 12 == 1 and saved:
                for _ in range(min(6, len(saved))):
                    dx = tr.alloc(THREAD_BACKWARD, saved[-1][1], COMPUTE)
                    tr.free(THREAD_BACKWARD, saved.pop(), COMPUTE)
                    tr.free(THREAD_BACKWARD, dx, COMPUTE)
        tr.free(THREAD_BACKWARD, dlogits, COMPUTE)
        for block in saved:
            tr.free(THREAD_BACKWARD, block, COMPUTE)
        grads = [grad_at[i] for i in range(len(params))]
        # The metrics thread reads the loss.
        scalar = tr.alloc(THREAD_METRICS, 4, SYNC)
        tr.free(THREAD_METRICS, scalar, SYNC)
        tr.free(THREAD_MAIN, loss, COMPUTE)
        # Optimizer: Adam state on the first step, foreach temporaries.
        if not adam:
            adam = [tr.alloc(THREAD_MAIN, p[1], SYNC) for p in params for _ in range(2)]
        for chunk in range(0, len(params), 8):
            tr.tick(random.randint(300, 1200))
            tmp = [tr.alloc(THREAD_MAIN, p[1], COMPUTE) for p in params[chunk:chunk + 8]]
            for t in tmp:
                tr.free(THREAD_MAIN, t, COMPUTE)

    tr.fail(THREAD_MAIN, 1 << 40, COMPUTE)  # an evaluation batch that never fit
    if out is not sys.stdout:
        out.close()


if __name__ == '__main__':
    main()
