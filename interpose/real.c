/* SPDX-License-Identifier: MIT */
/* placeholder: being written */
typedef int emm_placeholder_interpose_real_c;
