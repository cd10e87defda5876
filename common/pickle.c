/* SPDX-License-Identifier: MIT */
/*
 * common/pickle.c - owns the protocol-2 pickle opcodes libemm writes
 * (pickle.h). Opcodes and their encodings are Python's pickletools'.
 */
#include "common/pickle.h"

#include <string.h>

enum {
	OP_PROTO = 0x80,
	OP_STOP = '.',
	OP_MARK = '(',
	OP_EMPTY_DICT = '}',
	OP_SETITEMS = 'u',
	OP_EMPTY_LIST = ']',
	OP_APPENDS = 'e',
	OP_BININT = 'J',  /* 4-byte signed little-endian */
	OP_BININT1 = 'K', /* 1-byte unsigned */
	OP_BININT2 = 'M', /* 2-byte unsigned little-endian */
	OP_LONG1 = 0x8a,  /* n bytes of little-endian two's complement */
	OP_BINUNICODE = 'X',
	OP_NEWTRUE = 0x88,
	OP_NEWFALSE = 0x89,
	OP_NONE = 'N',
	OP_TUPLE2 = 0x86,
};

static void op(struct emm_outbuf *ob, unsigned char c)
{
	emm_outbuf_write(ob, &c, 1);
}

static void le(struct emm_outbuf *ob, uint64_t v, unsigned n)
{
	unsigned char b[8];

	for (unsigned i = 0; i < n; i++)
		b[i] = (unsigned char)(v >> (8 * i));
	emm_outbuf_write(ob, b, n);
}

void emm_pk_begin(struct emm_outbuf *ob)
{
	op(ob, OP_PROTO);
	op(ob, 2);
}

void emm_pk_end(struct emm_outbuf *ob)
{
	op(ob, OP_STOP);
}

void emm_pk_dict(struct emm_outbuf *ob)
{
	op(ob, OP_EMPTY_DICT);
	op(ob, OP_MARK);
}

void emm_pk_setitems(struct emm_outbuf *ob)
{
	op(ob, OP_SETITEMS);
}

void emm_pk_list(struct emm_outbuf *ob)
{
	op(ob, OP_EMPTY_LIST);
	op(ob, OP_MARK);
}

void emm_pk_appends(struct emm_outbuf *ob)
{
	op(ob, OP_APPENDS);
}

void emm_pk_int(struct emm_outbuf *ob, int64_t v)
{
	uint64_t u = (uint64_t)v;
	unsigned n = 1;

	if (v >= 0 && v < 256) {
		op(ob, OP_BININT1);
		le(ob, u, 1);
	} else if (v >= 0 && v < 65536) {
		op(ob, OP_BININT2);
		le(ob, u, 2);
	} else if (v >= INT32_MIN && v <= INT32_MAX) {
		op(ob, OP_BININT);
		le(ob, u, 4);
	} else {
		/* The fewest bytes whose top bit still carries the sign. */
		while (n < 8 && !((int64_t)u >> (8 * n - 1) == 0 || (int64_t)u >> (8 * n - 1) == -1))
			n++;
		op(ob, OP_LONG1);
		op(ob, (unsigned char)n);
		le(ob, u, n);
	}
}

void emm_pk_uint(struct emm_outbuf *ob, uint64_t v)
{
	if (v <= INT64_MAX) {
		emm_pk_int(ob, (int64_t)v);
		return;
	}
	/* Above INT64_MAX: nine bytes, the last 0 (positive). */
	op(ob, OP_LONG1);
	op(ob, 9);
	le(ob, v, 8);
	op(ob, 0);
}

void emm_pk_str(struct emm_outbuf *ob, const char *s)
{
	size_t n = strlen(s);

	op(ob, OP_BINUNICODE);
	le(ob, n, 4);
	emm_outbuf_write(ob, s, n);
}

void emm_pk_bool(struct emm_outbuf *ob, bool v)
{
	op(ob, v ? OP_NEWTRUE : OP_NEWFALSE);
}

void emm_pk_none(struct emm_outbuf *ob)
{
	op(ob, OP_NONE);
}

void emm_pk_tuple2(struct emm_outbuf *ob)
{
	op(ob, OP_TUPLE2);
}

void emm_pk_kv_int(struct emm_outbuf *ob, const char *key, int64_t v)
{
	emm_pk_str(ob, key);
	emm_pk_int(ob, v);
}

void emm_pk_kv_uint(struct emm_outbuf *ob, const char *key, uint64_t v)
{
	emm_pk_str(ob, key);
	emm_pk_uint(ob, v);
}

void emm_pk_kv_str(struct emm_outbuf *ob, const char *key, const char *v)
{
	emm_pk_str(ob, key);
	emm_pk_str(ob, v);
}
