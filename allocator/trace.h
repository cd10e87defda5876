/* SPDX-License-Identifier: MIT */
/*
 * allocator/trace.h - the EMM_LOG event trace: one CSV line per allocation
 * event in the columns of RMM's logging_resource_adaptor, so RMM's replay
 * benchmark and our own tools read it:
 *
 *     Thread,Time,Action,Pointer,Size,Stream,Memory
 *     4121,1763675732.104211,allocate,0x7f3a40000000,1024,0x0,device
 *
 * Thread is the OS thread id, Time seconds since the epoch with microseconds,
 * Action "allocate", "free" or "allocate failure" (Pointer 0x0), Pointer and
 * Stream in 0x hex, Size in bytes. Memory, a column after RMM's six (RMM's
 * parser ignores it), is "device", "pinned" (host) or "managed".
 *
 * Events are formatted on the caller's stack and appended to one fixed
 * buffer under a mutex; the buffer goes out with write(2) when it is full and
 * at emm_trace_flush/emm_trace_close. Nothing here allocates memory. The file
 * is opened with O_APPEND, so a forked child that keeps tracing (after
 * emm_trace_fork_child) adds whole buffers after the parent's instead of
 * writing over them. The process that writes a trace holds an exclusive
 * flock(2) on it: another process asked to trace into the same file is
 * refused (-EAGAIN) instead of truncating it.
 *
 * allocator/ does not read the environment: interpose/ passes EMM_LOG's path
 * to emm_trace_open and calls emm_trace_close at exit.
 */
#ifndef EMM_ALLOCATOR_TRACE_H
#define EMM_ALLOCATOR_TRACE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum emm_trace_action {
	EMM_TRACE_ALLOCATE,
	EMM_TRACE_FREE,
	EMM_TRACE_ALLOCATE_FAILURE,
};

enum emm_trace_memory {
	EMM_TRACE_DEVICE,
	EMM_TRACE_PINNED,
	EMM_TRACE_MANAGED,
};

/* Whether a trace file is open; read with one relaxed load. */
extern atomic_bool emm_trace_active;

static inline bool emm_trace_enabled(void)
{
	return atomic_load_explicit(&emm_trace_active, memory_order_relaxed);
}

/* Create or truncate `path`, write the header line and start tracing.
 * 0, -EBUSY if a trace is already open, -EAGAIN if another live process
 * traces into `path` (left untouched), or the negative errno of open(2). */
int emm_trace_open(const char *path);

/* Record one event (dropped when no trace is open): device memory, or the
 * memory named. */
void emm_trace_event(enum emm_trace_action action, uint64_t ptr, size_t size, uint64_t stream);
void emm_trace_event_memory(enum emm_trace_action action, uint64_t ptr, size_t size, uint64_t stream,
                            enum emm_trace_memory memory);

/* Write out the buffered events now. */
void emm_trace_flush(void);

/* Flush, close the file and stop tracing. Safe to call when none is open. */
void emm_trace_close(void);

/* In a fork child: re-create the lock and drop the parent's buffered events
 * (the parent writes them); tracing goes on into the same file. */
void emm_trace_fork_child(void);

#endif
