"""Looking at a radix tree: a depth-first walk, a text dump and a one-row-per-node frame.

The frame (:func:`tree_frame`) is what notebook tables and tree charts read; the text
(:func:`tree_text`) is SGLang's ``RadixCache.pretty_print`` with kvlab's fields::

    root #0 r=1
      [1 2 3 4] #2 r=1 hit=2 t=3      key preview, node id, lock_ref, hit_count,
        [5 6 7 8] #1 r=0 hit=1 t=2    last access tick; children indented
        [9 10 11 12] #3 r=1 hit=1 t=3
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from kvlab.engines.sglang.tree_node import TreeNode, preview_tokens

#: Column types of :func:`tree_frame`.
TREE_SCHEMA = {"node_id": pl.Int64, "parent_id": pl.Int64, "depth": pl.Int64, "n_tokens": pl.Int64,
               "first_tokens": pl.String, "lock_ref": pl.Int64, "evictable": pl.Boolean,
               "last_access_time": pl.Int64, "hit_count": pl.Int64, "extra_key": pl.String,
               "priority": pl.Int64, "creation_time": pl.Int64}


def iter_tree(root: TreeNode) -> Iterator[tuple[TreeNode, int]]:
    """Every node under ``root`` (itself first) with its depth in edges, depth-first,
    children in insertion order (a split keeps its node's place).

    Example:
        >>> [(n.node_id, d) for n, d in iter_tree(TreeNode(node_id=0, now=0))]
        [(0, 0)]
    """
    stack = [(root, 0)]
    while stack:
        node, depth = stack.pop()
        yield node, depth
        stack.extend((child, depth + 1) for child in reversed(list(node.children.values())))


def _label(node: TreeNode) -> str:
    namespace = "" if node.key.extra_key is None else f"{node.key.extra_key}:"
    return f"{namespace}{preview_tokens(node.key.token_ids)}"


def tree_text(root: TreeNode) -> str:
    """The tree as text, one node per line (see the module docstring).

    Example:
        >>> tree_text(TreeNode(node_id=0, now=0))
        'root #0 r=0'
    """
    lines = []
    for node, depth in iter_tree(root):
        if depth == 0:
            lines.append(f"root #{node.node_id} r={node.lock_ref}")
        else:
            lines.append(f"{'  ' * depth}{_label(node)} #{node.node_id} r={node.lock_ref} hit={node.hit_count} "
                         f"t={node.last_access_time}")
    return "\n".join(lines)


def tree_frame(root: TreeNode) -> pl.DataFrame:
    """One row per node, ``root`` first, depth-first.

    Columns (:data:`TREE_SCHEMA`): ``node_id``; ``parent_id`` (null for the root);
    ``depth`` (edges from the root); ``n_tokens``; ``first_tokens`` (a short preview,
    ``"[1 2 3 4 5 6 …]"``, prefixed ``"ns:"`` in a namespace); ``lock_ref``;
    ``evictable`` (an eviction candidate now: an unlocked leaf, SGLang's
    ``evictable_leaves``; inner unlocked nodes become candidates once their children go);
    ``last_access_time`` and ``creation_time`` (clock ticks); ``hit_count``;
    ``extra_key`` (null for the shared namespace); ``priority``.

    Example:
        >>> tree_frame(TreeNode(node_id=0, now=0)).select("node_id", "parent_id", "n_tokens").row(0)
        (0, None, 0)
    """
    rows = [{"node_id": n.node_id, "parent_id": None if depth == 0 else n.parent.node_id, "depth": depth,
             "n_tokens": len(n.key), "first_tokens": _label(n), "lock_ref": n.lock_ref,
             "evictable": depth > 0 and n.lock_ref == 0 and not n.children, "last_access_time": n.last_access_time,
             "hit_count": n.hit_count, "extra_key": n.key.extra_key, "priority": n.priority,
             "creation_time": n.creation_time} for n, depth in iter_tree(root)]
    return pl.DataFrame(rows, schema=TREE_SCHEMA)
