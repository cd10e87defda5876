/* SPDX-License-Identifier: MIT */
/*
 * tests/backends/test-loader.c - finding, negotiating with and checking
 * backends. Every refusal must give its errno and exactly one
 * "emm: error:" line naming the file.
 *
 *   test-loader BUILD_DIR_OF_FAKE_BACKENDS PATH_TO_libemm-backend-hostsim.so
 */
#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>
#include <unistd.h>

#include "allocator/backend_loader.h"
#include "common/log.h"
#include "emm_test.h"

static const char *fake_dir;
static const char *hostsim_so;

/* --- capturing libemm's log lines --- */

static FILE *capture_file;
static char captured[8192];

static void capture_begin(void)
{
	if (!capture_file)
		capture_file = tmpfile();
	fflush(capture_file);
	if (ftruncate(fileno(capture_file), 0) != 0 || lseek(fileno(capture_file), 0, SEEK_SET) != 0)
		abort();
	emm_log_set_fd(fileno(capture_file));
}

/* Stops capturing; returns the number of "emm: error:" lines. */
static int capture_end(void)
{
	ssize_t n;
	int errors = 0;

	emm_log_set_fd(-1);
	n = pread(fileno(capture_file), captured, sizeof(captured) - 1, 0);
	captured[n > 0 ? n : 0] = '\0';
	for (const char *line = captured; *line;) {
		const char *nl = strchr(line, '\n');

		if (strncmp(line, "emm: error: ", 12) == 0)
			errors++;
		if (!nl)
			break;
		line = nl + 1;
	}
	if (captured[0])
		fprintf(stderr, "  log: %s", captured);
	return errors;
}

static void fake_path(char *buf, size_t size, const char *mode)
{
	snprintf(buf, size, "%s/libfake-backend-%s.so", fake_dir, mode);
}

/* Loading `name` fails with `err`, one error line containing `needle`, and
 * *ret stays untouched. */
static void expect_refused(const char *name, int err, const char *needle)
{
	struct emm_backend_loaded loaded, sentinel;

	memset(&loaded, 0xa5, sizeof(loaded));
	sentinel = loaded;
	capture_begin();
	expect_int_eq(emm_backend_load(name, dlsym, &loaded), err);
	expect_int_eq(capture_end(), 1);
	if (!strstr(captured, needle)) {
		emm_test_fail_("log for %s lacks \"%s\"", name, needle);
	}
	expect_true(memcmp(&loaded, &sentinel, sizeof(loaded)) == 0);
}

TEST_BEGIN(test_builtin_by_name)
{
	struct emm_backend_loaded loaded;

	capture_begin();
	expect_int_eq(emm_backend_load("hostsim", dlsym, &loaded), 0);
	expect_int_eq(capture_end(), 0);
	assert_ptr_not_null(loaded.table);
	expect_str_eq(loaded.table->name, "hostsim");
	expect_str_eq(loaded.path, "built-in");
	expect_ptr_null(loaded.dl_handle);
	expect_int_eq(loaded.version, EMM_BACKEND_INTERFACE_VERSION);
	expect_true(loaded.table->caps & EMM_BACKEND_CAP_SIMULATED);

	expect_int_eq(emm_backend_load("driver", dlsym, &loaded), 0);
	expect_str_eq(loaded.table->name, "driver");
	expect_str_eq(loaded.path, "built-in");
	expect_true(loaded.table->caps & EMM_BACKEND_CAP_DEVICE);
}
TEST_END

/* libemm-backend-NAME.so beside the code of the loader (here: beside this
 * test program) wins over the built-in list. */
TEST_BEGIN(test_builtin_beside_library)
{
	struct emm_backend_loaded loaded;
	char want[600];

	expect_int_eq(emm_backend_load("besideme", dlsym, &loaded), 0);
	assert_ptr_not_null(loaded.table);
	expect_str_eq(loaded.table->name, "fake");
	expect_ptr_not_null(loaded.dl_handle);
	snprintf(want, sizeof(want), "%s/libemm-backend-besideme.so", fake_dir);
	{
		char real_want[4096], real_got[4096];

		expect_ptr_not_null(realpath(want, real_want));
		expect_ptr_not_null(realpath(loaded.path, real_got));
		expect_str_eq(real_got, real_want);
	}
	emm_backend_unload(&loaded);
	expect_ptr_null(loaded.table);
}
TEST_END

TEST_BEGIN(test_by_path)
{
	struct emm_backend_loaded loaded;
	const struct emm_backend_host host = {
	    .interface_version = 1, .struct_size = sizeof(host), .options = "capacity=64M"};
	void *state = NULL;
	uint64_t addr = 0;
	size_t free_bytes = 0, total = 0;

	capture_begin();
	expect_int_eq(emm_backend_load(hostsim_so, dlsym, &loaded), 0);
	expect_int_eq(capture_end(), 0);
	assert_ptr_not_null(loaded.table);
	expect_ptr_not_null(loaded.dl_handle);
	expect_str_eq(loaded.path, hostsim_so);
	expect_str_eq(loaded.table->name, "hostsim");
	/* The stand-alone copy is a separate object from the compiled-in one. */
	{
		struct emm_backend_loaded builtin;

		expect_int_eq(emm_backend_load("hostsim", dlsym, &builtin), 0);
		expect_true(builtin.table != loaded.table);
	}
	assert_int_eq(loaded.table->init(&host, 0, 0x1234, &state), 0);
	expect_int_eq(loaded.table->segment_alloc(state, 2 << 20, 0, &addr), 0);
	expect_int_eq(loaded.table->mem_info(state, &free_bytes, &total), 0);
	expect_u64_eq(total, 64 << 20);
	expect_u64_eq(free_bytes, 62 << 20);
	expect_int_eq(loaded.table->segment_free(state, addr, 2 << 20, 0), 0);
	loaded.table->fini(state, true);
	emm_backend_unload(&loaded);
}
TEST_END

TEST_BEGIN(test_refusals)
{
	char path[600];

	fake_path(path, sizeof(path), "notsup");
	expect_refused(path, -ENOTSUP, path);
	expect_true(strstr(captured, "supports no interface version") != NULL);

	fake_path(path, sizeof(path), "tooold");
	expect_refused(path, -ENOTSUP, "version 0");
	expect_true(strstr(captured, path) != NULL);

	fake_path(path, sizeof(path), "toonew");
	expect_refused(path, -ENOTSUP, "more than was offered");

	fake_path(path, sizeof(path), "nomethod");
	expect_refused(path, -EINVAL, "segment_free");
	expect_true(strstr(captured, path) != NULL);

	fake_path(path, sizeof(path), "small");
	expect_refused(path, -EINVAL, "16 bytes");

	fake_path(path, sizeof(path), "failing");
	expect_refused(path, -EINVAL, "failed");

	fake_path(path, sizeof(path), "noentry");
	expect_refused(path, -ENOENT, "emm_backend_get");
	expect_true(strstr(captured, path) != NULL);

	/* dlopen's own words come through. */
	expect_refused("/nonexistent/libemm-backend-nothing.so", -ENOENT, "No such file");
	expect_true(strstr(captured, "/nonexistent/libemm-backend-nothing.so") != NULL);

	/* Not a shared object at all. */
	expect_refused("/etc/passwd", -ENOENT, "/etc/passwd");
}
TEST_END

TEST_BEGIN(test_bad_names)
{
	struct emm_backend_loaded loaded;

	expect_refused("nosuchbackend", -ENOENT, "nosuchbackend");
	expect_true(strstr(captured, "driver, hostsim, vmm") != NULL);
	expect_refused("..", -ENOENT, "..");
	expect_refused("sp ace", -ENOENT, "sp ace");

	capture_begin();
	expect_int_eq(emm_backend_load("", dlsym, &loaded), -EINVAL);
	expect_int_eq(emm_backend_load(NULL, dlsym, &loaded), -EINVAL);
	expect_int_eq(emm_backend_load("hostsim", NULL, &loaded), -EINVAL);
	expect_int_eq(capture_end(), 3);
}
TEST_END

/* Version 2: older and newer backends negotiate, a garbage answer and a
 * cap without its methods are refused, each with one clear line. */
TEST_BEGIN(test_version2)
{
	struct emm_backend_loaded loaded;
	char path[600];

	/* Offered 2, speaks only 1: accepted as 1; its (wrong) CAP_REMAP bit is
	 * not a version-1 cap, so libemm never asks for the new methods. */
	fake_path(path, sizeof(path), "v1");
	capture_begin();
	expect_int_eq(emm_backend_load(path, dlsym, &loaded), 0);
	expect_int_eq(capture_end(), 0);
	expect_int_eq(loaded.version, 1);
	expect_true(loaded.table->caps & EMM_BACKEND_CAP_REMAP);
	expect_false(emm_backend_has_cap(&loaded, EMM_BACKEND_CAP_REMAP));
	expect_true(emm_backend_has_cap(&loaded, EMM_BACKEND_CAP_DEVICE));
	emm_backend_unload(&loaded);

	/* Built for a future version 3: answers 2, its larger table is fine. */
	fake_path(path, sizeof(path), "v3");
	capture_begin();
	expect_int_eq(emm_backend_load(path, dlsym, &loaded), 0);
	expect_int_eq(capture_end(), 0);
	expect_int_eq(loaded.version, 2);
	expect_true(emm_backend_has_cap(&loaded, EMM_BACKEND_CAP_REMAP | EMM_BACKEND_CAP_GROW));
	emm_backend_unload(&loaded);

	fake_path(path, sizeof(path), "v2good");
	expect_int_eq(emm_backend_load(path, dlsym, &loaded), 0);
	expect_int_eq(loaded.version, 2);
	expect_true(emm_backend_has_cap(&loaded, EMM_BACKEND_CAP_GROW));
	expect_false(emm_backend_has_cap(&loaded, EMM_BACKEND_CAP_HOST_PINNED));
	expect_false(emm_backend_has_cap(&loaded, 0));
	expect_false(emm_backend_has_cap(NULL, EMM_BACKEND_CAP_DEVICE));
	emm_backend_unload(&loaded);

	fake_path(path, sizeof(path), "garbage");
	expect_refused(path, -ENOTSUP, "version 3735928559");
	expect_true(strstr(captured, "more than was offered") != NULL);

	fake_path(path, sizeof(path), "v2nogran");
	expect_refused(path, -EINVAL, "advertises CAP_GROW but its table lacks the method granularity");
	fake_path(path, sizeof(path), "v2nounmap");
	expect_refused(path, -EINVAL, "advertises CAP_REMAP but its table lacks the method segment_unmap");
	fake_path(path, sizeof(path), "v2nomap");
	expect_refused(path, -EINVAL, "advertises CAP_REMAP but its table lacks the method segment_map");
	fake_path(path, sizeof(path), "v2nogrow");
	expect_refused(path, -EINVAL, "advertises CAP_GROW but its table lacks the method segment_grow");
	expect_true(strstr(captured, path) != NULL);
	{
		char needle[100];

		snprintf(needle, sizeof(needle), "interface version 2 needs %zu",
		         offsetof(struct emm_backend, segment_grow) + sizeof(void *));
		fake_path(path, sizeof(path), "v2small");
		expect_refused(path, -EINVAL, needle);
	}

	/* The built-ins: driver and hostsim speak 2 without the new caps;
	 * vmm has both. */
	expect_int_eq(emm_backend_load("driver", dlsym, &loaded), 0);
	expect_int_eq(loaded.version, 2);
	expect_false(emm_backend_has_cap(&loaded, EMM_BACKEND_CAP_REMAP));
	expect_int_eq(emm_backend_load("vmm", dlsym, &loaded), 0);
	expect_str_eq(loaded.table->name, "vmm");
	expect_true(emm_backend_has_cap(&loaded, EMM_BACKEND_CAP_REMAP | EMM_BACKEND_CAP_GROW));
}
TEST_END

static unsigned lookups;

static void *counting_lookup(void *handle, const char *name)
{
	lookups++;
	return dlsym(handle, name);
}

/* The loader finds the entry symbol with the lookup it is handed (libemm
 * hands it the real dlsym), never with a dlsym of its own choosing. */
TEST_BEGIN(test_lookup_argument)
{
	struct emm_backend_loaded loaded;

	lookups = 0;
	expect_int_eq(emm_backend_load(hostsim_so, counting_lookup, &loaded), 0);
	expect_int_eq(lookups, 1);
	emm_backend_unload(&loaded);
	/* A compiled-in backend needs no lookup at all. */
	lookups = 0;
	expect_int_eq(emm_backend_load("hostsim", counting_lookup, &loaded), 0);
	expect_int_eq(lookups, 0);
}
TEST_END

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: %s FAKE_BACKEND_DIR HOSTSIM_SO\n", argv[0]);
		return 2;
	}
	fake_dir = argv[1];
	hostsim_so = argv[2];
	return emm_test_run(test_builtin_by_name, test_builtin_beside_library, test_by_path, test_refusals,
	                    test_version2, test_bad_names, test_lookup_argument, NULL);
}
