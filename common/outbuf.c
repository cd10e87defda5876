/* SPDX-License-Identifier: MIT */
/*
 * common/outbuf.c - owns buffered, allocation-free output to a file or an fd
 * (outbuf.h).
 */
#include "common/outbuf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void flush(struct emm_outbuf *ob)
{
	const char *p = ob->buf;
	size_t len = ob->used;

	while (len > 0 && !ob->error) {
		ssize_t w = write(ob->fd, p, len);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			ob->error = w < 0 ? -errno : -EIO;
			break;
		}
		p += w;
		len -= (size_t)w;
	}
	ob->used = 0;
}

void emm_outbuf_fd(struct emm_outbuf *ob, int fd)
{
	ob->fd = fd;
	ob->error = 0;
	ob->used = 0;
	ob->path[0] = ob->tmp[0] = '\0';
}

int emm_outbuf_open(struct emm_outbuf *ob, const char *path)
{
	int n;

	emm_outbuf_fd(ob, -1);
	if (strlen(path) >= sizeof(ob->path))
		return -ENAMETOOLONG;
	n = snprintf(ob->tmp, sizeof(ob->tmp), "%s.tmp.%ld", path, (long)getpid());
	if (n < 0 || (size_t)n >= sizeof(ob->tmp))
		return -ENAMETOOLONG;
	ob->fd = open(ob->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (ob->fd < 0)
		return -errno;
	memcpy(ob->path, path, strlen(path) + 1);
	return 0;
}

void emm_outbuf_write(struct emm_outbuf *ob, const void *data, size_t len)
{
	const char *p = data;

	while (len > 0) {
		size_t room = sizeof(ob->buf) - ob->used;
		size_t n = len < room ? len : room;

		memcpy(ob->buf + ob->used, p, n);
		ob->used += n;
		p += n;
		len -= n;
		if (ob->used == sizeof(ob->buf))
			flush(ob);
	}
}

void emm_outbuf_printf(struct emm_outbuf *ob, const char *fmt, ...)
{
	char line[512];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	if (n > 0)
		emm_outbuf_write(ob, line, (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1);
}

int emm_outbuf_commit(struct emm_outbuf *ob)
{
	flush(ob);
	if (!ob->path[0])
		return ob->error;
	if (close(ob->fd) < 0 && !ob->error)
		ob->error = -errno;
	ob->fd = -1;
	if (!ob->error && rename(ob->tmp, ob->path) < 0)
		ob->error = -errno;
	if (ob->error)
		unlink(ob->tmp);
	return ob->error;
}
