/* SPDX-License-Identifier: MIT */
/*
 * config/options.c - owns every EMM_* environment variable: the grammar
 * the values of the one option table (options_table.h) are parsed with, the
 * cross-option checks, and the printers (settings lines, the README's
 * Markdown table).
 *
 * Entry points: emm_options_get() parses `environ` once (pthread_once) into
 * static storage; emm_options_parse() does the same work on any envp, which
 * is what the tests use. Nothing here allocates: an LD_PRELOADed library may
 * be asked for its settings from inside the program's first malloc.
 */
#include "config/ascii.h"
#include "config/text.h"
#include "config/options.h"
#include "config/options_table.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/auxv.h>

#include "common/compiler.h"
#include "common/log.h"

extern char **environ;

/* ------------------------------------------------------------------------
 * Formatting values (settings lines, warnings, the Markdown table)
 * ------------------------------------------------------------------------ */

static const void *field_of(const struct emm_options *o, const struct opt_row *r)
{
	return (const char *)o + r->offset;
}

static unsigned enum_value(const void *field)
{
	unsigned v;

	memcpy(&v, field, sizeof(v));
	return v;
}

/* s into buf, cut to fit (n > 0): snprintf("%s") of a 256-byte path into a
 * 64-byte buffer is the truncation GCC warns of at -O3. */
static void put_str(char *buf, size_t n, const char *s)
{
	size_t len = strlen(s);

	if (len >= n)
		len = n - 1;
	memcpy(buf, s, len);
	buf[len] = 0;
}

static void format_value(const struct opt_row *r, const struct emm_options *o, char *buf, size_t n)
{
	const void *f = field_of(o, r);

	switch (r->type) {
	case OPT_BOOL:
		snprintf(buf, n, "%s", *(const bool *)f ? "on" : "off");
		break;
	case OPT_UINT:
		snprintf(buf, n, "%u", *(const unsigned *)f);
		break;
	case OPT_SIZE:
		emm_options_format_size(*(const size_t *)f, buf, n);
		break;
	case OPT_ENUM: {
		unsigned v = enum_value(f);
		put_str(buf, n, v < r->n_names ? r->names[v] : "?");
		break;
	}
	case OPT_STRING:
		put_str(buf, n, *(const char *)f ? (const char *)f : "\"\"");
		break;
	case OPT_OUTPUT:
		put_str(buf, n, o->stats_file[0] ? o->stats_file : !o->stats ? "off" : o->stats_json ? "json" : "on");
		break;
	case OPT_SIGNAL:
		emm_format_signal(*(const unsigned *)f, buf, n);
		break;
	}
}

/* What a valid value looks like, for the warning. */
static void format_expected(const struct opt_row *r, char *buf, size_t n)
{
	switch (r->type) {
	case OPT_BOOL:
		snprintf(buf, n, "1/true/yes/on or 0/false/no/off");
		break;
	case OPT_UINT:
		if (r->flags & F_POW2)
			snprintf(buf, n, "0 or a power of two up to %u", r->max);
		else
			snprintf(buf, n, "an integer from %u to %u", r->min, r->max);
		break;
	case OPT_SIZE:
		snprintf(buf, n, "%s with an optional K/M/G/T suffix (e.g. 512K, 2M, 1GiB)%s",
			 (r->flags & F_ALIGN512)  ? "a non-zero multiple of 512 bytes"
			 : (r->flags & F_NONZERO) ? "a non-zero size in bytes"
						  : "a size in bytes",
			 (r->flags & F_UNLIMITED) ? ", or unlimited" : "");
		break;
	case OPT_ENUM: {
		size_t len = (size_t)snprintf(buf, n, "one of");
		for (unsigned i = 0; i < r->n_names && len < n; i++)
			len += (size_t)snprintf(buf + len, n - len, "%s %s", i ? "," : "", r->names[i]);
		break;
	}
	case OPT_STRING:
		snprintf(buf, n, "a %sstring of at most %zu bytes", (r->flags & F_NONEMPTY) ? "non-empty " : "",
			 r->field_size - 1);
		break;
	case OPT_OUTPUT:
		snprintf(buf, n, "1/true/yes/on, 0/false/no/off, table, json, or a path with a '/' or ending in .json");
		break;
	case OPT_SIGNAL:
		snprintf(buf, n, "a signal name (SIGUSR2, USR2, SIGRTMIN+1) or number, or off");
		break;
	}
}

/* The Markdown table's Type column. */
static void format_type(const struct opt_row *r, char *buf, size_t n)
{
	char unit[32] = "";
	char names[64];

	if (r->unit[0])
		snprintf(unit, sizeof(unit), " (%s)", r->unit);
	switch (r->type) {
	case OPT_BOOL:
		snprintf(buf, n, "bool");
		break;
	case OPT_UINT:
		if (r->flags & F_POW2)
			snprintf(buf, n, "0 or power of 2 up to %u%s", r->max, unit);
		else
			snprintf(buf, n, "integer %u..%u%s", r->min, r->max, unit);
		break;
	case OPT_SIZE:
		snprintf(buf, n, "size%s%s", unit, (r->flags & F_UNLIMITED) ? " or `unlimited`" : "");
		break;
	case OPT_ENUM:
		format_expected(r, names, sizeof(names));
		snprintf(buf, n, "%s", names);
		break;
	case OPT_STRING:
		snprintf(buf, n, "string%s", unit);
		break;
	case OPT_OUTPUT:
		snprintf(buf, n, "bool, `json` or a path");
		break;
	case OPT_SIGNAL:
		snprintf(buf, n, "signal name or number");
		break;
	}
}

/* ------------------------------------------------------------------------
 * Parsing an environment
 * ------------------------------------------------------------------------ */

static void set_defaults(struct emm_options *o)
{
	memset(o, 0, sizeof(*o));
	for (size_t i = 0; i < EMM_ARRAY_SIZE(rows); i++) {
		const struct opt_row *r = &rows[i];
		void *f = (char *)o + r->offset;

		switch (r->type) {
		case OPT_BOOL:
		case OPT_OUTPUT:
			*(bool *)f = r->def.b;
			break;
		case OPT_UINT:
		case OPT_SIGNAL:
			*(unsigned *)f = r->def.u;
			break;
		case OPT_ENUM:
			memcpy(f, &r->def.u, sizeof(unsigned));
			break;
		case OPT_SIZE:
			*(size_t *)f = r->def.z;
			break;
		case OPT_STRING:
			snprintf(f, r->field_size, "%s", r->def.s);
			break;
		}
	}
}

static void reset_to_default(const struct opt_row *r, struct emm_options *o, const struct emm_options *defaults)
{
	memcpy((char *)o + r->offset, field_of(defaults, r), r->field_size);
}

/* Parse `value` per row r into o's field. 0, or -EINVAL (field untouched). */
static int parse_value(const struct opt_row *r, const char *value, struct emm_options *o)
{
	void *f = (char *)o + r->offset;

	switch (r->type) {
	case OPT_BOOL:
		return emm_parse_bool(value, f);
	case OPT_UINT: {
		unsigned u;
		if (emm_parse_uint(value, r->min, r->max, &u) < 0)
			return -EINVAL;
		if ((r->flags & F_POW2) && (u & (u - 1)) != 0)
			return -EINVAL;
		*(unsigned *)f = u;
		return 0;
	}
	case OPT_SIZE: {
		size_t z;
		if (emm_parse_size(value, r->flags & F_UNLIMITED, &z) < 0)
			return -EINVAL;
		if ((r->flags & F_NONZERO) && z == 0)
			return -EINVAL;
		if ((r->flags & F_ALIGN512) && (z == 0 || z % 512 != 0))
			return -EINVAL;
		*(size_t *)f = z;
		return 0;
	}
	case OPT_ENUM:
		for (unsigned i = 0; i < r->n_names; i++) {
			if (ascii_eq_nocase(value, r->names[i])) {
				memcpy(f, &i, sizeof(i));
				return 0;
			}
		}
		return -EINVAL;
	case OPT_OUTPUT:
		return emm_parse_stats(value, &o->stats, &o->stats_json, o->stats_file, sizeof(o->stats_file));
	case OPT_SIGNAL:
		return emm_parse_signal(value, f);
	case OPT_STRING: {
		size_t len = strnlen(value, r->field_size);
		if (len >= r->field_size || (len == 0 && (r->flags & F_NONEMPTY)))
			return -EINVAL;
		memcpy(f, value, len + 1);
		return 0;
	}
	}
	return -EINVAL;
}

/* The row for an exact name (without EMM_), or NULL. */
static const struct opt_row *find_row(const char *name, size_t len)
{
	for (size_t i = 0; i < EMM_ARRAY_SIZE(rows); i++)
		if (strncmp(rows[i].name, name, len) == 0 && rows[i].name[len] == '\0')
			return &rows[i];
	return NULL;
}

static bool is_reserved(const char *var)
{
	for (size_t i = 0; i < EMM_ARRAY_SIZE(reserved_prefixes); i++)
		if (strncmp(var, reserved_prefixes[i], strlen(reserved_prefixes[i])) == 0)
			return true;
	return false;
}

/* The option a misspelt name (without EMM_) most likely meant, or NULL when
 * none is close: at most 1 edit per 4 characters, 1 at least, 3 at most. */
static const struct opt_row *nearest_row(const char *name, size_t len)
{
	const struct opt_row *best = NULL;
	size_t best_d = SIZE_MAX;
	size_t limit = 1 + len / 4;

	if (len > EMM_CFG_NAME_MAX)
		return NULL;
	if (limit > 3)
		limit = 3;
	for (size_t i = 0; i < EMM_ARRAY_SIZE(rows); i++) {
		size_t d = emm_cfg_edit_distance(name, len, rows[i].name);
		if (d < best_d) {
			best_d = d;
			best = &rows[i];
		}
	}
	return best_d <= limit ? best : NULL;
}

static void warn_unknown(const char *var, size_t name_len)
{
	const char *name = var + 4; /* after EMM_ */
	const struct opt_row *near = nearest_row(name, name_len - 4);
	int shown = name_len > 64 ? 64 : (int)name_len;

	if (near)
		emm_warn("unknown variable %.*s%s; did you mean EMM_%s?", shown, var,
			 (size_t)shown < name_len ? "..." : "", near->name);
	else
		emm_warn("unknown variable %.*s%s", shown, var, (size_t)shown < name_len ? "..." : "");
}

static void warn_invalid(const struct opt_row *r, const char *value, const struct emm_options *defaults)
{
	char echo[80], expected[160], def[64];

	emm_cfg_echo(value, echo, sizeof(echo));
	format_expected(r, expected, sizeof(expected));
	format_value(r, defaults, def, sizeof(def));
	emm_warn("EMM_%s='%s' is not valid: expected %s; using default %s", r->name, echo, expected, def);
}

static size_t size_field(const struct emm_options *o, enum emm_option_id id)
{
	return *(const size_t *)field_of(o, &rows[id]);
}

/* Apply the relations until all hold; each failure is one warning. */
static void check_relations(struct emm_options *o, enum emm_option_source *src,
			    const struct emm_options *defaults)
{
	bool changed = true;

	while (changed) {
		changed = false;
		for (size_t i = 0; i < EMM_ARRAY_SIZE(relations); i++) {
			const struct opt_row *lo = &rows[relations[i].lo], *hi = &rows[relations[i].hi];
			size_t a = size_field(o, lo->id), b = size_field(o, hi->id);
			char va[32], vb[32], reset[160];
			size_t len = 0;

			if (relations[i].strict ? a < b : a <= b)
				continue;
			format_value(lo, o, va, sizeof(va));
			format_value(hi, o, vb, sizeof(vb));
			for (const struct opt_row *r = lo; r; r = (r == lo ? hi : NULL)) {
				char def[32];
				if (src[r->id] != EMM_OPTION_ENV)
					continue;
				reset_to_default(r, o, defaults);
				src[r->id] = EMM_OPTION_INVALID;
				format_value(r, o, def, sizeof(def));
				len += (size_t)snprintf(reset + len, sizeof(reset) - len, "%sEMM_%s=%s",
							len ? " and " : "", r->name, def);
			}
			if (len == 0)
				continue; /* both are defaults: a table bug the tests catch */
			emm_warn("EMM_%s=%s must be %s EMM_%s=%s; using default %s", lo->name, va,
				 relations[i].strict ? "smaller than" : "at most", hi->name, vb, reset);
			changed = true;
		}
	}
}

void emm_options_parse_secure(char *const *envp, struct emm_options *out, enum emm_option_source *sources,
			      bool secure)
{
	struct emm_options defaults;
	enum emm_option_source src[EMM_OPT__COUNT];

	set_defaults(&defaults);
	*out = defaults;
	for (size_t i = 0; i < EMM_OPT__COUNT; i++)
		src[i] = EMM_OPTION_DEFAULT;

	for (char *const *e = envp; e && *e; e++) {
		const char *var = *e;
		const char *eq = strchr(var, '=');
		const struct opt_row *r;
		size_t name_len;

		if (strncmp(var, "EMM_", 4) != 0 || !eq)
			continue;
		name_len = (size_t)(eq - var);
		r = find_row(var + 4, name_len - 4);
		if (!r) {
			if (!is_reserved(var))
				warn_unknown(var, name_len);
			continue;
		}
		/* The first occurrence wins, as with getenv. */
		if (src[r->id] != EMM_OPTION_DEFAULT)
			continue;
		if (secure && (r->flags & F_SECURE)) {
			char def[64];
			format_value(r, &defaults, def, sizeof(def));
			emm_warn("EMM_%s is ignored in a setuid/setgid program; using default %s", r->name, def);
			src[r->id] = EMM_OPTION_INVALID;
			continue;
		}
		if (parse_value(r, eq + 1, out) < 0) {
			warn_invalid(r, eq + 1, &defaults);
			src[r->id] = EMM_OPTION_INVALID;
			continue;
		}
		src[r->id] = EMM_OPTION_ENV;
		if (secure && r->type == OPT_OUTPUT && out->stats_file[0]) {
			emm_warn("EMM_%s: a file is ignored in a setuid/setgid program; JSON goes to stderr",
				 r->name);
			out->stats_file[0] = '\0';
		}
	}

	check_relations(out, src, &defaults);
	if (sources)
		memcpy(sources, src, sizeof(src));
}

void emm_options_parse(char *const *envp, struct emm_options *out, enum emm_option_source *sources)
{
	emm_options_parse_secure(envp, out, sources, getauxval(AT_SECURE) != 0);
}

/* ------------------------------------------------------------------------
 * The process's settings
 * ------------------------------------------------------------------------ */

static struct emm_options process_options;
static enum emm_option_source process_sources[EMM_OPT__COUNT];
static pthread_once_t process_once = PTHREAD_ONCE_INIT;

static void process_init(void)
{
	emm_options_parse(environ, &process_options, process_sources);
	if (process_options.verbose >= 2)
		emm_log_set_debug(true);
}

const struct emm_options *emm_options_get(void)
{
	pthread_once(&process_once, process_init);
	return &process_options;
}

const enum emm_option_source *emm_options_sources(void)
{
	pthread_once(&process_once, process_init);
	return process_sources;
}

/* ------------------------------------------------------------------------
 * Printing
 * ------------------------------------------------------------------------ */

void emm_options_print(const struct emm_options *opts, const enum emm_option_source *sources)
{
	for (size_t i = 0; i < EMM_ARRAY_SIZE(rows); i++) {
		char name[40], value[300];
		const char *src = "default";

		if (sources && sources[i] == EMM_OPTION_ENV)
			src = "env";
		else if (sources && sources[i] == EMM_OPTION_INVALID)
			src = "invalid, using default";
		snprintf(name, sizeof(name), "EMM_%s", rows[i].name);
		format_value(&rows[i], opts, value, sizeof(value));
		emm_info("%-22s = %s (%s)", name, value, src);
	}
}

void emm_options_write_markdown(FILE *out)
{
	struct emm_options defaults;

	set_defaults(&defaults);
	fprintf(out, "| Variable | Type | Default | Description |\n");
	fprintf(out, "|---|---|---|---|\n");
	for (size_t i = 0; i < EMM_ARRAY_SIZE(rows); i++) {
		char type[96], def[64];

		format_type(&rows[i], type, sizeof(type));
		format_value(&rows[i], &defaults, def, sizeof(def));
		fprintf(out, "| `EMM_%s` | %s | `%s` | %s |\n", rows[i].name, type, def, rows[i].desc);
	}
}

const char *emm_option_name(enum emm_option_id id)
{
	return (size_t)id < EMM_ARRAY_SIZE(rows) ? rows[id].name : NULL;
}

void emm_option_format(enum emm_option_id id, const struct emm_options *opts, char *buf, size_t n)
{
	if ((size_t)id < EMM_ARRAY_SIZE(rows))
		format_value(&rows[id], opts, buf, n);
	else if (n)
		buf[0] = '\0';
}
