/* SPDX-License-Identifier: MIT */
/*
 * process/ipc.c - legacy CUDA IPC of any block (cuIpcGetMemHandle,
 * cuIpcOpenMemHandle, cuIpcCloseMemHandle) for the shims of
 * interpose/shims_query.c, which make the driver calls themselves: the
 * tables (struct st_ipc_tables, ipc_internal.h) and what touches both
 * sides of them, a context's teardown and a fork child's reset.
 *
 * The exporter (ipc_export.c) gives a block inside a segment a libemm
 * handle and keeps the segment allocated while another process has it
 * open (the lifetime rule is written there); the importer (ipc_import.c)
 * opens libemm handles; both go through the per-user registry
 * (ipc_registry.c).
 *
 * Locking: ipc_tables.lock (a leaf) over the tables and every registry
 * access; driver calls are the shims' (or made here) with no lock held.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "process/ipc_internal.h"
#include "process/process.h"
#include "process/process_internal.h"

struct st_ipc_tables ipc_tables = {.lock = PTHREAD_MUTEX_INITIALIZER};

bool ipc_vec_grow(void **v, size_t n, size_t *cap, size_t elem)
{
	size_t c = *cap ? *cap * 2 : 16;
	void *p;

	if (n < *cap)
		return true;
	p = realloc(*v, c * elem);
	if (!p)
		return false;
	*v = p;
	*cap = c;
	return true;
}

const char *ipc_dir(void)
{
	return emm_state_options()->ipc_dir;
}

struct ipc_owner ipc_self_locked(void)
{
	struct ipc_owner o;

	ipc_self(&o);
	return o;
}

/* --- context teardown and fork ------------------------------------------- */

/* The registry entries of this process that name memory of the dropped
 * context: its exports' and its imports' segments. */
struct dropped {
	CUcontext ctx;
	struct ctx_entry *entry;
};

static bool of_dropped(void *arg, const struct ipc_entry *e)
{
	const struct dropped *d = arg;

	if (e->kind == IPC_SLOT_IMPORT) {
		/* open in the dropped context, and in no other */
		bool here = false, elsewhere = false;
		for (size_t i = 0; i < ipc_tables.imports.n; i++)
			if (memcmp(&ipc_tables.imports.v[i]->segment, &e->segment, sizeof(e->segment)) == 0)
				*(ipc_tables.imports.v[i]->ctx == d->ctx ? &here : &elsewhere) = true;
		return here && !elsewhere;
	}
	for (size_t i = 0; i < ipc_tables.kept.n; i++)
		if (ipc_tables.kept.v[i].entry == d->entry &&
		    memcmp(&ipc_tables.kept.v[i].segment, &e->segment, sizeof(e->segment)) == 0)
			return true;
	return false;
}

void st_ipc_context_dropped(CUcontext ctx, struct ctx_entry *entry)
{
	struct dropped d = {.ctx = ctx, .entry = entry};
	struct ipc_owner self;
	size_t j = 0;

	st_lock(&ipc_tables.lock);
	/* Its memory went with it: its exports name nothing now, its
	 * mappings of other processes' segments are gone. */
	if (ipc_tables.kept.n || ipc_tables.imports.n) {
		self = ipc_self_locked();
		ipc_registry_remove(ipc_dir(), &self, of_dropped, &d);
	}
	for (size_t i = 0; i < ipc_tables.exports.n; i++)
		if (ipc_tables.exports.v[i].ctx != d.ctx)
			ipc_tables.exports.v[j++] = ipc_tables.exports.v[i];
	ipc_tables.exports.n = j;
	j = 0;
	for (size_t i = 0; i < ipc_tables.kept.n; i++)
		if (ipc_tables.kept.v[i].entry != entry)
			ipc_tables.kept.v[j++] = ipc_tables.kept.v[i];
	ipc_tables.kept.n = j;
	atomic_store(&ipc_tables.kept_count, ipc_tables.kept.n);
	j = 0;
	for (size_t i = 0; i < ipc_tables.blocks.n; i++)
		if (ipc_tables.blocks.v[i].seg->ctx != d.ctx)
			ipc_tables.blocks.v[j++] = ipc_tables.blocks.v[i];
	ipc_tables.blocks.n = j;
	atomic_store(&ipc_tables.block_count, ipc_tables.blocks.n);
	for (size_t i = ipc_tables.imports.n; i-- > 0;)
		if (ipc_tables.imports.v[i]->ctx == d.ctx)
			ipc_import_seg_remove_locked(ipc_tables.imports.v[i]);
	st_unlock(&ipc_tables.lock);
}

void st_ipc_fork_child(void)
{
	/* The parent's exports and imports are its own; the tables are
	 * leaked (a thread of the parent may have held the lock). */
	pthread_mutex_init(&ipc_tables.lock, NULL);
	memset(&ipc_tables.exports, 0, sizeof(ipc_tables.exports));
	memset(&ipc_tables.kept, 0, sizeof(ipc_tables.kept));
	memset(&ipc_tables.imports, 0, sizeof(ipc_tables.imports));
	memset(&ipc_tables.blocks, 0, sizeof(ipc_tables.blocks));
	atomic_store(&ipc_tables.kept_count, 0);
	atomic_store(&ipc_tables.block_count, 0);
	ipc_tables.next_serial = 0;
	ipc_tables.opens_pending = 0;
	ipc_registry_fork_child();
}
