"""Reading a relaymoe trace: what `relaymoe run --trace DIR` leaves in DIR.

DIR holds StarPU's conversion of every rank's FxT file (tasks.rec: one record
per task with its name, rank, worker, start and end; paje.trace: among others
one link per StarPU-MPI transfer with its sender, receiver, size and MPI tag)
and relaymoe-trace.txt (ranks, ring order, first tag of the context).

Tasks carry the method's names, "op hN" for the ops of ring hop N. A
transfer carries only its tag; its pass and hop come from the tag layout of
graph/: every pass (one forward or backward of one layer) reserves a block
of TAG_BLOCK(N) = 8N+8 consecutive tags (graph/forward_backward.c) and each dispatcher
numbers its transfers inside the block:

  expert ring (graph/ring_expert.c)  forward:  h           weights sent during hop h
                                     backward: h           weights sent during hop h
                                               N+1+h       gradient accumulator sent after hop h
                                               2N          finished gradient back to its owner
  token ring (graph/ring_token.c)    0                     expert counts (every pair of ranks)
                                     1+6h+k                kind k sent during hop h
                                     1+6N+k                accumulator k back to its owner
  all-to-all (graph/alltoall.c)      0 counts, 1 dispatch, 2 combine, 3 dout, 4 dx

StarPU 1.3 records tags in 32 bits, so the offset is taken modulo 2^32 from
the low 32 bits of tag_first. Which dispatcher and direction a block belongs
to is read from the names of the tasks running at the same time. The test
tests/trace/ checks this decoding against a real run, so a change of the tag
layout in graph/ shows up there.

Times are milliseconds on StarPU's merged time line (ranks aligned on
StarPU-MPI's start-up barrier). Python 3 standard library only.
"""

import os
import re

HOP_NAME = re.compile(r"^(?P<op>.+) h(?P<hop>\d+)$")
TOKEN_KINDS = ["tokens", "dy", "pair-order", "topk-weights", "acc", "dg-acc"]
A2A_PHASES = ["counts", "dispatch", "combine", "dout", "dx"]
TAG_FIELD = re.compile(r"^\s*(-?\d+)\s*$|\(tag (-?\d+)\)")


def tag_block(nranks):
    return 8 * nranks + 8


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
    __slots__ = ("src", "dst", "start", "end", "size", "tag", "offset", "block", "pass_index", "what",
                 "hop", "paje_start")

    def __init__(self, src, dst, start, end, size, tag):
        self.src, self.dst, self.start, self.end, self.size, self.tag = src, dst, start, end, size, tag
        self.paje_start = start   # as written in paje.trace, before any clock shift
        self.offset = self.block = self.pass_index = self.hop = None
        self.what = "transfer"

    @property
    def duration(self):
        # Ranks are aligned on one barrier: a short transfer may come out
        # slightly negative.
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
        self.transfers = read_links(os.path.join(directory, "paje.trace"))
        if self.nranks is None:
            self.nranks = 1 + max([t.rank for t in self.tasks] + [0])
        self.clock_shift = self._align_clocks()
        self.passes = []
        self._find_passes()
        self._decode_transfers()

    # StarPU aligns the ranks' clocks on one barrier at start-up; a rank
    # held up there (e.g. calibrating the bus) comes out shifted by as much.
    # The transfers bound the shift: a message ends after it starts. For
    # each pair of ranks the links both ways give an interval for the
    # difference of their clocks; the one nearest to 0 is taken, and rank
    # 0's clock is spread to the others along those pairs.
    def _align_clocks(self):
        bound = {}
        for x in self.transfers:
            if x.src == x.dst:
                continue
            lo, hi = bound.get((x.src, x.dst), (float("-inf"), float("inf")))
            bound[(x.src, x.dst)] = (max(lo, x.start - x.end), hi)
        shift = {0: 0.0}
        todo = [0]
        while todo:
            a = todo.pop()
            for b in range(self.nranks):
                if b in shift:
                    continue
                # shift[b] - shift[a] >= max(start - end) over a->b links,
                # shift[a] - shift[b] >= max(start - end) over b->a links.
                lo = bound.get((a, b), (float("-inf"), 0))[0]
                up = -bound.get((b, a), (float("-inf"), 0))[0]
                if lo == float("-inf") and up == float("inf"):
                    continue
                d = 0.0 if lo <= 0.0 <= up else (lo if lo > 0.0 else up)
                if lo > up:
                    d = (lo + up) / 2
                shift[b] = shift[a] + d
                todo.append(b)
        if all(abs(v) < 1e-9 for v in shift.values()):
            return {}
        for t in self.tasks:
            t.start += shift.get(t.rank, 0.0)
            t.end += shift.get(t.rank, 0.0)
        for x in self.transfers:
            x.start += shift.get(x.src, 0.0)
            x.end += shift.get(x.dst, 0.0)
        self.transfers.sort(key=lambda x: x.start)
        return {r: v for r, v in shift.items() if abs(v) >= 1e-9}

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
        owner = {}
        last = None
        for p in self.passes:
            best, best_score = None, None
            for b in sorted(span):
                if last is not None and b <= last:
                    continue
                lo, hi = span[b]
                ov = min(hi, p.end) - max(lo, p.start)
                if best_score is None or ov > best_score:
                    best, best_score = b, ov
            if best is not None:
                owner[best] = p
                p.blocks.append(best)
                last = best
        for b, xs in sorted(blocks.items()):
            best = owner.get(b)
            for x in xs:
                x.pass_index = best.index if best is not None else None
                name_transfer(x, x.offset % block, n, best)

    # ---- per rank and hop ----------------------------------------------------

    def compute_intervals(self, rank):
        return merge([(t.start, t.end) for t in self.tasks if t.rank == rank and t.end > t.start])

    def overlap_rows(self):
        """Per pass, hop and rank: the transfers the rank received during
        that hop, their time, the part of it the rank spent computing, and
        the rank's compute time in that hop's tasks."""
        busy = {r: self.compute_intervals(r) for r in range(self.nranks)}
        rows = {}
        for x in self.transfers:
            if x.pass_index is None or x.hop is None or x.dst >= self.nranks:
                continue
            key = (x.pass_index, x.hop, x.dst)
            row = rows.setdefault(key, {"transfers": 0, "bytes": 0, "transfer_ms": 0.0, "hidden_ms": 0.0,
                                        "compute_ms": 0.0, "what": set()})
            row["transfers"] += 1
            row["bytes"] += x.size
            row["transfer_ms"] += x.duration
            row["hidden_ms"] += covered(busy[x.dst], x.start, x.end)
            row["what"].add(x.what)
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
                "compute_ms": comp, "pass_ms": span}


def name_transfer(x, rel, n, p):
    """What a transfer carries and the hop that sends it, from its offset in
    the pass's tag block (see the module's description)."""
    if p is None:
        if rel < len(A2A_PHASES):
            x.what = "a2a " + A2A_PHASES[rel]
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
    """Length of [s, e] covered by the merged intervals."""
    total = 0.0
    for a, b in intervals:
        if b <= s:
            continue
        if a >= e:
            break
        total += min(b, e) - max(a, s)
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


def read_tasks(path):
    """The tasks that ran (StarPU's internal acquire and sync tasks do not)."""
    tasks = []
    rec = {}

    def flush():
        if "StartTime" in rec and "EndTime" in rec and "Name" in rec:
            tasks.append(Task(int(rec.get("MPIRank", 0)), int(rec.get("WorkerId", 0)), rec["Name"],
                              float(rec["StartTime"]), float(rec["EndTime"])))
        rec.clear()

    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                flush()
                continue
            key, _, value = line.partition(": ")
            rec[key] = value
    flush()
    return tasks


def read_links(path):
    """StarPU-MPI transfers: PajeStartLink (23) and PajeEndLink (19) lines of
    type MPIL, matched by key."""
    starts, ends = {}, {}
    with open(path) as f:
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
    out = []
    for key, (t0, size, src, tag) in starts.items():
        if key in ends:
            t1, dst = ends[key]
            out.append(Transfer(src, dst, t0, t1, size, tag))
    out.sort(key=lambda x: x.start)
    return out


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
    with open(path) as f, open(tmp, "w") as g:
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
