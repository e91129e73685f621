"""Transfer time per collective and what follows from it, on the collectives ``cross_rank`` matched across ranks.

A collective's transfer time is the same on every rank: from the moment its last peer arrived to its end, the
shortest duration over the ranks that ran it (``transfer_times``). ``transfer_metrics`` gives each rank's
``exposed_transfer_ms`` (the transfer intervals, unioned, not hidden by computation: waiting hidden under compute
was never exposed), the parts of it in collectives issued inside an optimizer's step
(``optimizer_exposed_transfer_ms``) and by the training loop itself (``loop_exposed_transfer_ms``), and the rest,
DDP's (``ddp_exposed_transfer_ms``), and the transfer time of DDP's buffer broadcasts
(``buffer_broadcast_transfer_ms``); ``transfer_bandwidth`` the bandwidth per collective kind (bytes over the union
of the transfer intervals: collectives running at once on gloo's two threads or NCCL's streams are counted once).
All on numpy columns over every rank at once.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ddpdoctor.metrics import catalog
from ddpdoctor.metrics.cross_rank import Windows, all_collectives, in_analysed_steps, key_ids, keyed
from ddpdoctor.metrics.group_sums import pairwise_group_sum, pandas_group_sum
from ddpdoctor.table import Table, group_ids, group_min, group_nunique


def transfer_times(summaries: list[dict[str, Any]], colls: Table) -> np.ndarray:
    """Per row of ``colls`` (``all_collectives``): the collective's transfer time (µs), the same on every rank --
    from the moment its last peer arrived to its end. The last to arrive waits for no one, so that is the
    shortest duration over the ranks that ran it (clock offsets between hosts do not enter). NaN where not every
    peer of the collective is in the data (its group size, else the world size, exceeds the ranks matched), or it
    is matched on no other rank; its own duration in a one-process group (nothing to wait for)."""
    t = np.full(len(colls), np.nan)
    if len(colls) == 0:
        return t
    world_of = {s["rank"]: int(s.get("world_size") or 1) for s in summaries}
    ranks = colls["rank"]
    known = np.array(sorted(world_of), dtype=np.int64)
    worlds = np.array([world_of[r] for r in known.tolist()], dtype=np.float64)
    at = np.minimum(np.searchsorted(known, ranks), max(len(known) - 1, 0))
    world = np.where(known[at] == ranks, worlds[at], 1.0) if len(known) else np.ones(len(colls))
    group = colls["group_size"]
    size = np.where(group > 0, group, world)
    dur = colls["dur_us"]
    alone = size <= 1
    t[alone] = dur[alone]
    ok = keyed(colls) & (colls["step"] >= 0) & ~alone
    if not ok.any():
        return t
    rows = np.flatnonzero(ok)
    sub = colls[ok]
    gid, n = key_ids(sub)
    seen = group_nunique(sub["rank"], gid, n)
    need = np.zeros(n)
    np.maximum.at(need, gid, size[rows])
    full = seen[gid] >= np.maximum(need[gid], 2)
    shortest = group_min(sub["dur_us"], gid, n)[gid]
    t[rows[full]] = shortest[full]
    return t


def transfer_metrics(
    summaries: list[dict[str, Any]],
    colls: Table,
    transfer_us: np.ndarray | None = None,
    windows: Windows | None = None,
) -> dict[int, dict[str, float | None]]:
    """Per rank over its analysed steps: ``exposed_transfer_ms`` (per step: the time some collective of the rank
    is transferring -- after its last peer arrived -- while no computation runs: the transfer intervals, unioned,
    intersected with the summary's ``exposed_comm`` intervals; waiting hidden under computation was never exposed,
    waiting that is exposed is not transfer), ``algbw_gbps``/``busbw_gbps`` (bytes of the sized collectives over
    the union of their transfer intervals: concurrent collectives, gloo's two threads, counted once).

    Collectives matched on no other rank count their whole duration as transfer in the exposed time (no wait is
    known) and are left out of the bandwidth. None where the rank's collectives have no transfer time (peers
    absent from the data) or the summary has no ``exposed_comm``."""
    from ddpdoctor.metrics import intervals as iv
    from ddpdoctor.metrics.comm import bus_factor

    out: dict[int, dict[str, float | None]] = {}
    windows = Windows(summaries) if windows is None else windows
    ranks_all = [s["rank"] for s in summaries]
    n = len(summaries)
    t = transfer_times(summaries, colls) if transfer_us is None else transfer_us
    if len(colls):
        analysed = in_analysed_steps(colls, summaries, windows)
        rid = _positions(ranks_all, colls["rank"])
        analysed &= rid >= 0
    else:
        analysed = np.zeros(0, dtype=bool)
        rid = np.zeros(0, dtype=np.int64)
    c = colls[analysed] if len(colls) else colls
    rid, tt = rid[analysed], t[analysed]
    matched = ~np.isnan(tt)
    rows_n = np.bincount(rid, minlength=n)
    matched_n = np.bincount(rid[matched], minlength=n)
    end = c["end_us"].astype(np.float64) if len(c) else np.zeros(0)
    dur = c["dur_us"].astype(np.float64) if len(c) else np.zeros(0)
    own_t = np.where(matched, tt, dur)
    transfer = iv.union_by(end - own_t, end, rid)
    # the part of it issued inside an optimizer's step (ZeroRedundancyOptimizer's parameter sync after its update)
    issued_in = c["issued_in"].values() if len(c) else np.zeros(0, dtype=object)
    in_opt = issued_in == "optimizer"
    opt_transfer = iv.union_by((end - own_t)[in_opt], end[in_opt], rid[in_opt])
    # the training loop's own collectives (a loss all_reduce for logging), told apart only on a rank whose DDP
    # gradient all-reduces are seen issued in its backward pass (else: a summary from before the distinction, or a
    # job that all-reduces its gradients by hand after backward, whose exposed all-reduce is what the DDP rule
    # is about)
    in_loop = issued_in == "loop"
    told = np.bincount(rid[issued_in == "backward"], minlength=n) > 0
    loop_transfer = iv.union_by((end - own_t)[in_loop], end[in_loop], rid[in_loop])
    # DDP's buffer broadcasts (issued in its forward): their transfer, the wait for the last rank to reach the
    # forward left out (with broadcast_buffers=False the ranks wait for it at the next collective instead)
    kinds = np.zeros(0, dtype=object)
    if len(c):
        kinds = np.asarray(c["kind"].values() if hasattr(c["kind"], "values") else c["kind"], dtype=object)
    in_fwd = (issued_in == "ddp_forward") & (kinds == "broadcast")
    buffer_us = iv.total_by(iv.union_by((end - own_t)[in_fwd], end[in_fwd], rid[in_fwd]), n)
    has_exposed, exposed_us, hidden_not, opt_exposed, loop_exposed = _exposed_transfer(
        summaries, transfer, opt_transfer, loop_transfer
    )
    nbytes = c["bytes"].astype(np.float64) if len(c) else np.zeros(0)
    sized = matched & ~np.isnan(nbytes) & (nbytes > 0) & (tt > 0)
    moving = iv.union_by((end - tt)[sized], end[sized], rid[sized])
    seconds = iv.total_by(moving, n) / 1e6
    bytes_sum = np.bincount(rid[sized], weights=nbytes[sized], minlength=n)
    factors = np.ones(len(c))
    if sized.any():
        world = np.array([int(s.get("world_size") or 1) for s in summaries], dtype=np.int64)
        group = c["group_size"]
        size = np.where(group > 0, group, world[rid]).astype(np.int64)
        # the distinct (kind, size) pairs in C first (a set of 327,680 rows' tuples cost 0.5 s at 16,384 ranks),
        # then made plain: the same pairs, each a disjoint mask
        pairs = set(zip(kinds[sized].tolist(), size[sized].tolist(), strict=True))
        for kind, g in {(str(k), int(x)) for k, x in pairs}:
            factors[(kinds == kind) & (size == g)] = bus_factor(kind, g)
    bus_sum = np.bincount(rid[sized], weights=(nbytes * factors)[sized], minlength=n)
    counts = windows.counts
    for i, r in enumerate(ranks_all):
        steps = int(counts[i])
        if steps == 0:
            continue
        values: dict[str, float | None] = dict.fromkeys(catalog.group("transfer"))
        if has_exposed[i]:
            if rows_n[i] == 0:  # no collective in the analysed steps: whatever is exposed, nobody was waited for
                values["exposed_transfer_ms"] = float(exposed_us[i]) / steps / 1e3
                values["ddp_exposed_transfer_ms"] = values["exposed_transfer_ms"]  # nothing to set aside
            elif matched_n[i] > 0:
                values["exposed_transfer_ms"] = float(hidden_not[i]) / steps / 1e3
                values["optimizer_exposed_transfer_ms"] = float(opt_exposed[i]) / steps / 1e3
                ddp_us = hidden_not[i] - opt_exposed[i]
                if told[i]:
                    values["loop_exposed_transfer_ms"] = float(loop_exposed[i]) / steps / 1e3
                    ddp_us -= loop_exposed[i]
                values["ddp_exposed_transfer_ms"] = max(0.0, float(ddp_us)) / steps / 1e3
        wall = (summaries[i].get("metrics") or {}).get("buffer_broadcast_ms")
        if isinstance(wall, (int, float)):  # None where a broadcast's issuer is unknown: so is its transfer
            values["buffer_broadcast_transfer_ms"] = min(float(wall), float(buffer_us[i]) / steps / 1e3)
        if seconds[i] > 0:
            values["algbw_gbps"] = float(bytes_sum[i] / seconds[i] / 1e9)
            values["busbw_gbps"] = float(bus_sum[i] / seconds[i] / 1e9)
        out[r] = values
    return out


# Ranks whose exposed intervals are put together at once (a few hundred intervals a rank): every rank's at once
# took 850 MB of temporary arrays at 16,384 ranks. Each rank's intervals meet only its own, so the sums are the same.
EXPOSED_CHUNK = 2048


def _exposed_transfer(
    summaries: list[dict[str, Any]], transfer: Any, opt_transfer: Any, loop_transfer: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per rank (by position): whether its summary has ``exposed_comm``, the total exposed time, and the parts of
    it that ``transfer``, ``opt_transfer`` and ``loop_transfer`` (``intervals.union_by`` by position) cover, in
    µs; ``EXPOSED_CHUNK`` ranks at a time."""
    from ddpdoctor.metrics import intervals as iv

    n = len(summaries)
    has_exposed = np.zeros(n, dtype=bool)
    exposed_us, hidden_not, opt_exposed, loop_exposed = np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n)
    intervals = (list, np.ndarray)  # lists as a summary holds them, float64 arrays as load.kept keeps them
    for lo in range(0, n, EXPOSED_CHUNK):
        hi = min(n, lo + EXPOSED_CHUNK)
        e_start, e_end, e_grp = [np.zeros(0)], [np.zeros(0)], [np.zeros(0, dtype=np.int64)]
        for i in range(lo, hi):
            e = summaries[i].get("exposed_comm")
            if (
                isinstance(e, dict)
                and isinstance(e.get("start_us"), intervals)
                and isinstance(e.get("end_us"), intervals)
            ):
                has_exposed[i] = True
                e_start.append(np.asarray(e["start_us"], dtype=np.float64).reshape(-1))
                e_end.append(np.asarray(e["end_us"], dtype=np.float64).reshape(-1))
                e_grp.append(np.full(len(e_start[-1]), i, dtype=np.int64))
        exposed = iv.union_by(np.concatenate(e_start), np.concatenate(e_end), np.concatenate(e_grp))
        exposed_us[lo:hi] = iv.total_by(exposed, hi)[lo:hi]
        hidden_not[lo:hi] = iv.total_by(iv.intersect_by(_groups(transfer, lo, hi), exposed), hi)[lo:hi]
        opt_exposed[lo:hi] = iv.total_by(iv.intersect_by(_groups(opt_transfer, lo, hi), exposed), hi)[lo:hi]
        loop_exposed[lo:hi] = iv.total_by(iv.intersect_by(_groups(loop_transfer, lo, hi), exposed), hi)[lo:hi]
    return has_exposed, exposed_us, hidden_not, opt_exposed, loop_exposed


def _groups(ivs: Any, lo: int, hi: int) -> Any:
    """The intervals of groups ``lo`` to ``hi - 1`` of an ``intervals.union_by`` result (sorted by group)."""
    a, b = np.searchsorted(ivs[2], [lo, hi], side="left")
    return ivs[0][a:b], ivs[1][a:b], ivs[2][a:b]


def transfer_bandwidth(
    summaries: list[dict[str, Any]],
    colls: Table | None = None,
    transfer_us: np.ndarray | None = None,
    windows: Windows | None = None,
) -> Table:
    """Per rank and kind over the analysed steps: ``count``, ``bytes``, ``ms`` (the rank's wall time in that kind,
    concurrent collectives counted once: waiting included), ``algbw_gbps``/``busbw_gbps`` (bytes over the union
    of the transfer intervals, ``transfer_times``: None where no collective of the kind has one).
    ``colls``: ``all_collectives(summaries)`` when the caller has it."""
    from ddpdoctor.metrics import intervals as iv
    from ddpdoctor.metrics.comm import bus_factor

    out_columns = ["rank", "kind", "count", "bytes", "ms", "algbw_gbps", "busbw_gbps"]
    colls = all_collectives(summaries) if colls is None else colls
    if len(colls) == 0:
        return Table.from_records([], out_columns)
    t_all = transfer_times(summaries, colls) if transfer_us is None else transfer_us
    keep = in_analysed_steps(colls, summaries, windows) & (colls["kind"].codes >= 0)
    c = colls[keep]
    t = t_all[keep]
    if len(c) == 0:
        return Table.from_records([], out_columns)
    nbytes = c["bytes"]
    sized = ~np.isnan(nbytes) & (nbytes > 0) & ~np.isnan(t) & (t > 0)
    rank_order = _positions([s["rank"] for s in summaries], c["rank"])
    gid, n = group_ids(rank_order, c["rank"], c["kind"])
    # one row per group, in group order (sorted by the rank's position, rank, kind)
    first = np.full(n, len(c), dtype=np.int64)
    np.minimum.at(first, gid, np.arange(len(c)))
    count = np.bincount(gid, minlength=n)
    bytes_sum = pairwise_group_sum(np.where(np.isnan(nbytes), 0.0, nbytes), gid, n)
    bytes_seen = np.bincount(gid, weights=(~np.isnan(nbytes)).astype(np.float64), minlength=n)
    own = iv.total_by(iv.union_by(c["start_us"], c["end_us"], gid), n)
    moving = iv.total_by(iv.union_by((c["end_us"] - t)[sized], c["end_us"][sized], gid[sized]), n)
    sized_bytes = pandas_group_sum(np.where(sized, nbytes, 0.0), gid, n)
    sized_group = np.where(sized, c["group_size"], np.nan)
    group_max = np.full(n, -np.inf)
    ok = ~np.isnan(sized_group)
    np.maximum.at(group_max, gid[ok], sized_group[ok])
    group_max[np.isinf(group_max)] = np.nan
    world = {s["rank"]: int(s.get("world_size") or 1) for s in summaries}
    kinds = c["kind"]
    rows = []
    for g in range(n):
        i = int(first[g])
        r = int(c["rank"][i])
        kind = kinds.at(i)
        seconds = moving[g] / 1e6
        sg = group_max[g]
        size = int(sg) if sg == sg and sg > 0 else world[r]
        algbw = float(sized_bytes[g] / seconds / 1e9) if seconds > 0 else None
        rows.append(
            {
                "rank": r,
                "kind": kind,
                "count": int(count[g]),
                "bytes": float(bytes_sum[g]) if bytes_seen[g] >= 1 else None,
                "ms": float(own[g] / 1e3),
                "algbw_gbps": algbw,
                "busbw_gbps": algbw * bus_factor(str(kind), size) if algbw is not None else None,
            }
        )
    return Table.from_records(rows, out_columns)


def _positions(ranks: list[int], rank: np.ndarray) -> np.ndarray:
    """Per row's ``rank``: the position of that rank in ``ranks`` (the last where it is there twice, as a dict
    made of them says), -1 where it is not there."""
    listed = np.asarray(ranks, dtype=np.int64).reshape(len(ranks))
    order = np.argsort(listed, kind="stable")
    ordered = listed[order]
    at = np.searchsorted(ordered, rank, side="right") - 1
    clipped = np.maximum(at, 0)
    found = (at >= 0) & (ordered[clipped] == rank) if len(ordered) else np.zeros(len(rank), dtype=bool)
    return np.where(found, order[clipped], -1).astype(np.int64) if len(ordered) else np.full(len(rank), -1)
