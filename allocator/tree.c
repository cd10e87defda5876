/* SPDX-License-Identifier: MIT */
/*
 * allocator/tree.c - the red-black tree behind the best-fit free lists.
 *
 * Classic parent-pointer red-black tree (CLRS chapter 13, with NULL leaves):
 * insert and remove rebalance with at most three rotations, so every
 * operation is O(log n) and the height stays below 2 log2(n + 1). Nothing
 * here allocates; nodes are embedded in the allocator's blocks.
 */
#include "allocator/tree.h"

#include <errno.h>

static inline bool is_red(const struct emm_tree_node *n)
{
	return n && n->red;
}

static void rotate_left(struct emm_tree *t, struct emm_tree_node *x)
{
	struct emm_tree_node *y = x->right;

	x->right = y->left;
	if (y->left)
		y->left->parent = x;
	y->parent = x->parent;
	if (!x->parent)
		t->root = y;
	else if (x == x->parent->left)
		x->parent->left = y;
	else
		x->parent->right = y;
	y->left = x;
	x->parent = y;
}

static void rotate_right(struct emm_tree *t, struct emm_tree_node *x)
{
	struct emm_tree_node *y = x->left;

	x->left = y->right;
	if (y->right)
		y->right->parent = x;
	y->parent = x->parent;
	if (!x->parent)
		t->root = y;
	else if (x == x->parent->right)
		x->parent->right = y;
	else
		x->parent->left = y;
	y->right = x;
	x->parent = y;
}

int emm_tree_insert(struct emm_tree *t, struct emm_tree_node *z)
{
	struct emm_tree_node *y = NULL, *x = t->root;
	int c = 0;

	while (x) {
		y = x;
		c = emm_tree_key_cmp(z->key, x->key[0], x->key[1], x->key[2]);
		if (c == 0) {
			emm_tree_node_clear(z);
			return -EEXIST;
		}
		x = c < 0 ? x->left : x->right;
	}
	z->parent = y;
	z->left = z->right = NULL;
	z->red = true;
	if (!y)
		t->root = z;
	else if (c < 0)
		y->left = z;
	else
		y->right = z;
	t->count++;

	/* Fix a red node under a red parent, walking up. */
	while (z->parent && z->parent->red) {
		struct emm_tree_node *p = z->parent, *g = p->parent; /* p red: not the root, g exists */
		if (p == g->left) {
			struct emm_tree_node *u = g->right;
			if (is_red(u)) {
				p->red = false;
				u->red = false;
				g->red = true;
				z = g;
				continue;
			}
			if (z == p->right) {
				rotate_left(t, p);
				z = p;
				p = z->parent;
			}
			p->red = false;
			g->red = true;
			rotate_right(t, g);
		} else {
			struct emm_tree_node *u = g->left;
			if (is_red(u)) {
				p->red = false;
				u->red = false;
				g->red = true;
				z = g;
				continue;
			}
			if (z == p->left) {
				rotate_right(t, p);
				z = p;
				p = z->parent;
			}
			p->red = false;
			g->red = true;
			rotate_left(t, g);
		}
	}
	t->root->red = false;
	return 0;
}

/* Put v (may be NULL) where u was under u's parent. */
static void transplant(struct emm_tree *t, struct emm_tree_node *u, struct emm_tree_node *v)
{
	if (!u->parent)
		t->root = v;
	else if (u == u->parent->left)
		u->parent->left = v;
	else
		u->parent->right = v;
	if (v)
		v->parent = u->parent;
}

static struct emm_tree_node *subtree_min(struct emm_tree_node *n)
{
	while (n->left)
		n = n->left;
	return n;
}

static struct emm_tree_node *subtree_max(struct emm_tree_node *n)
{
	while (n->right)
		n = n->right;
	return n;
}

/* x (possibly NULL) carries an extra black; xp is its parent. */
static void remove_fixup(struct emm_tree *t, struct emm_tree_node *x, struct emm_tree_node *xp)
{
	while (x != t->root && !is_red(x)) {
		if (x == xp->left) {
			struct emm_tree_node *w = xp->right; /* exists: x's side is one black short */
			if (w->red) {
				w->red = false;
				xp->red = true;
				rotate_left(t, xp);
				w = xp->right;
			}
			if (!is_red(w->left) && !is_red(w->right)) {
				w->red = true;
				x = xp;
				xp = x->parent;
			} else {
				if (!is_red(w->right)) {
					w->left->red = false;
					w->red = true;
					rotate_right(t, w);
					w = xp->right;
				}
				w->red = xp->red;
				xp->red = false;
				w->right->red = false;
				rotate_left(t, xp);
				x = t->root;
				xp = NULL;
			}
		} else {
			struct emm_tree_node *w = xp->left;
			if (w->red) {
				w->red = false;
				xp->red = true;
				rotate_right(t, xp);
				w = xp->left;
			}
			if (!is_red(w->left) && !is_red(w->right)) {
				w->red = true;
				x = xp;
				xp = x->parent;
			} else {
				if (!is_red(w->left)) {
					w->right->red = false;
					w->red = true;
					rotate_left(t, w);
					w = xp->left;
				}
				w->red = xp->red;
				xp->red = false;
				w->left->red = false;
				rotate_right(t, xp);
				x = t->root;
				xp = NULL;
			}
		}
	}
	if (x)
		x->red = false;
}

void emm_tree_remove(struct emm_tree *t, struct emm_tree_node *z)
{
	struct emm_tree_node *x, *xp;
	bool removed_red = z->red;

	if (!z->left) {
		x = z->right;
		xp = z->parent;
		transplant(t, z, z->right);
	} else if (!z->right) {
		x = z->left;
		xp = z->parent;
		transplant(t, z, z->left);
	} else {
		/* Two children: z's successor y takes z's place and colour. */
		struct emm_tree_node *y = subtree_min(z->right);
		removed_red = y->red;
		x = y->right;
		if (y->parent == z) {
			xp = y;
		} else {
			xp = y->parent;
			transplant(t, y, y->right);
			y->right = z->right;
			y->right->parent = y;
		}
		transplant(t, z, y);
		y->left = z->left;
		y->left->parent = y;
		y->red = z->red;
	}
	if (!removed_red)
		remove_fixup(t, x, xp);
	t->count--;
	emm_tree_node_clear(z);
}

struct emm_tree_node *emm_tree_first(const struct emm_tree *t)
{
	return t->root ? subtree_min(t->root) : NULL;
}

struct emm_tree_node *emm_tree_last(const struct emm_tree *t)
{
	return t->root ? subtree_max(t->root) : NULL;
}

struct emm_tree_node *emm_tree_next(const struct emm_tree_node *n)
{
	if (n->right)
		return subtree_min(n->right);
	while (n->parent && n == n->parent->right)
		n = n->parent;
	return n->parent;
}

struct emm_tree_node *emm_tree_prev(const struct emm_tree_node *n)
{
	if (n->left)
		return subtree_max(n->left);
	while (n->parent && n == n->parent->left)
		n = n->parent;
	return n->parent;
}

struct emm_tree_node *emm_tree_find(const struct emm_tree *t, uint64_t k0, uint64_t k1, uint64_t k2)
{
	struct emm_tree_node *x = t->root;
	while (x) {
		int c = emm_tree_key_cmp(x->key, k0, k1, k2);
		if (c == 0)
			return x;
		x = c > 0 ? x->left : x->right;
	}
	return NULL;
}

/* Black height of the subtree, or -1. Checks order against (lo, hi) bounds. */
static int check_node(const struct emm_tree_node *n, const struct emm_tree_node *parent,
                      const struct emm_tree_node *lo, const struct emm_tree_node *hi, size_t *count,
                      const char **why)
{
	if (!n)
		return 0;
	if (n->parent != parent) {
		*why = "parent link disagrees";
		return -1;
	}
	if (lo && emm_tree_key_cmp(n->key, lo->key[0], lo->key[1], lo->key[2]) <= 0) {
		*why = "key order violated (left bound)";
		return -1;
	}
	if (hi && emm_tree_key_cmp(n->key, hi->key[0], hi->key[1], hi->key[2]) >= 0) {
		*why = "key order violated (right bound)";
		return -1;
	}
	if (n->red && (is_red(n->left) || is_red(n->right))) {
		*why = "red node with a red child";
		return -1;
	}
	(*count)++;
	int l = check_node(n->left, n, lo, n, count, why);
	if (l < 0)
		return -1;
	int r = check_node(n->right, n, n, hi, count, why);
	if (r < 0)
		return -1;
	if (l != r) {
		*why = "black heights differ";
		return -1;
	}
	return l + (n->red ? 0 : 1);
}

int emm_tree_check(const struct emm_tree *t, const char **ret_why)
{
	const char *why = NULL;
	size_t count = 0;
	int h;

	if (t->root && t->root->red) {
		why = "red root";
		h = -1;
	} else {
		h = check_node(t->root, NULL, NULL, NULL, &count, &why);
		if (h >= 0 && count != t->count) {
			why = "count disagrees with the nodes";
			h = -1;
		}
	}
	if (h < 0 && ret_why)
		*ret_why = why;
	return h;
}
