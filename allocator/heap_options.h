/* SPDX-License-Identifier: MIT */
/*
 * allocator/heap_options.h - the heap parameters the EMM_* settings ask for
 * (config/options.h's struct emm_options onto allocator/heap.h's struct
 * emm_heap_params): one mapping for libemm itself (process/state.c) and for
 * emm-replay (tools/).
 */
#ifndef EMM_ALLOCATOR_HEAP_OPTIONS_H
#define EMM_ALLOCATOR_HEAP_OPTIONS_H

#include "allocator/heap.h"
#include "config/options.h"

void emm_heap_params_from_options(const struct emm_options *o, struct emm_heap_params *p);

#endif
