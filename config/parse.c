/* SPDX-License-Identifier: MIT */
/*
 * config/parse.c - the grammar of one EMM_* value (config/options.h):
 * booleans (1/true/yes/on, 0/false/no/off), sizes with K/M/G/T and KiB-style
 * suffixes or "unlimited", bounded unsigned integers, signals (names or
 * numbers) and EMM_STATS's output (on/off, table, json or a file).
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/compiler.h"
#include "config/ascii.h"
#include "config/options.h"

int emm_parse_bool(const char *s, bool *ret)
{
	static const char *const yes[] = {"1", "true", "yes", "on"};
	static const char *const no[] = {"0", "false", "no", "off"};

	if (!s)
		return -EINVAL;
	for (size_t i = 0; i < EMM_ARRAY_SIZE(yes); i++) {
		if (ascii_eq_nocase(s, yes[i])) {
			*ret = true;
			return 0;
		}
		if (ascii_eq_nocase(s, no[i])) {
			*ret = false;
			return 0;
		}
	}
	return -EINVAL;
}

/* Decimal digits only (no sign, no space, no base prefix), no overflow. */
static int parse_digits(const char **sp, uintmax_t max, uintmax_t *ret)
{
	const char *s = *sp;
	uintmax_t v = 0;

	if (!is_digit(*s))
		return -EINVAL;
	for (; is_digit(*s); s++) {
		unsigned d = (unsigned)(*s - '0');
		if (v > (max - d) / 10)
			return -EINVAL;
		v = v * 10 + d;
	}
	*sp = s;
	*ret = v;
	return 0;
}

int emm_parse_size(const char *s, bool allow_unlimited, size_t *ret)
{
	uintmax_t v;
	unsigned shift = 0;

	if (!s)
		return -EINVAL;
	if (allow_unlimited && (ascii_eq_nocase(s, "unlimited") || ascii_eq_nocase(s, "none"))) {
		*ret = SIZE_MAX;
		return 0;
	}
	if (parse_digits(&s, SIZE_MAX, &v) < 0)
		return -EINVAL;
	switch (ascii_lower(*s)) {
	case 'k':
		shift = 10;
		break;
	case 'm':
		shift = 20;
		break;
	case 'g':
		shift = 30;
		break;
	case 't':
		shift = 40;
		break;
	}
	if (shift)
		s++;
	if (shift && ascii_lower(s[0]) == 'i' && ascii_lower(s[1]) == 'b')
		s += 2; /* KiB, MiB, ... */
	else if (ascii_lower(*s) == 'b')
		s++; /* KB, MB, ... or plain bytes: 512B */
	if (*s)
		return -EINVAL;
	/* Saturating would silently turn a typo into "all memory": refuse. */
	if (v > (uintmax_t)(SIZE_MAX >> shift))
		return -EINVAL;
	*ret = (size_t)v << shift;
	return 0;
}

int emm_parse_uint(const char *s, unsigned min, unsigned max, unsigned *ret)
{
	uintmax_t v;

	if (!s || parse_digits(&s, UINT_MAX, &v) < 0 || *s)
		return -EINVAL;
	if (v < min || v > max)
		return -EINVAL;
	*ret = (unsigned)v;
	return 0;
}

/* Signals a user may name, without the SIG prefix. */
static const struct {
	const char *name;
	unsigned number;
} signal_names[] = {
    {"HUP", SIGHUP},   {"INT", SIGINT},   {"QUIT", SIGQUIT}, {"USR1", SIGUSR1}, {"USR2", SIGUSR2},
    {"PIPE", SIGPIPE}, {"ALRM", SIGALRM}, {"TERM", SIGTERM}, {"CONT", SIGCONT}, {"TSTP", SIGTSTP},
    {"TTIN", SIGTTIN}, {"TTOU", SIGTTOU}, {"URG", SIGURG},   {"XCPU", SIGXCPU}, {"XFSZ", SIGXFSZ},
    {"VTALRM", SIGVTALRM}, {"PROF", SIGPROF}, {"WINCH", SIGWINCH}, {"IO", SIGIO}, {"PWR", SIGPWR},
};

/* Signals a dump may not take: uncatchable, faults a handler must not
 * swallow, or the real-time signals below SIGRTMIN, which the C library
 * keeps for itself (sigaction refuses them). */
static bool signal_allowed(unsigned sig)
{
	return sig >= 1 && sig < (unsigned)NSIG && sig != SIGKILL && sig != SIGSTOP && sig != SIGSEGV &&
	       sig != SIGBUS && sig != SIGFPE && sig != SIGILL && sig != SIGABRT && sig != SIGTRAP &&
	       sig != SIGCHLD && (sig < 32 || sig >= (unsigned)SIGRTMIN);
}

int emm_parse_signal(const char *s, unsigned *ret)
{
	unsigned v;

	if (!s)
		return -EINVAL;
	if (ascii_eq_nocase(s, "off") || ascii_eq_nocase(s, "none") || ascii_eq_nocase(s, "0")) {
		*ret = 0;
		return 0;
	}
	if (emm_parse_uint(s, 1, (unsigned)NSIG - 1, &v) == 0) {
		if (!signal_allowed(v))
			return -EINVAL;
		*ret = v;
		return 0;
	}
	if (ascii_lower(s[0]) == 's' && ascii_lower(s[1]) == 'i' && ascii_lower(s[2]) == 'g')
		s += 3;
	for (size_t i = 0; i < EMM_ARRAY_SIZE(signal_names); i++) {
		if (ascii_eq_nocase(s, signal_names[i].name)) {
			*ret = signal_names[i].number;
			return 0;
		}
	}
	/* RTMIN+n */
	if (ascii_lower(s[0]) == 'r' && ascii_lower(s[1]) == 't' && ascii_lower(s[2]) == 'm' &&
	    ascii_lower(s[3]) == 'i' && ascii_lower(s[4]) == 'n') {
		unsigned n = 0;
		if (s[5] && (s[5] != '+' || emm_parse_uint(s + 6, 0, 64, &n) < 0))
			return -EINVAL;
		if ((unsigned)SIGRTMIN + n > (unsigned)SIGRTMAX)
			return -EINVAL;
		*ret = (unsigned)SIGRTMIN + n;
		return 0;
	}
	return -EINVAL;
}

void emm_format_signal(unsigned sig, char *buf, size_t n)
{
	if (sig == 0) {
		snprintf(buf, n, "off");
		return;
	}
	for (size_t i = 0; i < EMM_ARRAY_SIZE(signal_names); i++) {
		if (signal_names[i].number == sig) {
			snprintf(buf, n, "SIG%s", signal_names[i].name);
			return;
		}
	}
	if (sig >= (unsigned)SIGRTMIN && sig <= (unsigned)SIGRTMAX)
		snprintf(buf, n, "SIGRTMIN+%u", sig - (unsigned)SIGRTMIN);
	else
		snprintf(buf, n, "%u", sig);
}

int emm_parse_stats(const char *s, bool *ret_on, bool *ret_json, char *file, size_t file_size)
{
	bool on;
	size_t len;

	if (!s)
		return -EINVAL;
	if (emm_parse_bool(s, &on) == 0) {
		*ret_on = on;
		*ret_json = false;
		file[0] = '\0';
		return 0;
	}
	if (ascii_eq_nocase(s, "table") || ascii_eq_nocase(s, "json")) {
		*ret_on = true;
		*ret_json = ascii_lower(s[0]) == 'j';
		file[0] = '\0';
		return 0;
	}
	/* A path: it names a folder (has a '/') or ends in .json. */
	len = strlen(s);
	if (len >= file_size ||
	    (!strchr(s, '/') && (len < 5 || !ascii_eq_nocase(s + len - 5, ".json"))))
		return -EINVAL;
	*ret_on = true;
	*ret_json = true;
	memcpy(file, s, len + 1);
	return 0;
}
