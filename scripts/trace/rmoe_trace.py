"""Reading a relaymoe trace: what `relaymoe run --trace DIR` leaves in DIR.

DIR holds StarPU's conversion of every rank's FxT file (tasks.rec: one record
per task with its name, rank, worker, start and end; paje.trace: among others
one link per StarPU-MPI transfer with its sender, receiver, size and MPI tag)
and relaymoe-trace.txt (ranks, ring order, first tag of the context).

Tasks carry the method's names, "op hN" for the ops of ring hop N. A
transfer carries only its tag; its pass and hop come from the tag layout of
graph/: every pass (one forward or backward of one layer) reserves a block
of TAG_BLOCK(N) = 10N+8 consecutive tags, RMOE_PASS_TAGS(N) of
graph/pass/rmoe_pass.h (the pipelined all-to-all, whole blocks: several when its
chunks need more; graph/forward_backward.c), and each dispatcher numbers its
transfers inside the block:

  expert ring (graph/dispatch/ring_expert.c)  forward:  h           weights sent during hop h
                                     backward: h           weights sent during hop h
                                               N+1+h       gradient accumulator sent after hop h
                                               2N          finished gradient back to its owner
  token ring (graph/dispatch/ring_token.c)    0                     expert counts (every pair of ranks)
                                     1+6h+k                kind k sent during hop h
                                     1+6N+k                accumulator k back to its owner
  both rings (graph/pass/flow.c)          8N+8+kN+h             credit k for the slot of hop h

A striped ring's pass (graph/pass/stripes.c) takes STRIPE_LEGS blocks: the
first as above (piece 0 goes straight to the right neighbour), then one per
leg of the other pieces at the same offset: 1 the sender to its out relay,
2 the out relay across the network to the in relay, 3 the in relay to the
receiver, 4 and 5 the relays' credits upstream (from the out relay to the
sender, from the in relay to the out relay). A block is a leg of the pass
before it when its transfers fall within that pass's time (the next layer
call's block starts after the pass has ended).
  a2a-megatron (graph/dispatch/alltoall_megatron.c)  0 counts, 1 dispatch, 2 combine, 3 dout, 4 dx, ...
  a2a (graph/dispatch/alltoall_plan.c)        0 counts, then 1+k*C+j for chunk j of kind k

StarPU 1.3 records tags in 32 bits, so the offset is taken modulo 2^32 from
the low 32 bits of tag_first. Which dispatcher and direction a block belongs
to is read from the names of the tasks running at the same time. The test
tests/trace/ checks this decoding against a real run, so a change of the tag
layout in graph/ shows up there.

A transfer is timed by its own two events, the ends of its StarPU-MPI
link: the sender's isend submission (the link's start, on the sender's
clock) and the receiver's request completion, when the data is available
there (the link's end, on the receiver's clock); never by the tasks around
it. A link without its end, a transfer the tag layout expects that has no
link, and one that still ends before it starts once the clocks are aligned
are flagged and left out of every sum, never counted as 0 ms.

Times are milliseconds on StarPU's merged time line (ranks aligned on
StarPU-MPI's start-up barrier, then shifted so that every link ends after
it starts, see Trace._align_clocks). Python 3 standard library only.
"""

import os
import re

HOP_NAME = re.compile(r"^(?P<op>.+) h(?P<hop>\d+)$")
TOKEN_KINDS = ["tokens", "dy", "pair-order", "topk-weights", "acc", "dg-acc"]
# graph/dispatch/alltoall_plan.c's tags; dy, g and dg: the lean backward's
CREDIT_KINDS = 2
A2A_PHASES = ["counts", "dispatch", "combine", "dout", "dx", "dy", "g", "dg"]
# RMOE_STRIPE_LEGS of graph/pass/rmoe_pass.h, and what each leg carries.
STRIPE_LEGS = 6
LEG_NAMES = [None, "to-relay", "across", "from-relay", "relay-credit", "relay-credit"]
TAG_FIELD = re.compile(r"^\s*(-?\d+)\s*$|\(tag (-?\d+)\)")


def tag_block(nranks):
    """RMOE_PASS_TAGS(N) of graph/pass/rmoe_pass.h: 8N+8 data tags, then the
    rings' credits, RMOE_CREDIT_KINDS (2) x N."""
    return 8 * nranks + 8 + CREDIT_KINDS * nranks


def expected_transfers(kind, backward, n):
    """(what, hop) each rank receives in one pass."""
    if kind == "ring":
        out = [("weights", h) for h in range(n - 1)]
        if backward:
            out += [("grad", h) for h in range(n - 1)] + [("grad-return", n - 1)]
        return out
    inputs = ["tokens", "pair-order", "topk-weights"] + (["dy"] if backward else [])
    accs = ["dx-acc", "dg-acc"] if backward else ["y-acc"]
    out = [(k, h) for k in inputs for h in range(n - 1)]
    out += [(k, h) for k in accs for h in range(n - 1)] + [(k + "-return", n - 1) for k in accs]
    return out


def float_slack(t):
    """StarPU 1.3 stores link dates as C floats (24-bit mantissa): two events
    at the same instant may differ by this much in paje.trace."""
    return max(1e-6, 2.5e-7 * abs(t))


class Task:
    __slots__ = ("rank", "worker", "name", "op", "hop", "start", "end", "pass_index")

    def __init__(self, rank, worker, name, start, end):
        self.rank, self.worker, self.name = rank, worker, name
        self.start, self.end = start, end
        m = HOP_NAME.match(name)
        self.op = m.group("op") if m else name
        self.hop = int(m.group("hop")) if m else None
        self.pass_index = None


class Transfer:
    """One StarPU-MPI link: start is the sender's isend submission, end the
    receiver's completion of the request (None when paje.trace has no end
    for it)."""
    __slots__ = ("src", "dst", "start", "end", "size", "tag", "offset", "block", "pass_index", "what",
                 "hop", "paje_start", "leg")

    def __init__(self, src, dst, start, end, size, tag):
        self.src, self.dst, self.start, self.end, self.size, self.tag = src, dst, start, end, size, tag
        self.paje_start = start   # as written in paje.trace, before any clock shift
        self.offset = self.block = self.pass_index = self.hop = None
        self.leg = 0              # a striped pass's leg (STRIPE_LEGS); 0: the pass's first block
        self.what = "transfer"

    @property
    def problem(self):
        """Why the transfer cannot be timed, or None."""
        if self.end is None:
            return "no end event"
        if self.end < self.start - float_slack(self.start):
            return "ends before it starts"
        return None

    @property
    def duration(self):
        """end - start, from the transfer's own events; None when they are
        missing or out of order (problem says which). Within the float
        precision of paje.trace's link dates, an end before the start is 0."""
        if self.problem:
            return None
        return max(0.0, self.end - self.start)

    @property
    def label(self):
        return self.what if self.hop is None else "%s h%d" % (self.what, self.hop)


class Pass:
    """One forward or backward of one layer, as its hop tasks show it."""

    def __init__(self, index):
        self.index = index
        self.start = float("inf")
        self.end = float("-inf")
        self.ops = set()
        self.kind = "?"           # "ring", "token", "a2a"
        self.backward = False
        self.blocks = []

    @property
    def label(self):
        return "%s %s" % (self.kind, "bwd" if self.backward else "fwd")


class Trace:
    def __init__(self, directory):
        self.dir = directory
        self.nranks, self.ring, self.tag_first = read_layout(directory)
        self.tasks = read_tasks(os.path.join(directory, "tasks.rec"))
        self.transfers, self.open_links = read_links(os.path.join(directory, "paje.trace"))
        # A rank's messages to itself are the context's measurement of
        # StarPU-MPI's request structures when it starts (graph/pass/transfers.c,
        # rmoe_requests_measure), on the first tags of its window: no layer
        # sends to its own rank, and decoded they would read as a pass's.
        self.transfers = [x for x in self.transfers if x.src != x.dst]
        if self.nranks is None:
            self.nranks = 1 + max([t.rank for t in self.tasks] + [x.dst for x in self.transfers] + [0])
        self.clock_shift = self._align_clocks()
        self.passes = []
        self._find_passes()
        self._decode_transfers()

    # StarPU aligns the ranks' clocks on one barrier at start-up; a rank
    # held up there (e.g. calibrating the bus) comes out shifted by as much.
    # The transfers bound the shifts: a message ends after it starts, so the
    # links src -> dst, with dates s on src's clock and e on dst's, ask
    # shift[src] - shift[dst] <= w(src, dst), the least e - s among them.
    # These difference constraints are taken from every link at once (a
    # ring's links go one way round: aligning pairs one by one along a
    # spanning tree left the pair that closes the ring out of order). When
    # the barrier's alignment already satisfies them, nothing moves.
    # Otherwise one-way links bound the shifts from one side only, so the
    # slack around each cycle of links is shared: the shifts make the
    # fastest transfer of every pair on a cycle as long as the others (the
    # largest d for which shift[src] - shift[dst] <= w - d is feasible, by
    # bisection over Bellman-Ford), rather than squeezing one pair's to 0.
    # Links that no shift can order (d < 0) end before they start: they are
    # flagged, not timed.
    def _align_clocks(self):
        bound = {}
        for x in self.transfers:
            if x.src != x.dst and 0 <= x.src < self.nranks and 0 <= x.dst < self.nranks:
                bound[(x.src, x.dst)] = min(bound.get((x.src, x.dst), float("inf")), x.end - x.start)
        if not bound or min(bound.values()) >= 0.0:
            return {}
        # Only links on a cycle bound the shared slack: those within one
        # strongly connected component of the graph of linked pairs.
        reach = {(a, b) for (a, b) in bound}
        for k in range(self.nranks):
            reach |= {(a, b) for (a, kk) in reach if kk == k for (k2, b) in reach if k2 == k}
        on_cycle = {pair for pair in bound if (pair[1], pair[0]) in reach}
        lo, hi = min(0.0, min(bound.values())), max(bound.values())   # lo is feasible: shifts all 0
        if on_cycle:
            for _ in range(60):
                mid = (lo + hi) / 2
                if feasible_shifts(self.nranks, bound, mid, on_cycle) is None:
                    hi = mid
                else:
                    lo = mid
        shift = feasible_shifts(self.nranks, bound, lo if on_cycle else 0.0, on_cycle)
        if shift is None:
            shift = feasible_shifts(self.nranks, bound, lo, set(bound))
        shift = [v - shift[0] for v in shift]
        if all(abs(v) < 1e-9 for v in shift):
            return {}
        for t in self.tasks:
            t.start += shift[t.rank] if t.rank < self.nranks else 0.0
            t.end += shift[t.rank] if t.rank < self.nranks else 0.0
        for x in self.transfers + self.open_links:
            x.start += shift[x.src] if 0 <= x.src < self.nranks else 0.0
            if x.end is not None:
                x.end += shift[x.dst] if 0 <= x.dst < self.nranks else 0.0
        self.transfers.sort(key=lambda x: x.start)
        return {r: v for r, v in enumerate(shift) if abs(v) >= 1e-9}

    # A pass, on one rank, is the run of hop tasks from a hop-0 task that
    # follows the last hop to the next such one: passes never overlap
    # (every layer call waits for its graph).
    def _find_passes(self):
        n = self.nranks
        per_rank = {}
        for t in sorted((t for t in self.tasks if t.hop is not None), key=lambda t: t.start):
            segs = per_rank.setdefault(t.rank, [])
            if not segs or (t.hop == 0 and segs[-1]["max_hop"] == n - 1 and segs[-1]["closed"]):
                segs.append({"tasks": [], "max_hop": -1, "closed": False})
            seg = segs[-1]
            seg["tasks"].append(t)
            seg["max_hop"] = max(seg["max_hop"], t.hop)
            if t.hop == n - 1:
                seg["closed"] = True
        count = max([len(s) for s in per_rank.values()] + [0])
        self.passes = [Pass(i) for i in range(count)]
        for segs in per_rank.values():
            for i, seg in enumerate(segs):
                p = self.passes[i]
                for t in seg["tasks"]:
                    t.pass_index = i
                    p.start = min(p.start, t.start)
                    p.end = max(p.end, t.end)
                    p.ops.add(t.op)
        for p in self.passes:
            p.backward = bool(p.ops & {"expert-bwd", "recompute", "gather-dy"})
            token = bool(p.ops & {"accumulate", "accumulate-dg", "zero-partial"})
            p.kind = "token" if token else "ring"

    def _decode_transfers(self):
        n = self.nranks
        block = tag_block(n)
        first = None if self.tag_first is None else self.tag_first & 0xFFFFFFFF
        blocks = {}
        for x in self.transfers:
            if first is None:
                continue
            x.offset = ((x.tag & 0xFFFFFFFF) - first) & 0xFFFFFFFF
            x.block = x.offset // block
            blocks.setdefault(x.block, []).append(x)
        # Layer calls take consecutive blocks and the ring passes are a
        # subsequence of them (all-to-all calls have blocks but no hop
        # tasks): each pass, in order, takes the later block nearest to it in
        # time, by overlap or else by the gap (a pass's first transfer may end
        # before its first hop task starts). Blocks no pass takes are
        # all-to-all calls.
        span = {}
        for b, xs in blocks.items():
            span[b] = (min(x.start for x in xs), max(max(x.end, x.start) for x in xs))
        owner, leg = {}, {}
        last = None

        def within(sp, p):
            # Most of the block's span inside the pass: clock alignment may
            # leave the next call's first transfers a little early.
            ov = min(sp[1], p.end) - max(sp[0], p.start)
            return ov > 0 and ov >= 0.5 * (sp[1] - sp[0])

        for p in self.passes:
            best, best_score = None, None
            for b in sorted(span):
                if last is not None and b <= last:
                    continue
                lo, hi = span[b]
                ov = min(hi, p.end) - max(lo, p.start)
                if best_score is None or ov > best_score:
                    best, best_score = b, ov
            if best is None:
                continue
            # A striped pass's legs: the blocks around the best one that
            # fall within the pass, at most STRIPE_LEGS of them.
            first_block = best
            while (first_block - 1 in span and (last is None or first_block - 1 > last)
                   and best - (first_block - 1) < STRIPE_LEGS and within(span[first_block - 1], p)):
                first_block -= 1
            b = first_block
            while b in span and b - first_block < STRIPE_LEGS and (b <= best or within(span[b], p)):
                owner[b] = p
                leg[b] = b - first_block
                p.blocks.append(b)
                last = b
                b += 1
        for b, xs in sorted(blocks.items()):
            best = owner.get(b)
            for x in xs:
                x.pass_index = best.index if best is not None else None
                x.leg = leg.get(b, 0)
                name_transfer(x, x.offset % block, n, best)
        for x in self.open_links:
            if first is None:
                continue
            x.offset = ((x.tag & 0xFFFFFFFF) - first) & 0xFFFFFFFF
            x.block = x.offset // block
            best = owner.get(x.block)
            x.pass_index = best.index if best is not None else None
            x.leg = leg.get(x.block, 0)
            name_transfer(x, x.offset % block, n, best)

    # ---- per rank and hop ----------------------------------------------------

    def compute_intervals(self, rank):
        return merge([(t.start, t.end) for t in self.tasks if t.rank == rank and t.end > t.start])

    def overlap_rows(self):
        """Per pass, hop and rank: the transfers the rank received during
        that hop, their time, the part of it the rank spent computing, and
        the rank's compute time in that hop's tasks. Transfers that cannot
        be timed (Transfer.problem) and those the pass's tag layout expects
        but the trace lacks are counted in "flagged" with the reasons in
        "problems", and left out of the times."""
        busy = {r: self.compute_intervals(r) for r in range(self.nranks)}
        rows = {}

        def row_of(key):
            return rows.setdefault(key, {"transfers": 0, "bytes": 0, "transfer_ms": 0.0, "hidden_ms": 0.0,
                                         "compute_ms": 0.0, "what": set(), "flagged": 0, "problems": []})

        got = {}
        for x in self.transfers:
            if x.pass_index is None or x.hop is None or not 0 <= x.dst < self.nranks:
                continue
            row = row_of((x.pass_index, x.hop, x.dst))
            row["what"].add(x.what)
            got[(x.pass_index, x.dst, x.what, x.hop)] = got.get((x.pass_index, x.dst, x.what, x.hop), 0) + 1
            if x.problem:
                row["flagged"] += 1
                row["problems"].append("%s %d->%d (tag %d): %s" % (x.label, x.src, x.dst, x.tag, x.problem))
                continue
            row["transfers"] += 1
            row["bytes"] += x.size
            row["transfer_ms"] += x.duration
            row["hidden_ms"] += covered(busy[x.dst], x.start, x.end)
        for p in self.passes:
            if p.kind not in ("ring", "token") or not p.blocks:
                continue
            for what, hop in expected_transfers(p.kind, p.backward, self.nranks):
                for r in range(self.nranks):
                    if not got.get((p.index, r, what, hop)):
                        row = row_of((p.index, hop, r))
                        row["what"].add(what)
                        row["flagged"] += 1
                        row["problems"].append("%s h%d to rank %d: no link in paje.trace" % (what, hop, r))
        for t in self.tasks:
            if t.pass_index is None:
                continue
            key = (t.pass_index, t.hop, t.rank)
            if key in rows:
                rows[key]["compute_ms"] += t.end - t.start
        out = []
        for (p, h, r), row in sorted(rows.items()):
            row.update({"pass": p, "kind": self.passes[p].label, "hop": h, "rank": r,
                        "what": "+".join(sorted(row["what"]))})
            out.append(row)
        return out

    def summary(self, rows=None):
        rows = self.overlap_rows() if rows is None else rows
        tr = sum(r["transfer_ms"] for r in rows)
        hid = sum(r["hidden_ms"] for r in rows)
        comp = sum(r["compute_ms"] for r in rows)
        span = 0.0
        if self.passes:
            span = sum(max(0.0, p.end - p.start) for p in self.passes)
        return {"ranks": self.nranks, "passes": len(self.passes), "transfers": sum(r["transfers"] for r in rows),
                "transfer_ms": tr, "hidden_ms": hid, "hidden_frac": hid / tr if tr > 0 else 0.0,
                "compute_ms": comp, "pass_ms": span, "flagged": sum(r.get("flagged", 0) for r in rows),
                "problems": [p for r in rows for p in r.get("problems", [])]}


def feasible_shifts(n, bound, margin, on_cycle):
    """Clock shifts with shift[src] - shift[dst] <= w - m for every
    (src, dst): w in bound, m = margin for the pairs on_cycle and
    min(margin, 0) for the others, moving each rank from 0 only as far as
    some link forces it (Bellman-Ford relaxation); None when there are none."""
    shift = [0.0] * n
    for _ in range(n + 1):
        moved = False
        for (src, dst), w in bound.items():
            m = margin if (src, dst) in on_cycle else min(margin, 0.0)
            if shift[src] > shift[dst] + w - m + 1e-9:
                shift[src] = shift[dst] + w - m
                moved = True
        if not moved:
            return shift
    return None


def name_transfer(x, rel, n, p):
    """What a transfer carries and the hop that sends it, from its offset in
    the pass's tag block (see the module's description)."""
    if p is None:
        # An all-to-all's pass: a2a-megatron numbers its phases from 0; the
        # pipelined a2a, which may take several blocks, tags its chunks
        # after the counts (graph/dispatch/alltoall_plan.c).
        x.what = "a2a " + A2A_PHASES[rel] if rel < len(A2A_PHASES) else "a2a chunk"
        return
    if x.leg >= 4:
        # A relay's credit upstream for the slot of the piece at rel.
        name_transfer_data(x, rel, n, p)
        x.what = LEG_NAMES[x.leg]
        return
    name_transfer_data(x, rel, n, p)
    if x.leg and x.what != "transfer":
        x.what = "%s %s" % (x.what, LEG_NAMES[x.leg])


def name_transfer_data(x, rel, n, p):
    """name_transfer for a ring pass's block, whatever the leg."""
    if rel >= 8 * n + 8:
        # A credit of the ring's flow control (graph/pass/flow.c): kind k of hop h.
        k, h = divmod(rel - (8 * n + 8), n)
        x.what, x.hop = "credit %d" % k, h
        return
    if p.kind == "ring":
        if rel < n - 1:
            x.what, x.hop = "weights", rel
        elif p.backward and n + 1 <= rel <= 2 * n - 1:
            x.what, x.hop = "grad", rel - n - 1
        elif p.backward and rel == 2 * n:
            x.what, x.hop = "grad-return", n - 1
    elif p.kind == "token":
        if rel == 0:
            x.what = "counts"
        else:
            h, k = divmod(rel - 1, len(TOKEN_KINDS))
            kind = TOKEN_KINDS[k]
            if kind == "acc":
                kind = "dx-acc" if p.backward else "y-acc"
            if h < n:
                x.what, x.hop = kind, h
            elif h == n:
                x.what, x.hop = kind + "-return", n - 1


def merge(intervals):
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def covered(intervals, s, e):
    """Length of the intersection of [s, e] with the merged (sorted,
    disjoint) intervals: within [0, e - s] by construction, 0 when e <= s."""
    total = 0.0
    for a, b in intervals:
        lo, hi = max(a, s), min(b, e)
        if hi > lo:
            total += hi - lo
    return total


def read_layout(directory):
    nranks = ring = tag_first = None
    path = os.path.join(directory, "relaymoe-trace.txt")
    if not os.path.exists(path):
        return nranks, ring, tag_first
    with open(path) as f:
        for line in f:
            words = line.split()
            if not words or words[0].startswith("#"):
                continue
            if words[0] == "ranks":
                nranks = int(words[1])
            elif words[0] == "ring":
                ring = [int(w) for w in words[1:]]
            elif words[0] == "tag_first":
                tag_first = int(words[1])
    return nranks, ring, tag_first


def read_task_records(path):
    """tasks.rec's records of tasks that ran (StarPU's internal acquire and
    sync tasks do not: they have no start, end or name), as dicts."""
    rec = {}
    # StarPU writes a task's name as it finds it in memory: a name it reads
    # after the task is gone comes out as stray bytes, which must not stop
    # the reading of every other task (surrogateescape keeps them as they are).
    with open(path, errors="surrogateescape") as f:
        for line in f:
            line = line.rstrip("\n")
            if line:
                key, _, value = line.partition(": ")
                rec[key] = value
                continue
            if "StartTime" in rec and "EndTime" in rec and "Name" in rec:
                yield rec
            rec = {}
    if "StartTime" in rec and "EndTime" in rec and "Name" in rec:
        yield rec


def read_tasks(path):
    """The tasks that ran."""
    return [Task(int(r.get("MPIRank", 0)), int(r.get("WorkerId", 0)), r["Name"], float(r["StartTime"]),
                 float(r["EndTime"])) for r in read_task_records(path)]


def read_links(path):
    """StarPU-MPI transfers: PajeStartLink (23) and PajeEndLink (19) lines of
    type MPIL, matched by key."""
    starts, ends = {}, {}
    with open(path, errors="surrogateescape") as f:
        for line in f:
            if not (line.startswith("23\t") or line.startswith("19\t")):
                continue
            w = line.rstrip("\n").split("\t")
            if len(w) < 7 or w[2] != "MPIL":
                continue
            rank = int(w[5].split("_")[0])
            if w[0] == "23":
                # A bare tag, or a name_paje_links label ending "(tag N)".
                m = TAG_FIELD.search(w[7]) if len(w) > 7 else None
                starts[w[6]] = (float(w[1]), int(w[4]), rank, int(m.group(1) or m.group(2)) if m else 0)
            else:
                ends[w[6]] = (float(w[1]), rank)
    out, open_links = [], []
    for key, (t0, size, src, tag) in starts.items():
        if key in ends:
            t1, dst = ends[key]
            out.append(Transfer(src, dst, t0, t1, size, tag))
        else:
            # The receiver is only named by the end: -1 until decoded.
            open_links.append(Transfer(src, -1, t0, None, size, tag))
    out.sort(key=lambda x: x.start)
    open_links.sort(key=lambda x: x.start)
    return out, open_links


def name_paje_links(directory, trace=None):
    """Writes each MPI link's name and hop into paje.trace (its MPITAG
    field: "weights h2 (tag 25)"), so ViTE shows what each transfer of the
    ring carries. Also quotes the task names StarPU 1.3 writes bare in its
    entity values and detailed states ("gather h2" would read as two
    fields). Idempotent. Returns the number of links named."""
    trace = trace or Trace(directory)
    path = os.path.join(directory, "paje.trace")
    named = 0
    labels = {}
    for x in trace.transfers:
        labels[(x.src, round(x.paje_start, 6), x.tag)] = x.label
    tmp = path + ".tmp"
    with open(path, errors="surrogateescape") as f, open(tmp, "w", errors="surrogateescape") as g:
        for line in f:
            if line.startswith("6\t") or line.startswith("20\t"):
                w = line.rstrip("\n").split("\t")
                if any(" " in f and not f.startswith('"') for f in w):
                    line = "\t".join('"%s"' % f if " " in f and not f.startswith('"') else f for f in w) + "\n"
            if line.startswith("23\t") and "\tMPIL\t" in line:
                w = line.rstrip("\n").split("\t")
                m = TAG_FIELD.search(w[7]) if len(w) > 7 else None
                if m:
                    src = int(w[5].split("_")[0])
                    tag = int(m.group(1) or m.group(2))
                    label = labels.get((src, round(float(w[1]), 6), tag))
                    if label:
                        w[7] = '"%s (tag %d)"' % (label, tag)
                        named += 1
                        line = "\t".join(w) + "\n"
            g.write(line)
    os.replace(tmp, path)
    return named


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 3 or sys.argv[1] != "name":
        sys.exit("usage: rmoe_trace.py name DIR   (names the MPI links of DIR/paje.trace)")
    print("named %d transfer(s) in %s" % (name_paje_links(sys.argv[2]), os.path.join(sys.argv[2], "paje.trace")))
