/* SPDX-License-Identifier: MIT */
/*
 * config/emm_options_main.c - the emm-options tool: prints libemm's options
 * as the README's Markdown table (--markdown), or the settings the current
 * environment resolves to (no argument), one "emm: EMM_NAME = value (source)"
 * line each, on stdout. Warnings about the environment go to stderr, and
 * an invalid value (one libemm would replace by its default) makes the exit
 * status 1, so scripts and CI can check a setting before a long run.
 */
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "config/options.h"
#include "emm/emm_version.h"

static int usage(FILE *out, int status)
{
	fprintf(out,
		"usage: emm-options [--markdown | --version | --help]\n"
		"  (no argument)  print the EMM_* settings the current environment resolves to\n"
		"  --markdown     print the option table as Markdown (the README's Options section)\n"
		"  --version      print libemm's version\n"
		"Exit status: 0, 1 if an EMM_* variable has an invalid value (the default is used), 2 bad usage.\n");
	return status;
}

int main(int argc, char **argv)
{
	if (argc > 2)
		return usage(stderr, 2);
	if (argc == 2) {
		if (strcmp(argv[1], "--markdown") == 0) {
			emm_options_write_markdown(stdout);
			return fflush(stdout) == 0 ? 0 : 1;
		}
		if (strcmp(argv[1], "--version") == 0) {
			printf("%s\n", EMM_VERSION_STRING);
			return 0;
		}
		if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)
			return usage(stdout, 0);
		return usage(stderr, 2);
	}

	/* Parse first, so warnings about the environment stay on stderr; then
	 * the settings themselves go to stdout for scripts. */
	const struct emm_options *opts = emm_options_get();
	const enum emm_option_source *sources = emm_options_sources();
	int status = 0;

	fflush(stdout);
	emm_log_set_fd(1);
	emm_options_print(opts, sources);
	emm_log_set_fd(-1);
	for (int id = 0; id < EMM_OPT__COUNT; id++)
		if (sources[id] == EMM_OPTION_INVALID)
			status = 1;
	return status;
}
