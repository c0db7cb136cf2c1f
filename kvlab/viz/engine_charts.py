"""Charts of engine-level caches: a vLLM block pool's blocks and free queue, an SGLang radix tree.

Both take the cache object (its ``snapshot()`` frame is used) or that frame itself.
"""

from __future__ import annotations

import altair as alt
import polars as pl

from kvlab.viz.theme import PALETTE, label_expr

#: Block states of a vLLM block pool, in legend order.
BLOCK_STATES = ("null", "in_use", "cached_free", "free")
_STATE_COLOURS = ("#555555", PALETTE[3], PALETTE[0], "#DDDDDD")
#: Side of one block's cell, px (two 13 px lines: id and ref count).
CELL_PX = 44


def _frame(obj: object, required: set[str]) -> pl.DataFrame:
    frame = obj.snapshot() if hasattr(obj, "snapshot") else obj
    if not isinstance(frame, pl.DataFrame):
        raise ValueError(f"expected a cache with snapshot() or a polars DataFrame, got {type(obj).__name__}")
    missing = required - set(frame.columns)
    if missing:
        raise ValueError(f"snapshot lacks column(s) {sorted(missing)}; has {frame.columns}")
    return frame


def block_pool_chart(pool: object, *, columns: int = 16, title: str | None = None) -> alt.VConcatChart:
    """Blocks by state with ref counts, and the free queue from head (next victim) to tail.

    Args:
        pool: a :class:`kvlab.engines.BlockPool` or its ``snapshot()`` frame (columns
            ``block_id``, ``state``, ``ref_cnt``, ``block_hash``, ``queue_position``).
        columns: blocks per row of the grid.
        title: chart title.

    Returns:
        Top: one cell per block (colour = state: null / in use / cached-free / free;
        label = ref count). Bottom: the free queue in order, labelled by block id —
        allocation takes from the left, so the leftmost cached-free block is evicted next.

    Raises:
        ValueError: not a pool or snapshot, or missing columns, or ``columns < 1``.
    """
    if isinstance(columns, bool) or not isinstance(columns, int) or columns < 1:
        raise ValueError(f"columns must be an integer >= 1, got {columns!r}")
    frame = _frame(pool, {"block_id", "state", "ref_cnt", "block_hash", "queue_position"}).with_columns(
        col=pl.col("block_id") % columns, row=pl.col("block_id") // columns,
        hash_hex=pl.col("block_hash").map_elements(lambda h: f"{h:016x}", return_dtype=pl.String))
    colour = alt.Color("state:N", title="block state",
                       legend=alt.Legend(labelExpr=label_expr(BLOCK_STATES), symbolSize=250),
                       scale=alt.Scale(domain=list(BLOCK_STATES), range=list(_STATE_COLOURS)))
    ink = alt.condition(alt.datum.state == "free", alt.value("black"), alt.value("white"))
    tooltip = ["block_id:Q", "state:N", "ref_cnt:Q", "hash_hex:N", "queue_position:Q"]
    x, y = alt.X("col:O", title=None, axis=None), alt.Y("row:O", title=None, axis=None)
    cells = alt.Chart(frame).mark_rect(stroke="white", strokeWidth=2).encode(x=x, y=y, color=colour, tooltip=tooltip)
    labels = alt.Chart(frame).mark_text(fontSize=15, fontWeight="bold", dy=-7).encode(
        x=x, y=y, text=alt.Text("block_id:Q"), color=ink, tooltip=tooltip)
    refs = alt.Chart(frame.filter(pl.col("ref_cnt") > 0).with_columns(ref=pl.format("ref {}", pl.col("ref_cnt"))))
    refs = refs.mark_text(fontSize=13, dy=10).encode(x=x, y=y, text="ref:N", color=ink)
    rows = int(frame["row"].max() + 1)
    grid = alt.layer(cells, labels, refs).properties(
        width=CELL_PX * columns, height=CELL_PX * rows, title=alt.TitleParams(
            "blocks: id (bold) and ref count", fontSize=15, anchor="start"))
    queue = frame.filter(pl.col("queue_position").is_not_null())
    position = alt.X("queue_position:O", title="free queue: head (next allocated) → tail",
                     axis=alt.Axis(labels=False, ticks=False, domain=False))
    strip = alt.Chart(queue).mark_rect(stroke="white", strokeWidth=2).encode(x=position, color=colour, tooltip=tooltip)
    strip_labels = alt.Chart(queue).mark_text(fontSize=15, fontWeight="bold").encode(
        x=position, text="block_id:Q", color=ink)
    chart = alt.vconcat(grid, alt.layer(strip, strip_labels).properties(
        width=CELL_PX * max(len(queue), 1), height=CELL_PX))
    return chart.properties(title=title) if title else chart


def tree_layout(frame: pl.DataFrame) -> pl.DataFrame:
    """x/y positions for a tree given as ``node_id, parent_id, depth`` rows.

    Leaves take consecutive x in depth-first order (children by ``node_id``); a parent
    sits at the mean x of its children; y is the depth.

    Raises:
        ValueError: a parent id that is not a node, or no root (``parent_id`` null).
    """
    children: dict[int | None, list[int]] = {}
    for node, parent in zip(frame["node_id"].to_list(), frame["parent_id"].to_list()):
        children.setdefault(parent, []).append(node)
    ids = set(frame["node_id"].to_list())
    if None not in children:
        raise ValueError("the tree has no root (a node with parent_id null)")
    unknown = [p for p in children if p is not None and p not in ids]
    if unknown:
        raise ValueError(f"parent ids {sorted(unknown)} are not nodes of the tree")
    x: dict[int, float] = {}
    next_leaf = 0.0

    def place(node: int) -> float:
        nonlocal next_leaf
        kids = sorted(children.get(node, []))
        if not kids:
            x[node] = next_leaf
            next_leaf += 1.0
        else:
            x[node] = sum(place(k) for k in kids) / len(kids)
        return x[node]

    for root in sorted(children[None]):
        place(root)
    return frame.with_columns(x=pl.col("node_id").replace_strict(x, return_dtype=pl.Float64))


def radix_tree_chart(cache: object, *, title: str | None = None) -> alt.LayerChart:
    """An SGLang radix tree: one node per circle (size = tokens, colour = root / locked /
    evictable leaf / inner), edges to parents, labelled with each node's first tokens.

    Args:
        cache: a :class:`kvlab.engines.RadixCache` or its ``snapshot()`` frame (columns
            ``node_id``, ``parent_id``, ``depth``, ``num_tokens``, ``first_tokens``,
            ``lock_ref``, ``evictable``, ``hit_count``, ``last_access_time``).
        title: chart title.

    Raises:
        ValueError: not a cache or snapshot, or missing columns.
    """
    frame = tree_layout(_frame(cache, {"node_id", "parent_id", "depth", "num_tokens", "first_tokens", "lock_ref",
                                      "evictable", "hit_count", "last_access_time"}))
    frame = frame.with_columns(status=pl.when(pl.col("parent_id").is_null()).then(pl.lit("root"))
                               .when(pl.col("lock_ref") > 0).then(pl.lit("locked"))
                               .when(pl.col("evictable")).then(pl.lit("evictable leaf"))
                               .otherwise(pl.lit("inner")))
    parents = frame.select(pl.col("node_id").alias("parent_id"), pl.col("x").alias("px"), pl.col("depth").alias("pd"))
    edges = frame.join(parents, on="parent_id", how="inner")
    y = alt.Y("depth:Q", title="depth", scale=alt.Scale(reverse=True, domain=[-0.3, frame["depth"].max() + 0.3]),
              axis=alt.Axis(tickMinStep=1, format="d"))
    x = alt.X("x:Q", axis=None, scale=alt.Scale(domain=[-0.6, frame["x"].max() + 0.6]))
    lines = alt.Chart(edges).mark_rule(color="#999999").encode(x=x, y=y, x2="px:Q", y2="pd:Q")
    tooltip = ["node_id:Q", "first_tokens:N", "num_tokens:Q", "lock_ref:Q", "hit_count:Q", "last_access_time:Q"]
    nodes = alt.Chart(frame).mark_circle(opacity=1).encode(
        x=x, y=y, size=alt.Size("num_tokens:Q", title="tokens in node", scale=alt.Scale(range=[60, 600]),
                      legend=alt.Legend(symbolFillColor="#8a8a8a", symbolStrokeWidth=0, tickMinStep=1, format="d")),
        color=alt.Color("status:N", title="node", scale=alt.Scale(
            domain=["root", "locked", "evictable leaf", "inner"],
            range=["#000000", PALETTE[3], PALETTE[2], "#8a8a8a"])),
        tooltip=tooltip)
    text = alt.Chart(frame).mark_text(align="left", dx=14, dy=-12, fontSize=14).encode(x=x, y=y, text="first_tokens:N")
    chart = alt.layer(lines, nodes, text).properties(width=520, height=60 * int(frame["depth"].max() + 1))
    return chart.properties(title=title) if title else chart
