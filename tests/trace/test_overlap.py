#!/usr/bin/python3
"""scripts/trace/rmoe_trace.py and overlap.py on small synthetic traces: a
transfer's time comes from its own link events, the hidden part lies
within [0, transfer], the clocks are aligned over every link (a ring's
closing pair included), and a transfer whose events are missing or out of
order is flagged, never counted as 0 ms.

    test_overlap.py     (unittest; no StarPU needed)
"""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

here = os.path.dirname(os.path.abspath(__file__))
scripts = os.path.join(here, "..", "..", "scripts", "trace")
sys.dont_write_bytecode = True
sys.path.insert(0, scripts)
import rmoe_trace  # noqa: E402

TAG_FIRST = 1000
SIZE = 2359296


def write_trace(directory, nranks, tasks, links):
    """tasks: (rank, name, start, end); links: (src, dst, tag offset,
    start on src's clock, end on dst's clock or None for no end event)."""
    with open(os.path.join(directory, "relaymoe-trace.txt"), "w") as f:
        f.write("ranks %d\nring %s\ntag_first %d\n" % (nranks, " ".join(map(str, range(nranks))), TAG_FIRST))
    with open(os.path.join(directory, "tasks.rec"), "w") as f:
        for rank, name, s, e in tasks:
            f.write("Name: %s\nMPIRank: %d\nWorkerId: 0\nStartTime: %.6f\nEndTime: %.6f\n\n" % (name, rank, s, e))
    with open(os.path.join(directory, "paje.trace"), "w") as f:
        for i, (src, dst, off, s, e) in enumerate(links):
            f.write("23\t%.9f\tMPIL\tMPIroot\t%d\t%d_mpict\tmpicom_%d\t%d\n" % (s, SIZE, src, i, TAG_FIRST + off))
            if e is not None:
                f.write("19\t%.9f\tMPIL\tMPIroot\t%d\t%d_mpict\tmpicom_%d\n" % (e, SIZE, dst, i))


def ring_forward(nranks):
    """One forward pass of the expert ring: hops 0..n-1 on every rank."""
    return [(r, "expert-ffn h%d" % h, 10.0 * h, 10.0 * h + 8.0) for r in range(nranks) for h in range(nranks)]


class Synthetic(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="rmoe-overlap-")

    def tearDown(self):
        shutil.rmtree(self.dir)

    def rows(self):
        trace = rmoe_trace.Trace(self.dir)
        return trace, trace.overlap_rows()

    def overlap_cli(self, *args):
        return subprocess.run([sys.executable, os.path.join(scripts, "overlap.py"), self.dir] + list(args),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)

    def assert_bounded(self, rows):
        for r in rows:
            self.assertGreaterEqual(r["hidden_ms"], 0.0, r)
            self.assertLessEqual(r["hidden_ms"], r["transfer_ms"] + 1e-9, r)


class TestCovered(unittest.TestCase):
    def test_overlap_covered_within_interval(self):
        busy = rmoe_trace.merge([(0.0, 2.0), (1.0, 3.0), (4.0, 6.0)])
        self.assertAlmostEqual(rmoe_trace.covered(busy, 1.0, 5.0), 3.0)
        self.assertAlmostEqual(rmoe_trace.covered(busy, -5.0, 10.0), 5.0)
        self.assertAlmostEqual(rmoe_trace.covered(busy, 3.0, 4.0), 0.0)

    def test_overlap_covered_reversed_interval_is_zero(self):
        # An interval that ends before it starts, inside a busy stretch:
        # the old sum gave min(b, e) - max(a, s) = -2.
        self.assertEqual(rmoe_trace.covered([[0.0, 10.0]], 5.0, 3.0), 0.0)


class TestRing(Synthetic):
    # 3 ranks, links one way round the ring 0 -> 1 -> 2 -> 0. Rank 2's
    # clock is 3 ms early: raw, 1 -> 2 ends 1 ms before it starts, while
    # rank 2 is computing (hop 0 runs 0-8 ms). Aligning along a spanning
    # tree from rank 0 left it so (transfer 0.00 ms, hidden -1 ms).
    def make(self, end_12=5.0, drop=None, no_end=None):
        links = [(0, 1, 0, 4.0, 6.0), (1, 2, 0, 6.0, end_12), (2, 0, 0, 4.0, 9.0),
                 (0, 1, 1, 14.0, 15.0), (1, 2, 1, 14.0, 13.0), (2, 0, 1, 14.0, 19.0)]
        links = [(s, d, o, a, None if (s, o) == no_end else b) for s, d, o, a, b in links if (s, o) != drop]
        write_trace(self.dir, 3, ring_forward(3), links)

    def test_overlap_striped_pass_legs(self):
        # A striped forward on 4 ranks (graph/pass/stripes.c): piece 0 of hop
        # 1's weights 1 -> 2 in the pass's first block, piece 1 through the
        # relays 1 -> 0 -> 3 -> 2 in blocks 1, 2 and 3, the relays' credits
        # in 4 and 5; then an all-to-all call's counts in the block after,
        # once the pass has ended: not a leg.
        n, block = 4, rmoe_trace.tag_block(4)
        links = [(r, (r + 1) % n, h, 10.0 * h + 1.0, 10.0 * h + 3.0) for r in range(n) for h in range(n - 1)]
        links += [(1, 0, block + 1, 11.0, 12.0), (0, 3, 2 * block + 1, 12.0, 14.0), (3, 2, 3 * block + 1, 14.0, 15.0),
                  (0, 1, 4 * block + 1, 10.5, 10.6), (3, 0, 5 * block + 1, 10.5, 10.7),
                  (0, 1, 6 * block, 45.0, 46.0)]
        write_trace(self.dir, n, ring_forward(n), links)
        trace, rows = self.rows()
        self.assert_bounded(rows)
        names = {(x.src, x.dst, x.block): (x.label, x.leg, x.pass_index) for x in trace.transfers
                 if x.offset % block == 1}
        self.assertEqual(names[(1, 2, 0)], ("weights h1", 0, 0))
        self.assertEqual(names[(1, 0, 1)], ("weights to-relay h1", 1, 0))
        self.assertEqual(names[(0, 3, 2)], ("weights across h1", 2, 0))
        self.assertEqual(names[(3, 2, 3)], ("weights from-relay h1", 3, 0))
        self.assertEqual(names[(0, 1, 4)], ("relay-credit h1", 4, 0))
        self.assertEqual(names[(3, 0, 5)], ("relay-credit h1", 5, 0))
        self.assertEqual(trace.passes[0].blocks, [0, 1, 2, 3, 4, 5])
        a2a = [x for x in trace.transfers if x.block == 6]
        self.assertEqual([(x.what, x.pass_index) for x in a2a], [("a2a counts", None)])

    def test_overlap_ring_closing_pair_aligned(self):
        self.make()
        trace, rows = self.rows()
        self.assert_bounded(rows)
        self.assertEqual(sum(r["flagged"] for r in rows), 0)
        self.assertEqual(sum(r["transfers"] for r in rows), 6)
        for x in trace.transfers:
            self.assertIsNone(x.problem, x.label)
            self.assertGreater(x.duration, 0.0, "%s %d->%d" % (x.label, x.src, x.dst))
        # The slack around the ring (each pair's fastest raw end - start:
        # 1, -1 and 5 ms) is shared: every pair's fastest takes 5 / 3 ms.
        fastest = {}
        for x in trace.transfers:
            fastest[(x.src, x.dst)] = min(fastest.get((x.src, x.dst), 1e9), x.duration)
        for pair, d in fastest.items():
            self.assertAlmostEqual(d, 5.0 / 3.0, places=6, msg=str(pair))

    def test_overlap_missing_end_flagged(self):
        self.make(no_end=(1, 0))
        trace, rows = self.rows()
        self.assert_bounded(rows)
        row = [r for r in rows if (r["pass"], r["hop"], r["rank"]) == (0, 0, 2)]
        self.assertEqual(len(row), 1)
        self.assertEqual(row[0]["flagged"], 1)
        self.assertEqual(row[0]["transfers"], 0)
        self.assertEqual(row[0]["transfer_ms"], 0.0)
        self.assertEqual(len(trace.open_links), 1)
        out = self.overlap_cli()
        self.assertEqual(out.returncode, 0, out.stdout)
        self.assertIn("FLAGGED 1 transfer(s) not timed", out.stdout)
        self.assertIn("weights h0 to rank 2: no link in paje.trace", out.stdout)
        table = [line for line in out.stdout.splitlines() if line.startswith("   0 ring fwd    0    2")]
        self.assertEqual(len(table), 1, out.stdout)
        self.assertNotIn("0.00", table[0].split("weights")[1].split()[1:4])
        self.assertEqual(self.overlap_cli("--strict", "--quiet").returncode, 2)

    def test_overlap_missing_link_flagged(self):
        self.make(drop=(2, 1))
        _, rows = self.rows()
        self.assert_bounded(rows)
        flagged = [r for r in rows if r["flagged"]]
        self.assertEqual([(r["pass"], r["hop"], r["rank"]) for r in flagged], [(0, 1, 0)])
        self.assertIn("weights h1 to rank 0: no link in paje.trace", flagged[0]["problems"])


class TestUnordered(Synthetic):
    # 2 ranks, links both ways whose durations add up to less than 0: no
    # shift of the clocks orders both; the one left ending before it starts
    # is flagged instead of reading 0.00 ms.
    def test_overlap_unordered_flagged(self):
        write_trace(self.dir, 2, ring_forward(2), [(0, 1, 0, 5.0, 2.0), (1, 0, 0, 5.0, 6.0)])
        trace, rows = self.rows()
        self.assert_bounded(rows)
        self.assertEqual(sum(r["flagged"] for r in rows), 2)
        self.assertEqual(sum(r["transfers"] for r in rows), 0)
        self.assertTrue(all(x.problem == "ends before it starts" for x in trace.transfers))
        self.assertTrue(all(x.duration is None for x in trace.transfers))


if __name__ == "__main__":
    unittest.main(verbosity=2)
