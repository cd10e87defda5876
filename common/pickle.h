/* SPDX-License-Identifier: MIT */
/*
 * common/pickle.h - writing Python pickles (protocol 2) by hand, opcode by
 * opcode, into an emm_outbuf: no allocation, no Python. Enough for the
 * memory snapshots PyTorch's memory_viz reads (dicts, lists, strings,
 * integers, booleans, None, 2-tuples):
 *
 *     emm_pk_begin(ob);                       PROTO 2
 *     emm_pk_dict(ob);                        {}            (then MARK,
 *       emm_pk_str(ob, "a"); emm_pk_int(ob, 1);              key, value, ...,
 *     emm_pk_setitems(ob);                    SETITEMS       SETITEMS)
 *     emm_pk_end(ob);                         STOP
 *
 * emm_pk_dict and emm_pk_list push the empty container and a MARK;
 * emm_pk_setitems / emm_pk_appends pop back to the MARK into it. No memo
 * is used, so every string is written out each time.
 */
#ifndef EMM_COMMON_PICKLE_H
#define EMM_COMMON_PICKLE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/outbuf.h"

void emm_pk_begin(struct emm_outbuf *ob);
void emm_pk_end(struct emm_outbuf *ob);
void emm_pk_dict(struct emm_outbuf *ob);     /* EMPTY_DICT MARK */
void emm_pk_setitems(struct emm_outbuf *ob); /* SETITEMS */
void emm_pk_list(struct emm_outbuf *ob);     /* EMPTY_LIST MARK */
void emm_pk_appends(struct emm_outbuf *ob);  /* APPENDS */
void emm_pk_int(struct emm_outbuf *ob, int64_t v);
void emm_pk_uint(struct emm_outbuf *ob, uint64_t v);
void emm_pk_str(struct emm_outbuf *ob, const char *s);
void emm_pk_bool(struct emm_outbuf *ob, bool v);
void emm_pk_none(struct emm_outbuf *ob);
void emm_pk_tuple2(struct emm_outbuf *ob); /* the two values before it */

/* A key and an integer value inside a dict. */
void emm_pk_kv_int(struct emm_outbuf *ob, const char *key, int64_t v);
void emm_pk_kv_uint(struct emm_outbuf *ob, const char *key, uint64_t v);
void emm_pk_kv_str(struct emm_outbuf *ob, const char *key, const char *v);

#endif
