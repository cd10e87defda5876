/* SPDX-License-Identifier: MIT */
/*
 * allocator/tree.h - an intrusive red-black tree keyed by three 64-bit words,
 * compared lexicographically. The allocator keys free blocks by
 * (stream, size, address), so a lower_bound on (stream, size, 0) is a
 * best-fit search within one stream's blocks in O(log n).
 *
 * Intrusive: the node lives inside the caller's object and the tree never
 * allocates. The caller sets node->key before inserting and must not change
 * it while the node is linked. Keys must be unique (the allocator's include
 * the address). Not thread-safe: the owner's lock covers it.
 */
#ifndef EMM_ALLOCATOR_TREE_H
#define EMM_ALLOCATOR_TREE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct emm_tree_node {
	struct emm_tree_node *left, *right;
	struct emm_tree_node *parent; /* == self while unlinked (see emm_tree_node_clear) */
	uint64_t key[3];
	bool red;
};

struct emm_tree {
	struct emm_tree_node *root;
	size_t count;
};

static inline void emm_tree_init(struct emm_tree *t)
{
	t->root = NULL;
	t->count = 0;
}

/* Mark a node as in no tree; emm_tree_remove does this too. */
static inline void emm_tree_node_clear(struct emm_tree_node *n)
{
	n->parent = n;
}

static inline bool emm_tree_node_linked(const struct emm_tree_node *n)
{
	return n->parent != n;
}

/* <0, 0, >0 as key a sorts before, equal to, after (k0, k1, k2). */
static inline int emm_tree_key_cmp(const uint64_t a[3], uint64_t k0, uint64_t k1, uint64_t k2)
{
	if (a[0] != k0)
		return a[0] < k0 ? -1 : 1;
	if (a[1] != k1)
		return a[1] < k1 ? -1 : 1;
	if (a[2] != k2)
		return a[2] < k2 ? -1 : 1;
	return 0;
}

/* The first node whose key is >= (k0, k1, k2), or NULL. */
static inline struct emm_tree_node *emm_tree_lower_bound(const struct emm_tree *t, uint64_t k0, uint64_t k1,
                                                         uint64_t k2)
{
	struct emm_tree_node *x = t->root, *res = NULL;
	while (x) {
		if (emm_tree_key_cmp(x->key, k0, k1, k2) >= 0) {
			res = x;
			x = x->left;
		} else {
			x = x->right;
		}
	}
	return res;
}

/* Insert a node with its key set. Returns 0, or -EEXIST if the key is
 * already present (the node is then left unlinked). */
int emm_tree_insert(struct emm_tree *t, struct emm_tree_node *n);

/* Unlink a linked node. */
void emm_tree_remove(struct emm_tree *t, struct emm_tree_node *n);

struct emm_tree_node *emm_tree_first(const struct emm_tree *t);
struct emm_tree_node *emm_tree_last(const struct emm_tree *t);
struct emm_tree_node *emm_tree_next(const struct emm_tree_node *n);
struct emm_tree_node *emm_tree_prev(const struct emm_tree_node *n);

/* The node with exactly this key, or NULL. */
struct emm_tree_node *emm_tree_find(const struct emm_tree *t, uint64_t k0, uint64_t k1, uint64_t k2);

/*
 * Verify the tree: key order, parent links, no red node with a red child,
 * equal black height on every path, a black root, count. Returns the black
 * height (>= 0), or -1 and a reason in *ret_why (static string) if given.
 */
int emm_tree_check(const struct emm_tree *t, const char **ret_why);

#endif
