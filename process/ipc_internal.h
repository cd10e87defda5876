/* SPDX-License-Identifier: MIT */
/*
 * process/ipc_internal.h - what the IPC files of the process layer share
 * and nobody else sees: the layout of a libemm IPC handle and of one entry
 * of the per-user registry (ipc_registry.c), the registry's calls that the
 * others make, and the one set of tables (struct st_ipc_tables, under its
 * lock) that the exporter (ipc_export.c), the importer (ipc_import.c) and
 * context teardown and fork (ipc.c) keep.
 *
 * A libemm handle names one exported block: its exporter (pid, start time,
 * pid namespace) and a serial the exporter gave the export. The registry,
 * a file of fixed-size slots shared by the user's processes, maps it to
 * what the importer needs: the driver's own handle of the segment, the
 * block's offset in it and the block's size. The driver's handle is never
 * in the libemm handle, so a process without libemm cannot open the
 * segment by mistake.
 */
#ifndef EMM_PROCESS_IPC_INTERNAL_H
#define EMM_PROCESS_IPC_INTERNAL_H

#include <cuda.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "allocator/heap.h"

#pragma GCC visibility push(hidden)

/* The first 16 bytes of every libemm handle. */
#define IPC_HANDLE_MAGIC "libemm-ipc-blk1"

/* Who exported: enough to tell a live exporter from a dead one whose pid
 * was reused (start time in clock ticks since boot, /proc/PID/stat field
 * 22) and to know when that cannot be judged (another pid namespace). */
struct ipc_owner {
	uint32_t pid;
	uint32_t reserved;
	uint64_t start_time;
	uint64_t pidns; /* inode of /proc/self/ns/pid; 0 unknown */
};

/* CUipcMemHandle's 64 bytes as libemm fills them. */
struct ipc_handle {
	char magic[16];
	struct ipc_owner owner;
	uint64_t serial;
	char reserved[CU_IPC_HANDLE_SIZE - 16 - sizeof(struct ipc_owner) - 8];
};
_Static_assert(sizeof(struct ipc_handle) == CU_IPC_HANDLE_SIZE, "a libemm handle is a CUipcMemHandle");

/* One registry entry (a slot of the file): an export (owner: the
 * exporter, serial: its handle's) or an import (owner: a process that has
 * the segment open through a libemm handle; serial, offset and size 0). */
enum { IPC_SLOT_FREE, IPC_SLOT_EXPORT, IPC_SLOT_IMPORT };
struct ipc_entry {
	uint32_t kind; /* IPC_SLOT_*; written last */
	uint32_t reserved;
	uint64_t serial;
	struct ipc_owner owner;
	uint64_t offset;   /* of the block in the segment */
	uint64_t size;     /* the block's size as the program asked for it */
	uint64_t seg_size; /* the segment's size */
	CUipcMemHandle segment; /* the driver's handle of the segment */
};

/* This process as an exporter (read once; again after fork). */
void ipc_self(struct ipc_owner *ret);

/* False when `owner` is known dead (no such process, or its pid now names
 * a younger process); true when alive or when it cannot be told. */
bool ipc_owner_alive(const struct ipc_owner *owner);

/*
 * The registry under `dir` (EMM_IPC_DIR), opened on first use. Each call
 * takes the file's lock (flock) for its duration; callers serialise their
 * threads themselves (ipc_tables.lock): flock does not exclude threads of one
 * process. A full registry reclaims one slot of a dead process.
 *   add:      store the export *e: 0, -ENOSPC (full), or the open's error.
 *   open:     the export (owner, serial): 0 and *ret, -ENOENT; with it an
 *             import record of (`importer`, its segment) is added unless
 *             there is one (-ENOSPC: none could be).
 *   unimport: drop the import record of (`importer`, segment).
 *   release:  the exporter `self` gives `segment` back: -EBUSY while a
 *             live process has it imported; else its export entries are
 *             dropped (their handles no longer open) and 0.
 *   remove:   drop the entries of `self` (exports and imports) whose
 *             segment `drop(arg, entry)` approves.
 * The open fails with -EPERM when the file is not the user's own regular
 * file of mode 0600 (or narrower), -EPROTO when its layout is not this
 * version's; the reason is warned once.
 */
int ipc_registry_add(const char *dir, const struct ipc_entry *e);
int ipc_registry_open(const char *dir, const struct ipc_owner *owner, uint64_t serial,
                      const struct ipc_owner *importer, struct ipc_entry *ret);
void ipc_registry_unimport(const char *dir, const struct ipc_owner *importer, const CUipcMemHandle *segment);
int ipc_registry_release(const char *dir, const struct ipc_owner *self, const CUipcMemHandle *segment);
void ipc_registry_remove(const char *dir, const struct ipc_owner *self,
                         bool (*drop)(void *arg, const struct ipc_entry *e), void *arg);
/* In a fork child: the parent's open file is shared with it (its flock
 * too): close it here, reopen on next use. */
void ipc_registry_fork_child(void);

/* --- the tables of ipc.c, ipc_export.c and ipc_import.c ----------------- */

struct ctx_entry;

/* A block exported with a libemm handle. */
struct ipc_export {
	CUcontext ctx;
	emm_addr_t seg_base;
	size_t offset, size;
	uint64_t serial;
};

/* A segment with blocks exported; `retired`: the heap gave it back while
 * an importer had it, so it is kept here. */
struct ipc_kept {
	struct ctx_entry *entry;
	emm_addr_t base;
	size_t size;
	CUipcMemHandle segment;
	bool retired;
};

/* A segment opened through libemm handles in this process. */
struct ipc_import_seg {
	CUcontext ctx;
	CUipcMemHandle segment;
	emm_addr_t base;
	size_t size;
	unsigned driver_refs; /* successful driver opens (two threads may race) */
	unsigned refs;        /* opened blocks' references */
};

/* An opened block: its pointer and references. */
struct ipc_import_blk {
	emm_addr_t ptr;
	size_t size;
	struct ipc_import_seg *seg;
	unsigned refs;
};

/* A growable array of T; IPC_VEC_RESERVE(a): room for one more (false:
 * out of memory). */
#define IPC_VEC(T)                                                                                           \
	struct {                                                                                             \
		T *v;                                                                                        \
		size_t n, cap;                                                                               \
	}
bool ipc_vec_grow(void **v, size_t n, size_t *cap, size_t elem);
#define IPC_VEC_RESERVE(a) ipc_vec_grow((void **)&(a).v, (a).n, &(a).cap, sizeof(*(a).v))

/* The one instance, ipc_tables: everything in it is written under `lock`
 * (a leaf; every registry access is under it too); the two counts are
 * also read without it, on hot paths. */
struct st_ipc_tables {
	pthread_mutex_t lock;
	IPC_VEC(struct ipc_export) exports;       /* ipc_export.c; ipc.c drops a context's */
	IPC_VEC(struct ipc_kept) kept;            /* ipc_export.c; ipc.c drops a context's */
	IPC_VEC(struct ipc_import_seg *) imports; /* opened segments; ipc_import.c */
	IPC_VEC(struct ipc_import_blk) blocks;    /* opened blocks; ipc_import.c */
	uint64_t next_serial;                     /* of the next export */
	unsigned opens_pending;                   /* imports between begin and done */
	atomic_size_t kept_count, block_count;    /* kept.n and blocks.n */
};
extern struct st_ipc_tables ipc_tables;

/* EMM_IPC_DIR; this process as an owner (ipc_tables.lock held). */
const char *ipc_dir(void);
struct ipc_owner ipc_self_locked(void);
/* Drop an opened segment with no references left (ipc_import.c);
 * ipc_tables.lock held. */
void ipc_import_seg_remove_locked(struct ipc_import_seg *seg);

#pragma GCC visibility pop

#endif
