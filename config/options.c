/* SPDX-License-Identifier: MIT */
/* placeholder: being written */
typedef int emm_placeholder_config_options_c;
