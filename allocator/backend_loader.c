/* SPDX-License-Identifier: MIT */
/* placeholder: being written */
typedef int emm_placeholder_allocator_backend_loader_c;
