/* SPDX-License-Identifier: MIT */
/* placeholder: being written */
typedef int emm_placeholder_interpose_shims_driver_c;
