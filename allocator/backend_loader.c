/* SPDX-License-Identifier: MIT */
/*
 * allocator/backend_loader.c - finds a backend, negotiates its interface
 * version and checks its table (rules in backend_loader.h and
 * include/emm/emm_backend.h).
 *
 * Every failure is reported by exactly one "emm: error:" line that names the
 * file (or "built-in NAME") and the reason, including dlerror()'s text where
 * the dynamic loader refused. A built-in .so found beside libemm that cannot
 * be used is a warning instead, and the compiled-in copy serves.
 *
 * The caller hands in the symbol lookup to use (the real dlsym: libemm
 * exports a dlsym of its own, and the allocator never calls up into the
 * layer that owns it).
 */
#include "allocator/backend_loader.h"

#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/compiler.h"
#include "common/log.h"

#define REASON_MAX 768

struct builtin_backend {
	const char *name;
	emm_backend_get_fn entry;
};

static const struct builtin_backend builtin_backends[] = {
    {"driver", emm_backend_builtin_driver},
    {"hostsim", emm_backend_builtin_hostsim},
    {"vmm", emm_backend_builtin_vmm},
};

/*
 * The table size each version must have: version N's table ends with the
 * last method N defines. Index by version.
 */
static const size_t table_size_for_version[] = {
    [1] = offsetof(struct emm_backend, host_segment_free) + sizeof(void *),
    [2] = offsetof(struct emm_backend, segment_grow) + sizeof(void *),
};
_Static_assert(EMM_ARRAY_SIZE(table_size_for_version) == EMM_BACKEND_INTERFACE_VERSION + 1,
               "a table size for every interface version");

/*
 * Negotiate with an entry function and check the table. 0, or a negative
 * errno with `reason` filled in (the caller logs it).
 */
static int negotiate(emm_backend_get_fn entry, uint32_t *ret_version, const struct emm_backend **ret_table,
                     char *reason, size_t reason_size)
{
	uint32_t version = EMM_BACKEND_INTERFACE_VERSION;
	const struct emm_backend *table = NULL;
	const char *missing = NULL;
	int ret;

	ret = entry(&version, &table);
	if (ret == -ENOTSUP) {
		snprintf(reason, reason_size,
		         "it supports no interface version up to %u (libemm speaks %u..%u)",
		         EMM_BACKEND_INTERFACE_VERSION, EMM_BACKEND_INTERFACE_VERSION_MIN,
		         EMM_BACKEND_INTERFACE_VERSION);
		return -ENOTSUP;
	}
	if (ret != 0) {
		snprintf(reason, reason_size, "%s() failed: %s (%d)", EMM_BACKEND_ENTRY,
		         ret < 0 ? strerror(-ret) : "not a negative errno", ret);
		return -EINVAL;
	}
	if (version < EMM_BACKEND_INTERFACE_VERSION_MIN || version > EMM_BACKEND_INTERFACE_VERSION) {
		snprintf(reason, reason_size, "it answered interface version %u, libemm supports %u..%u%s",
		         version, EMM_BACKEND_INTERFACE_VERSION_MIN, EMM_BACKEND_INTERFACE_VERSION,
		         version < EMM_BACKEND_INTERFACE_VERSION_MIN ? " (backend too old)"
		                                                     : " (more than was offered)");
		return -ENOTSUP;
	}
	if (!table) {
		snprintf(reason, reason_size, "%s() returned no table", EMM_BACKEND_ENTRY);
		return -EINVAL;
	}
	if (table->struct_size < table_size_for_version[version]) {
		snprintf(reason, reason_size, "its table is %u bytes, interface version %u needs %zu",
		         table->struct_size, version, table_size_for_version[version]);
		return -EINVAL;
	}
	if (!table->init)
		missing = "init";
	else if (!table->fini)
		missing = "fini";
	else if (!table->segment_alloc)
		missing = "segment_alloc";
	else if (!table->segment_free)
		missing = "segment_free";
	else if (!table->mem_info)
		missing = "mem_info";
	if (missing) {
		snprintf(reason, reason_size, "its table lacks the required method %s", missing);
		return -EINVAL;
	}
	/* Version 2's capabilities need their methods. */
	if (version >= 2) {
		const bool remap = table->caps & EMM_BACKEND_CAP_REMAP, grow = table->caps & EMM_BACKEND_CAP_GROW;
		const char *cap = remap ? "CAP_REMAP" : "CAP_GROW";

		if ((remap || grow) && !table->granularity)
			missing = "granularity";
		else if (remap && !table->segment_unmap)
			missing = "segment_unmap";
		else if (remap && !table->segment_map)
			missing = "segment_map";
		else if (grow && !table->segment_grow)
			missing = "segment_grow", cap = "CAP_GROW";
		if (missing) {
			snprintf(reason, reason_size, "it advertises %s but its table lacks the method %s", cap,
			         missing);
			return -EINVAL;
		}
	}
	*ret_version = version;
	*ret_table = table;
	return 0;
}

/* dlopen + dlsym + negotiate; on success ret is filled and owns the handle. */
static int load_file(const char *path, emm_symbol_lookup_fn lookup, struct emm_backend_loaded *ret, char *reason,
                     size_t reason_size)
{
	const struct emm_backend *table;
	emm_backend_get_fn entry;
	uint32_t version;
	void *handle;
	int err;

	dlerror();
	handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!handle) {
		const char *why = dlerror();

		snprintf(reason, reason_size, "cannot load it: %s", why ? why : "unknown dlopen error");
		return -ENOENT;
	}
	dlerror();
	*(void **)&entry = lookup(handle, EMM_BACKEND_ENTRY);
	if (!entry) {
		const char *why = dlerror();

		snprintf(reason, reason_size, "it does not export %s (%s)", EMM_BACKEND_ENTRY,
		         why ? why : "symbol is NULL");
		dlclose(handle);
		return -ENOENT;
	}
	err = negotiate(entry, &version, &table, reason, reason_size);
	if (err < 0) {
		dlclose(handle);
		return err;
	}
	ret->table = table;
	ret->version = version;
	ret->dl_handle = handle;
	snprintf(ret->path, sizeof(ret->path), "%s", path);
	return 0;
}

/* The folder libemm's code lives in ("" when it cannot be told). */
static void own_directory(char *buf, size_t size)
{
	Dl_info info;
	const char *slash;
	size_t len;

	buf[0] = '\0';
	if (!dladdr((void *)(uintptr_t)emm_backend_load, &info) || !info.dli_fname)
		return;
	slash = strrchr(info.dli_fname, '/');
	if (!slash)
		return;
	len = (size_t)(slash - info.dli_fname);
	if (len == 0)
		len = 1; /* "/" itself */
	if (len >= size)
		return;
	memcpy(buf, info.dli_fname, len);
	buf[len] = '\0';
}

static bool valid_builtin_name(const char *name)
{
	size_t n = 0;

	for (const char *c = name; *c; c++, n++) {
		if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
		      *c == '_' || *c == '-' || *c == '.'))
			return false;
	}
	return n > 0 && n < 64 && strcmp(name, ".") != 0 && strcmp(name, "..") != 0;
}

static int load_builtin(const char *name, emm_symbol_lookup_fn lookup, struct emm_backend_loaded *ret)
{
	char dir[sizeof(ret->path)];
	char path[sizeof(ret->path) + 96];
	char reason[REASON_MAX];
	const struct builtin_backend *builtin = NULL;
	int err;

	if (!valid_builtin_name(name)) {
		emm_error(
		    "backend '%s': not a built-in name (use letters, digits, '-', '_', or a path with '/')",
		    name);
		return -ENOENT;
	}
	for (size_t i = 0; i < EMM_ARRAY_SIZE(builtin_backends); i++) {
		if (strcmp(builtin_backends[i].name, name) == 0)
			builtin = &builtin_backends[i];
	}

	/* 1. libemm-backend-NAME.so beside libemm.so. */
	own_directory(dir, sizeof(dir));
	if (dir[0]) {
		snprintf(path, sizeof(path), "%s%slibemm-backend-%s.so", dir, strcmp(dir, "/") ? "/" : "",
		         name);
		if (strlen(path) < sizeof(ret->path) && access(path, F_OK) == 0) {
			err = load_file(path, lookup, ret, reason, sizeof(reason));
			if (err == 0) {
				emm_debug("backend '%s': interface version %u from %s", name, ret->version,
				          path);
				return 0;
			}
			if (!builtin) {
				emm_error("backend %s: %s", path, reason);
				return err;
			}
			emm_warn("backend %s: %s; using the built-in copy", path, reason);
		}
	}

	/* 2. The copy compiled into libemm. */
	if (!builtin) {
		emm_error(
		    "backend '%s': no such built-in (known: driver, hostsim, vmm) and no %s%slibemm-backend-%s.so",
		    name, dir, dir[0] ? "/" : "", name);
		return -ENOENT;
	}
	err = negotiate(builtin->entry, &ret->version, &ret->table, reason, sizeof(reason));
	if (err < 0) {
		emm_error("backend built-in %s: %s", name, reason);
		return err;
	}
	ret->dl_handle = NULL;
	snprintf(ret->path, sizeof(ret->path), "built-in");
	emm_debug("backend '%s': interface version %u, built-in", name, ret->version);
	return 0;
}

int emm_backend_load(const char *name, emm_symbol_lookup_fn lookup, struct emm_backend_loaded *ret)
{
	struct emm_backend_loaded loaded;
	char reason[REASON_MAX];
	int err;

	if (!name || !*name || !ret) {
		emm_error("backend: no backend name given");
		return -EINVAL;
	}
	if (!lookup) {
		emm_error("backend: no symbol lookup given");
		return -EINVAL;
	}
	memset(&loaded, 0, sizeof(loaded));
	if (!strchr(name, '/')) {
		err = load_builtin(name, lookup, &loaded);
	} else if (strlen(name) >= sizeof(loaded.path)) {
		emm_error("backend %.64s...: path longer than %zu bytes", name, sizeof(loaded.path) - 1);
		err = -ENOENT;
	} else {
		err = load_file(name, lookup, &loaded, reason, sizeof(reason));
		if (err < 0)
			emm_error("backend %s: %s", name, reason);
		else
			emm_debug("backend %s: interface version %u", name, loaded.version);
	}
	if (err == 0)
		*ret = loaded;
	return err;
}

bool emm_backend_has_cap(const struct emm_backend_loaded *loaded, uint64_t cap)
{
	uint64_t known = EMM_BACKEND_CAP_DEVICE | EMM_BACKEND_CAP_HOST_PINNED | EMM_BACKEND_CAP_STREAM_ORDERED |
	                 EMM_BACKEND_CAP_SIMULATED | EMM_BACKEND_CAP_IPC;

	if (!loaded || !loaded->table)
		return false;
	if (loaded->version >= 2)
		known |= EMM_BACKEND_CAP_REMAP | EMM_BACKEND_CAP_GROW;
	return (loaded->table->caps & known & cap) == cap && cap != 0;
}

void emm_backend_unload(struct emm_backend_loaded *loaded)
{
	if (!loaded)
		return;
	if (loaded->dl_handle)
		dlclose(loaded->dl_handle);
	memset(loaded, 0, sizeof(*loaded));
}
