/* SPDX-License-Identifier: MIT */
/* libemm's version: the one place it is written (meson reads it from here). */
#ifndef EMM_VERSION_H
#define EMM_VERSION_H

#define EMM_VERSION_MAJOR 0
#define EMM_VERSION_MINOR 1
#define EMM_VERSION_PATCH 0

#define EMM_VERSION_STR_(x) #x
#define EMM_VERSION_STR(x) EMM_VERSION_STR_(x)
#define EMM_VERSION_STRING                                      \
	EMM_VERSION_STR(EMM_VERSION_MAJOR) "." EMM_VERSION_STR( \
		EMM_VERSION_MINOR) "." EMM_VERSION_STR(EMM_VERSION_PATCH)

#endif
