/* SPDX-License-Identifier: MIT */
/*
 * process/ipc_registry.c - the per-user IPC registry: a file
 * EMM_IPC_DIR/libemm-ipc-UID (by default under /dev/shm) of fixed-size
 * slots, each mapping one libemm IPC handle (exporter, serial) to the
 * driver's handle of the segment, the block's offset and size
 * (ipc_internal.h has the layout), shared by every libemm process of the
 * user; and telling live exporters from dead ones.
 *
 * Safety: the file is opened with O_NOFOLLOW, created with mode 0600, and
 * used only when it is a regular file owned by this user with no group or
 * other permission bits (anything else is refused, with one warning: IPC of
 * sub-allocated blocks is then refused too). Every access holds flock on
 * the file, so a process that dies mid-update leaves no lock behind; a
 * slot is written in full before its `kind` word is set, and read only
 * under the lock. Besides the exports, importers record which segments
 * they have open, so that an exporter keeps a segment only while someone
 * may use it. Entries of dead processes are ignored and reclaimed when no
 * slot is free; a process whose pid was reused is told by its start time.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "process/ipc_internal.h"

#define REG_MAGIC "libemm-ipc-reg1"
#define REG_SLOTS 4096u

struct reg_header {
	char magic[16];
	uint32_t slots;
	uint32_t slot_size;
	char reserved[sizeof(struct ipc_entry) - 24];
};
_Static_assert(sizeof(struct reg_header) == sizeof(struct ipc_entry), "the header takes one slot");

#define REG_BYTES (sizeof(struct reg_header) + (size_t)REG_SLOTS * sizeof(struct ipc_entry))

static int reg_fd = -1;
static struct reg_header *reg_map; /* NULL until opened */
static int reg_error;              /* the open's failure, kept (not retried) */

/* --- who is alive ------------------------------------------------------ */

/* Field 22 of /proc/PID/stat (after the parenthesised name, which may
 * itself hold spaces and parentheses): 0 and the value, or -errno. */
static int start_time_of(long pid, uint64_t *ret)
{
	char path[64], buf[1024];
	unsigned long long v;
	ssize_t n;
	char *p;
	int fd;

	snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return -EIO;
	buf[n] = '\0';
	p = strrchr(buf, ')');
	if (!p)
		return -EIO;
	/* ") S ppid ..." : state is field 3, start time field 22 */
	p++;
	for (int field = 2; field < 21 && p; field++)
		p = strchr(p + 1, ' ');
	if (!p || sscanf(p, " %llu", &v) != 1)
		return -EIO;
	*ret = v;
	return 0;
}

static uint64_t pid_namespace(void)
{
	struct stat st;

	return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

void ipc_self(struct ipc_owner *ret)
{
	static struct ipc_owner self;
	static pid_t self_pid;
	pid_t pid = getpid();

	/* Cached per pid: a fork child reads its own. */
	if (self_pid != pid) {
		struct ipc_owner o = {.pid = (uint32_t)pid, .pidns = pid_namespace()};
		if (start_time_of(pid, &o.start_time) != 0)
			o.start_time = 0;
		self = o;
		self_pid = pid;
	}
	*ret = self;
}

bool ipc_owner_alive(const struct ipc_owner *owner)
{
	struct ipc_owner self;
	uint64_t start;
	int r;

	ipc_self(&self);
	if (owner->pidns != self.pidns || owner->pidns == 0)
		return true; /* another pid namespace: its pids mean nothing here */
	r = start_time_of((long)owner->pid, &start);
	if (r == -ENOENT)
		return false;
	if (r == 0)
		return owner->start_time == 0 || start == owner->start_time;
	return kill((pid_t)owner->pid, 0) == 0 || errno == EPERM;
}

/* --- the file ------------------------------------------------------------ */

static int open_checked(const char *dir)
{
	char path[512];
	struct stat st;
	int fd;

	if (snprintf(path, sizeof(path), "%s/libemm-ipc-%lu", dir, (unsigned long)geteuid()) >= (int)sizeof(path))
		return -ENAMETOOLONG;
	fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0) {
		int e = errno;
		emm_warn("IPC registry %s: cannot open it (%s): exports of sub-allocated blocks are refused", path,
		         strerror(e));
		return -e;
	}
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
		emm_warn("IPC registry %s: not a regular file of this user with mode 0600: not used, exports of "
		         "sub-allocated blocks are refused (remove it, or set EMM_IPC_DIR)",
		         path);
		close(fd);
		return -EPERM;
	}
	return fd;
}

/* Lay the file out if it is new; check it if not. flock held. */
static int prepare_locked(int fd)
{
	struct reg_header h;
	struct stat st;

	if (fstat(fd, &st) != 0)
		return -errno;
	if (st.st_size == 0) {
		memset(&h, 0, sizeof(h));
		memcpy(h.magic, REG_MAGIC, sizeof(h.magic));
		h.slots = REG_SLOTS;
		h.slot_size = sizeof(struct ipc_entry);
		if (ftruncate(fd, (off_t)REG_BYTES) != 0 || pwrite(fd, &h, sizeof(h), 0) != (ssize_t)sizeof(h))
			return -EIO;
		return 0;
	}
	if ((size_t)st.st_size != REG_BYTES || pread(fd, &h, sizeof(h), 0) != (ssize_t)sizeof(h) ||
	    memcmp(h.magic, REG_MAGIC, sizeof(h.magic)) != 0 || h.slots != REG_SLOTS ||
	    h.slot_size != sizeof(struct ipc_entry))
		return -EPROTO;
	return 0;
}

/* Open and map the registry once; 0 or the (kept) error. */
static int reg_open(const char *dir)
{
	void *map;
	int fd, r;

	if (reg_map)
		return 0;
	if (reg_error)
		return reg_error;
	fd = open_checked(dir);
	if (fd < 0)
		return reg_error = fd;
	if (flock(fd, LOCK_EX) != 0) {
		close(fd);
		return reg_error = -EIO;
	}
	r = prepare_locked(fd);
	flock(fd, LOCK_UN);
	if (r == -EPROTO)
		emm_warn("IPC registry in %s: laid out by another libemm version: not used, exports of "
		         "sub-allocated blocks are refused (remove it when no libemm process runs)",
		         dir);
	map = r == 0 ? mmap(NULL, REG_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
	if (map == MAP_FAILED) {
		close(fd);
		return reg_error = r ? r : -ENOMEM;
	}
	reg_fd = fd;
	reg_map = map;
	return 0;
}

static struct ipc_entry *slot(unsigned i)
{
	return (struct ipc_entry *)(void *)(reg_map + 1) + i;
}

static bool same_owner(const struct ipc_owner *a, const struct ipc_owner *b)
{
	return a->pid == b->pid && a->start_time == b->start_time && a->pidns == b->pidns;
}

static int lock_open(const char *dir, int how)
{
	int r = reg_open(dir);

	if (r == 0 && flock(reg_fd, how) != 0)
		r = -EIO;
	return r;
}

static bool same_segment(const struct ipc_entry *s, const CUipcMemHandle *segment)
{
	return memcmp(&s->segment, segment, sizeof(*segment)) == 0;
}

/* Store *e in a free slot, or one of a dead process. flock held. */
static int add_locked(const struct ipc_entry *e)
{
	struct ipc_entry *to = NULL, copy = *e;

	for (unsigned i = 0; i < REG_SLOTS && !to; i++)
		if (slot(i)->kind == IPC_SLOT_FREE)
			to = slot(i);
	for (unsigned i = 0; i < REG_SLOTS && !to; i++)
		if (!ipc_owner_alive(&slot(i)->owner))
			to = slot(i);
	if (!to)
		return -ENOSPC;
	to->kind = IPC_SLOT_FREE;
	copy.kind = IPC_SLOT_FREE;
	*to = copy;
	atomic_thread_fence(memory_order_release);
	to->kind = e->kind;
	return 0;
}

int ipc_registry_add(const char *dir, const struct ipc_entry *e)
{
	int r = lock_open(dir, LOCK_EX);

	if (r != 0)
		return r;
	r = add_locked(e);
	flock(reg_fd, LOCK_UN);
	return r;
}

int ipc_registry_open(const char *dir, const struct ipc_owner *owner, uint64_t serial,
                      const struct ipc_owner *importer, struct ipc_entry *ret)
{
	const struct ipc_entry *found = NULL;
	bool recorded = false;
	int r = lock_open(dir, LOCK_EX);

	if (r != 0)
		return r;
	for (unsigned i = 0; i < REG_SLOTS && !found; i++) {
		const struct ipc_entry *s = slot(i);
		if (s->kind == IPC_SLOT_EXPORT && s->serial == serial && same_owner(&s->owner, owner))
			found = s;
	}
	for (unsigned i = 0; i < REG_SLOTS && found && !recorded; i++) {
		const struct ipc_entry *s = slot(i);
		recorded = s->kind == IPC_SLOT_IMPORT && same_owner(&s->owner, importer) &&
		           same_segment(s, &found->segment);
	}
	r = found ? 0 : -ENOENT;
	if (found) {
		/* (the slot may be reclaimed by the add: its exporter may be gone) */
		struct ipc_entry exp = *found;
		struct ipc_entry imp = {.kind = IPC_SLOT_IMPORT, .owner = *importer, .seg_size = exp.seg_size,
		                        .segment = exp.segment};
		if (!recorded)
			r = add_locked(&imp);
		if (r == 0)
			*ret = exp;
	}
	flock(reg_fd, LOCK_UN);
	return r;
}

void ipc_registry_unimport(const char *dir, const struct ipc_owner *importer, const CUipcMemHandle *segment)
{
	if (lock_open(dir, LOCK_EX) != 0)
		return;
	for (unsigned i = 0; i < REG_SLOTS; i++) {
		struct ipc_entry *s = slot(i);
		if (s->kind == IPC_SLOT_IMPORT && same_owner(&s->owner, importer) && same_segment(s, segment))
			s->kind = IPC_SLOT_FREE;
	}
	flock(reg_fd, LOCK_UN);
}

int ipc_registry_release(const char *dir, const struct ipc_owner *self, const CUipcMemHandle *segment)
{
	int r = lock_open(dir, LOCK_EX);

	if (r != 0)
		return r;
	for (unsigned i = 0; i < REG_SLOTS && r == 0; i++) {
		const struct ipc_entry *s = slot(i);
		if (s->kind == IPC_SLOT_IMPORT && same_segment(s, segment) && ipc_owner_alive(&s->owner))
			r = -EBUSY;
	}
	for (unsigned i = 0; i < REG_SLOTS && r == 0; i++) {
		struct ipc_entry *s = slot(i);
		if (s->kind == IPC_SLOT_EXPORT && same_owner(&s->owner, self) && same_segment(s, segment))
			s->kind = IPC_SLOT_FREE;
	}
	flock(reg_fd, LOCK_UN);
	return r;
}

void ipc_registry_remove(const char *dir, const struct ipc_owner *self,
                         bool (*drop)(void *arg, const struct ipc_entry *e), void *arg)
{
	if (lock_open(dir, LOCK_EX) != 0)
		return;
	for (unsigned i = 0; i < REG_SLOTS; i++) {
		struct ipc_entry *s = slot(i);
		if (s->kind != IPC_SLOT_FREE && same_owner(&s->owner, self) && drop(arg, s))
			s->kind = IPC_SLOT_FREE;
	}
	flock(reg_fd, LOCK_UN);
}

void ipc_registry_fork_child(void)
{
	if (reg_map)
		munmap(reg_map, REG_BYTES);
	if (reg_fd >= 0)
		close(reg_fd);
	reg_map = NULL;
	reg_fd = -1;
	reg_error = 0;
}
