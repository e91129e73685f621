"""The decision over all ranks' dumps: who is the cause, who waits for them, and in what (``HealthVerdict``).

Pure functions over ``FlightDump``s (``ddpdoctor.flight.read``) and, when known, the manifest's per-rank status.
The vocabulary is torch's own analyzer's (``torch.distributed.flight_recorder``): a collective type / size / dtype
mismatch, "not all ranks joining collective N". torch's analyzer itself is not called: it unpickles its input with
plain ``pickle`` (ddpdoctor never runs code from an input file), older versions reject gloo's ``gloo:`` names, it
prints rather than returns, and it has no notion of where a rank that never joined was instead (its own code, an
exception, an early return), which is what a user needs to know first.

How it decides, per process group (the FR's ``pg_status``: last enqueued / completed sequence id per rank):

1. A rank that raised an exception of its own (not a peer's death or a timeout: those are consequences), or died
   without a dump while the others did not stop it, is a **crash** culprit; the ranks that failed or wait because
   of it are consequences.
2. Otherwise, when some ranks wait inside collective N of a group and others never issued N: those others are the
   culprits. Where they are decides the kind: in their own code ("outside" any collective) -> **hang**; returned
   from ``main`` -> **desync** (a rank skipped collectives: a "missing" mismatch); in another group's collective ->
   the group they wait in is followed.
3. When every rank issued N but with a different op / size / dtype -> **desync**, both sides named.
4. A picture that only shows ordinary skew (a rank one collective behind, for less than the hang timeout, in a dump
   nobody asked for because of a hang) is **ok**: a false hang is worse than a missed one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ddpdoctor.flight import frames as fr
from ddpdoctor.flight import rank_view as rv
from ddpdoctor.flight import words
from ddpdoctor.flight.rank_view import is_consequence
from ddpdoctor.flight.verdict import (
    CONSEQUENCE,
    CRASHED,
    EXITED,
    IN_COLLECTIVE,
    NO_DUMP,
    OUTSIDE,
    CollectiveRef,
    HealthVerdict,
    Mismatch,
    RankState,
    describe_shape,
    frame_text,
)
from ddpdoctor.runfile_types import FlightDump, FlightEntry

__all__ = ["DEFAULT_HANG_AFTER_S", "analyze", "is_consequence"]  # is_consequence: rank_view's, kept here

# Without a hang request, a rank waiting this long in a collective that another rank never issued is a hang (the
# default hang timeout's floor); shorter is skew.
DEFAULT_HANG_AFTER_S = 300.0


# --- the decision ----------------------------------------------------------------------------------------------


def analyze(
    dumps: Mapping[int, FlightDump],
    *,
    world_size: int | None,
    rank_status: Mapping[int, Mapping[str, Any]] | None = None,
    hang_after_s: float | None = None,
) -> HealthVerdict:
    """The verdict over the ranks' dumps (rank -> FlightDump). ``world_size``: the job's (None: from the dumps);
    ``rank_status``: manifest.json's per-rank ``{status, exit_code, reason}`` where known. ``hang_after_s``: how long a
    wait must last to be a hang when no dump answers a hang request (default ``DEFAULT_HANG_AFTER_S``)."""
    return _Analysis(dumps, world_size, rank_status or {}, hang_after_s).run()


class _Analysis:
    def __init__(
        self,
        dumps: Mapping[int, FlightDump],
        world_size: int | None,
        rank_status: Mapping[int, Mapping[str, Any]],
        hang_after_s: float | None,
    ) -> None:
        world = world_size or max(
            [d.world_size for d in dumps.values()] + [r + 1 for r in dumps] + [r + 1 for r in rank_status] + [1]
        )
        self.world = world
        self.views = {r: rv.rank_view(r, dumps.get(r), rank_status.get(r) or {}) for r in range(world)}
        for r in dumps:
            if r not in self.views:  # a rank beyond the given world size: still read
                self.views[r] = rv.rank_view(r, dumps[r], rank_status.get(r) or {})
        self.evidence: list[str] = []
        self.notes: list[str] = []
        self.hang_after_s = DEFAULT_HANG_AFTER_S if hang_after_s is None else hang_after_s
        self.requested_hang = any(d.reason == "hang" for d in dumps.values()) or any(
            (s or {}).get("status") == "hung" for s in rank_status.values()
        )
        self.states: dict[int, RankState] = {}
        self.weak: set[int] = set()  # crashed ranks known only as "died" (no exception, no exit code)

    # the verdict -----------------------------------------------------------------------------------------------------

    def run(self) -> HealthVerdict:
        for r, view in sorted(self.views.items()):
            self.states[r] = rv.rank_state(view, self.weak)
        missing = [r for r, s in self.states.items() if s.state == NO_DUMP]
        if missing:
            self.notes.append(
                f"no dump from {words.who(missing)}: what {words.pronoun(missing)} was doing is not known"
            )
        no_fr = [r for r, v in self.views.items() if v.dump is not None and not v.dump.flight_recorder]
        if no_fr:
            why = next((v.dump.fr_error for v in self.views.values() if v.dump is not None and v.dump.fr_error), None)
            self.notes.append(
                f"no Flight Recorder buffer in the dump of {words.who(no_fr)}" + (f": {why}" if why else "")
            )
        if any(g.backend == "gloo" for v in self.views.values() for g in v.groups.values()):
            self.notes.append("gloo records no start/end times: waits are measured from when a collective was issued")
        if any(v.dump is not None and v.dump.reason == "torch" for v in self.views.values()):
            self.notes.append(
                "torch's own dump files hold no time, step or stacks: the file's modification time is taken as the "
                "dump's, and where a rank that never joined was instead is not known"
            )
        mismatches = self._mismatches()
        verdict = self._crash() or self._stuck(mismatches) or self._desync(mismatches) or self._ok()
        if verdict.kind == "hang" and self._all_ended_well():
            # The ranks dumped at a stall, then went on and ended well: a slow step (a checkpoint or an evaluation
            # on one rank while the others waited), not a hang. Where they were stays in the evidence.
            self.notes.append(
                f"the ranks dumped at a stall ({verdict.summary}), then went on and every rank ended well: a slow "
                "step, not a hang"
            )
            return self._verdict("ok", [], [], None, [], "every rank ended well after the stall its dumps show")
        return verdict

    def _all_ended_well(self) -> bool:
        """Every rank of the job is known to have ended with status ok and exit code 0 (manifest.json)."""
        statuses = [v.status for v in self.views.values()]
        return bool(statuses) and all(st.get("status") == "ok" and st.get("exit_code") in (0, None) for st in statuses)

    def _verdict(
        self,
        kind: str,
        culprits: list[int],
        waiting: list[int],
        collective: CollectiveRef | None,
        mismatches: list[Mismatch],
        summary: str,
    ) -> HealthVerdict:
        return HealthVerdict(
            kind,
            tuple(sorted(culprits)),
            tuple(sorted(r for r in waiting if r not in culprits)),
            collective,
            tuple(mismatches),
            dict(self.states),
            summary,
            tuple(self.evidence),
            tuple(self.notes),
        )

    def _aborted_in_collective(self, crashed: list[int]) -> HealthVerdict | None:
        """A rank that gloo aborted (a fatal signal while its main thread was inside a collective) while its peers
        lost it in a collective: gloo aborts a process whose collective receives more data than its own tensor holds,
        so this is a mismatch of the collective the ranks were in, not a crash of the rank's own code. The aborted
        rank could not dump: its side is the collective its stack shows, its size is not recorded."""
        aborted = {}
        for r in crashed:
            d = self.views[r].dump
            if d is None or d.reason != "fatal" or d.exception is None:
                continue
            op = fr.dist_op(self.views[r].main_frames)
            if op is not None:
                aborted[r] = (op, d.exception.type)
        if not aborted or len(aborted) != len(crashed):
            return None
        peers = [
            r
            for r, s in self.states.items()
            if r not in aborted and s.state in (CONSEQUENCE, IN_COLLECTIVE) and s.collective is not None
        ]
        if not peers:
            return None
        ref = self.states[peers[0]].collective
        assert ref is not None
        if ref.backend and ref.backend != "gloo":
            return None
        kind = "size" if all(op == ref.op for op, _sig in aborted.values()) else "op"
        by_rank: dict[int, str] = {}
        sides = []
        for r, (op, sig) in sorted(aborted.items()):
            by_rank[r] = f"{op} (aborted by gloo with {sig} before it could dump: its size is not recorded)"
            where = self.states[r].frames
            at = f" at {frame_text(where[0])}" if where else ""
            sides.append(f"rank {r}: {by_rank[r]}{at}")
        for r in peers:
            s = self.states[r]
            c = s.collective
            assert c is not None
            issued = f"{c.op} {describe_shape(c.sizes, c.dtypes)}".strip()
            by_rank[r] = issued
            frame = c.frame or (s.frames[0] if s.frames else None)
            at = f" at {frame_text(frame)}" if frame is not None else ""
            lost = "then lost its peer" if s.state == CONSEQUENCE else "waits in it"
            sides.append(f"rank {r}: {issued}{at}, {lost}")
        word = {"size": "size", "op": "collective type"}[kind]
        summary = (
            f"{word} mismatch at {ref.op} #{ref.seq_id} ({ref.pg}): "
            + "; ".join(sides)
            + " (gloo aborts a rank whose collective receives more data than its own tensor holds)"
        )
        self.evidence.append(summary)
        for r, (op, sig) in sorted(aborted.items()):
            self.evidence.append(f"rank {r} ended by {sig} inside {op} (its stack at the signal: faulthandler)")
        mismatch = Mismatch(ref.pg, ref.seq_id, kind, dict(sorted(by_rank.items())))
        return self._verdict("desync", sorted(by_rank), [], ref, [mismatch], summary)

    def _crash(self) -> HealthVerdict | None:
        crashed = [r for r, s in self.states.items() if s.state == CRASHED]
        strong = [r for r in crashed if r not in self.weak]
        if strong:
            aborted = self._aborted_in_collective(strong)
            if aborted is not None:
                return aborted
            culprits = strong
        elif crashed and any(s.state in (CONSEQUENCE, IN_COLLECTIVE, OUTSIDE) for s in self.states.values()):
            culprits = crashed  # died without a word while the others lost it or wait for it
        else:
            if crashed:
                self.notes.append(f"{words.who(crashed)} ended without finishing; how is not recorded")
            return None
        others = [
            r
            for r, s in self.states.items()
            if r not in culprits and (s.state in (CONSEQUENCE, IN_COLLECTIVE) or r in self.weak)
        ]
        parts = []
        for r in culprits:
            s = self.states[r]
            if self.views[r].dump is None:
                self.evidence.append(f"rank {r} ended without a dump: {words.short(s.exception)} (its exit status)")
            else:
                self.evidence.append(f"rank {r} raised {words.short(s.exception)}{words.where(s)}{words.at_step(s)}")
            parts.append(f"rank {r} crashed{words.at_step(s)}: {words.short(s.exception)}{words.where(s)}")
        for r in others:
            s = self.states[r]
            if s.state == CONSEQUENCE:
                self.evidence.append(
                    f"rank {r} failed because of its peer"
                    + (f" in {s.collective.describe()}" if s.collective else "")
                    + f": {words.short(s.exception)}"
                )
            elif s.state == IN_COLLECTIVE:
                self.evidence.append(f"rank {r} waits in {words.collective(s)}")
            else:
                self.evidence.append(f"rank {r} ended without finishing (stopped after the crash)")
        summary = "; ".join(parts)
        collective = next((self.states[r].collective for r in others if self.states[r].collective), None)
        if others:
            summary += f"; {words.who(others)} failed or waited as a consequence"
            if collective is not None:
                summary += f" (in {collective.describe()})"
        return self._verdict("crash", culprits, others, collective, [], summary)

    def _groups(self) -> dict[str, dict[int, rv.Group]]:
        out: dict[str, dict[int, rv.Group]] = {}
        for r, view in self.views.items():
            for name, group in view.groups.items():
                out.setdefault(name, {})[r] = group
        return out

    def _members_of(self, name: str, by_rank: Mapping[int, rv.Group]) -> list[int]:
        for group in by_rank.values():
            if group.members:
                return [r for r in group.members if r in self.views]
        if name in ("0", "default_pg") or any(g.label == "default_pg" for g in by_rank.values()):
            return sorted(self.views)
        return sorted(by_rank)

    def _mismatches(self) -> list[Mismatch]:
        """The first collective of each group where the ranks that recorded it issued different things."""
        found = []
        for by_rank in self._groups().values():
            have = {r: g for r, g in by_rank.items() if g.entries}
            if len(have) < 2:
                continue
            common = set.intersection(*(set(g.entries) for g in have.values()))
            label = next(iter(have.values())).label
            for seq in sorted(common):
                ops = {r: rv.op_of(g.entries[seq].profiling_name)[0] for r, g in have.items()}
                kind = None
                if len(set(ops.values())) > 1:
                    kind = "op"
                elif next(iter(ops.values())) not in _SIZES_MAY_DIFFER:
                    # elements per tensor: a different shape of as many elements is no mismatch (the bytes agree)
                    if len({_numels(g.entries[seq]) for g in have.values()}) > 1:
                        kind = "size"
                    elif len({tuple(g.entries[seq].input_dtypes) for g in have.values()}) > 1:
                        kind = "dtype"
                if kind is not None:
                    found.append(Mismatch(label, seq, kind, {r: rv.issued(g, seq) for r, g in sorted(have.items())}))
                    break
        return found

    def _stalled(self, waits: list[float], ref: CollectiveRef, by_rank: Mapping[int, rv.Group]) -> bool:
        """A hang request, or a wait past the hang threshold or the collective's own timeout."""
        if self.requested_hang:
            return True
        longest = max(waits) if waits else None
        if longest is None:
            return False
        timeouts = [
            g.entries[ref.seq_id].timeout_ms
            for g in by_rank.values()
            if ref.seq_id in g.entries and g.entries[ref.seq_id].timeout_ms
        ]
        limit = min([self.hang_after_s] + [t / 1000 for t in timeouts if t])
        return longest >= limit

    def _stuck(self, mismatches: list[Mismatch]) -> HealthVerdict | None:
        """Ranks wait in collective N of a group that others never issued: those others are the cause."""
        candidates = []
        for name, by_rank in self._groups().items():
            members = self._members_of(name, by_rank)
            front = max((g.last_enqueued for g in by_rank.values()), default=-1)
            waiting = [
                r
                for r, g in by_rank.items()
                if g.pending is not None
                and g.last_enqueued == front
                and self.states[r].state in (IN_COLLECTIVE, OUTSIDE, CONSEQUENCE)
            ]
            if not waiting:
                continue
            behind = []
            for r in members:
                g = by_rank.get(r)
                if g is not None and g.last_enqueued >= front:
                    continue
                if g is not None and g.pending is not None:
                    continue  # still finishing an earlier collective of this group: progress, not a cause
                behind.append(r)
            known = [r for r in behind if self.states[r].state != NO_DUMP]
            if not known and not (behind and self.requested_hang):
                continue  # only ranks without a dump: nothing shows they never issued it, unless a hang was seen
            group = by_rank[waiting[0]]
            issued = [by_rank[r].last_enqueued for r in behind if r in by_rank]
            seq = min(issued) + 1 if issued else (group.pending if group.pending is not None else front)
            seq = min(max(seq, group.last_completed + 1), front)
            candidates.append(
                (len(known), len(waiting), name, waiting, known or behind, rv.collective_ref(group, seq), by_rank)
            )
        if not candidates:
            return None
        candidates.sort(key=lambda c: (c[0], c[1]), reverse=True)
        _, _, _name, waiting, behind, ref, by_rank = candidates[0]
        waits = [w for w in (rv.waited_s(self.views[r], ref) for r in waiting) if w is not None]
        longest = max(waits) if waits else None
        if not self._stalled(waits, ref, by_rank):
            lag = ", ".join(
                f"rank {r} {by_rank[r].last_enqueued}" if r in by_rank else f"rank {r} none" for r in behind
            )
            self.notes.append(
                f"at the dump {words.who(waiting)} had issued {ref.describe()} and the others had not"
                f" (last issued: {lag})"
                + (f", for {longest:.1f} s" if longest is not None else "")
                + f": ordinary skew, not a hang (a hang is a wait of {self.hang_after_s:g} s, or a hang request)"
            )
            return None
        states = {r: self.states[r] for r in behind}
        exited = [r for r, s in states.items() if s.state == EXITED]
        outside = [r for r, s in states.items() if s.state == OUTSIDE]
        elsewhere = [r for r, s in states.items() if s.state == IN_COLLECTIVE]
        unknown = [r for r in behind if r not in outside + exited + elsewhere]
        for r in waiting:
            w = rv.waited_s(self.views[r], ref)
            self.evidence.append(
                f"rank {r} issued {ref.describe()}"
                + (f" {w:.0f} s before its dump" if w is not None else "")
                + " and waits in it"
            )
        for r in behind:
            last = by_rank[r].last_enqueued if r in by_rank else -1
            done = f"its last collective there was #{last}" if last >= 0 else "it issued none there"
            self.evidence.append(
                f"rank {r} never issued {ref.op} #{ref.seq_id} ({ref.pg}): {done}; {words.doing(states[r])}"
            )
        self.evidence.append(
            f"not all ranks joining collective {ref.seq_id} ({ref.pg}): {words.who(behind)} never joined"
        )
        lead = []
        for r in outside:
            s = states[r]
            if s.frames:
                lead.append(
                    f"rank {r} is stuck in {words.frames_short(s)}{words.at_step(s)}, outside any collective"
                    + (f" for {s.since_s:.0f} s" if s.since_s is not None else "")
                )
            else:
                lead.append(f"rank {r} never joined {ref.op} #{ref.seq_id}{words.at_step(s)} and is in no collective")
        for r in exited:
            s = states[r]
            lead.append(f"rank {r} returned from main{words.after(s)} without issuing {ref.op} #{ref.seq_id}")
        for r in elsewhere:
            lead.append(f"rank {r} waits in another collective, {words.collective(states[r])}")
        if unknown:
            lead.append(f"{words.who(unknown)} never joined it ({', '.join(words.doing(states[r]) for r in unknown)})")
        wait = f" for {longest:.0f} s" if longest is not None else ""
        summary = (
            "; ".join(lead) + f"; {words.who(waiting)} {words.verb(waiting, 'waits', 'wait')} in {ref.describe()}{wait}"
        )
        if ref.frame is not None:
            summary += f", issued at {frame_text(ref.frame)}"
        found = list(mismatches)
        if exited and not outside and not elsewhere:
            kind = "desync"
            by = {r: rv.issued(by_rank[r], ref.seq_id) for r in waiting if ref.seq_id in by_rank[r].entries}
            by.update({r: "nothing (returned from main)" for r in exited})
            found.append(Mismatch(ref.pg, ref.seq_id, "missing", dict(sorted(by.items()))))
        else:
            kind = "hang"
        silent = [r for r in behind if states[r].state == NO_DUMP]
        if silent:
            self.notes.append(
                f"{words.who(silent)} left no dump: a rank blocked in native code that holds the GIL, or gone, cannot "
                "answer; it is named because it alone is not seen in the collective"
            )
        return self._verdict(kind, behind, waiting, ref, found, summary)

    def _desync(self, mismatches: list[Mismatch]) -> HealthVerdict | None:
        if not mismatches:
            return None
        m = mismatches[0]
        word = {"op": "collective type", "size": "size", "dtype": "dtype"}.get(m.kind, m.kind)
        where = {}
        ref = None
        for r in sorted(m.by_rank):
            for g in self.views[r].groups.values():
                if g.label == m.pg and m.seq_id in g.entries:
                    ref = ref or rv.collective_ref(g, m.seq_id)
                    f = fr.innermost_user_frame(g.entries[m.seq_id].frames)
                    if f is not None:
                        where[r] = f" at {frame_text(f)}"
        sides = "; ".join(f"rank {r}: {what}{where.get(r, '')}" for r, what in sorted(m.by_rank.items()))
        summary = f"{word} mismatch at collective #{m.seq_id} ({m.pg}): {sides}"
        self.evidence.append(summary)
        for extra in mismatches[1:]:
            self.evidence.append(
                f"also a {extra.kind} mismatch at collective #{extra.seq_id} ({extra.pg}): "
                + "; ".join(f"rank {r}: {w}" for r, w in sorted(extra.by_rank.items()))
            )
        # Every rank issued something there: no rank alone is the cause; all of them are named.
        waiting = [r for r, s in self.states.items() if s.state in (IN_COLLECTIVE, CONSEQUENCE)]
        return self._verdict("desync", sorted(m.by_rank), waiting, ref, mismatches, summary)

    def _ok(self) -> HealthVerdict:
        have = [r for r, s in self.states.items() if s.state != NO_DUMP]
        if not have:
            return self._verdict("undecided", [], [], None, [], "no rank left a dump")
        waiting = [r for r, s in self.states.items() if s.state == IN_COLLECTIVE]
        consequence = [r for r, s in self.states.items() if s.state == CONSEQUENCE]
        exited = [r for r, s in self.states.items() if s.state == EXITED]
        if consequence and exited:
            # a rank that returned from main (its process ended) while its peers were still in a collective: they
            # lose their peer; it skipped the collectives they wait in
            collective = next((self.states[r].collective for r in consequence if self.states[r].collective), None)
            for r in exited:
                self.evidence.append(f"rank {r} returned from main and ended{words.exit_of(self.views[r].status)}")
            for r in consequence:
                c = self.states[r].collective
                self.evidence.append(
                    f"rank {r} lost its peer"
                    + (f" in {c.describe()}" if c else "")
                    + f": {words.short(self.states[r].exception)}"
                )
            what = f"{collective.op} #{collective.seq_id}" if collective else "the collectives its peers issued"
            summary = (
                f"{words.who(exited)} returned from main without issuing {what}; {words.who(consequence)} failed as a "
                "consequence" + (f" in {collective.describe()}" if collective else "")
            )
            # where it was issued: the FR entry's frames, else the waiting rank's own traceback (a fast dump has none)
            frame = collective.frame if collective is not None else None
            if frame is None:
                frame = next((self.states[r].frames[0] for r in consequence if self.states[r].frames), None)
            if frame is not None:
                summary += f", issued at {frame_text(frame)}"
            for r in exited:
                last = max((g.last_enqueued for g in self.views[r].groups.values()), default=-1)
                if self.views[r].dump is not None and last >= 0:
                    self.evidence.append(f"rank {r}'s last collective before it returned was #{last} (its exit dump)")
            found = []
            if collective is not None:
                by = {
                    r: f"{collective.op} {describe_shape(collective.sizes, collective.dtypes)}".strip()
                    for r in consequence
                }
                by.update({r: "nothing (returned from main)" for r in exited})
                found.append(Mismatch(collective.pg, collective.seq_id, "missing", dict(sorted(by.items()))))
            return self._verdict("desync", exited, consequence, collective, found, summary)
        if consequence:
            silent = [r for r, s in self.states.items() if s.state == NO_DUMP and not self.views[r].status]
            if silent and len(silent) + len(consequence) == len(self.states):
                # every rank that dumped lost its peer; the ones that did not dump are the peers that went
                collective = next((self.states[r].collective for r in consequence if self.states[r].collective), None)
                for r in consequence:
                    c = self.states[r].collective
                    self.evidence.append(
                        f"rank {r} failed because of its peer"
                        + (f" in {c.describe()}" if c else "")
                        + f": {words.short(self.states[r].exception)}"
                    )
                self.notes.append(
                    f"{words.who(silent)} left no dump and no exit status: named because every other rank lost its peer"
                )
                summary = (
                    f"{words.who(silent)} died without a dump (no exception recorded); {words.who(consequence)} failed"
                    " as a consequence" + (f" in {collective.describe()}" if collective else "")
                )
                return self._verdict("crash", silent, consequence, collective, [], summary)
            summary = f"{words.who(consequence)} failed because of a peer, and no dump shows which peer or why"
            return self._verdict("undecided", [], consequence, None, [], summary)
        outside = [r for r in have if self.states[r].state == OUTSIDE]
        if self.requested_hang and not waiting and outside and all(self.states[r].frames for r in outside):
            # no step for the hang timeout, and no rank inside a collective: they are all stuck in their own code
            parts = []
            for r in outside:
                st = self.states[r]
                since = f" for {st.since_s:.0f} s" if st.since_s is not None else ""
                parts.append(f"rank {r} in {words.frames_short(st)}{words.at_step(st)}{since}")
                self.evidence.append(f"rank {r} is in no collective: {words.doing(st)}{since}")
            summary = "no rank is inside a collective; " + "; ".join(parts)
            return self._verdict("hang", outside, [], None, [], summary)
        if self.requested_hang:
            collective = self.states[waiting[0]].collective if waiting else None
            if waiting and len(waiting) == len(self.states):
                summary = (
                    f"every rank waits in {words.collective(self.states[waiting[0]])}, which they all issued alike:"
                    " the cause is not in the dumps (the network, or a process group whose collectives were not"
                    " recorded)"
                )
            else:
                summary = "a hang was reported, but the dumps do not show which rank holds the others up"
            return self._verdict("undecided", [], waiting, collective, [], summary)
        fronts: dict[str, list[int]] = {}
        for r in self.states:
            for g in self.views[r].groups.values():
                fronts.setdefault(g.label, []).append(g.last_enqueued)
        where = ", ".join(f"{pg} at #{max(v)}" for pg, v in fronts.items())
        summary = f"{len(have)} of {len(self.states)} ranks dumped: no hang, desync or crash" + (
            f" ({where})" if where else ""
        )
        return self._verdict("ok", [], [], None, [], summary)


_SIZES_MAY_DIFFER = frozenset(
    {
        "gather",
        "scatter",
        "alltoall",
        "alltoall_base",
        "all_to_all",
        "all_to_allv",
        "allgather_into_tensor_coalesced",
        "reduce_scatter_tensor_coalesced",
        "allgather_coalesced",
        "gather_object",
        "scatter_object_list",
        "send",
        "recv",
        "recv_any_source",
        "_allgather_base",
        "_reduce_scatter_base",
        "allgather",
        "all_gather",
    }
)


def _numels(entry: FlightEntry) -> tuple[int, ...]:
    out = []
    for shape in entry.input_sizes:
        n = 1
        for d in shape:
            n *= d
        out.append(n)
    return tuple(out)
