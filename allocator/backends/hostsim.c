/* SPDX-License-Identifier: MIT */
/* placeholder: being written */
typedef int emm_placeholder_allocator_backends_hostsim_c;
