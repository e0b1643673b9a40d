#!/usr/bin/python3
"""Platform files for simulating relaymoe with StarPU-SimGrid over SMPI.

usage:
  platform.py CLUSTER_FILE -n RANKS -o OUTDIR [--cpus-per-rank C]
              [--transport staged|gpudirect]
  platform.py --cpu -n RANKS -o OUTDIR [--shm-gbs B] [--shm-lat-us L]
              [--cpu-gflops G]

GPU mode (a cluster file of scheduler/clusters/, e.g. mn5-acc.cluster) writes
a machine of RANKS ranks, one GPU each, placed as the planner places them:
the file's [placement] when it names RANKS ranks, else ranks_per_node
consecutive ranks per node. It is the same file `relaymoe plan --cluster FILE`
reads, so the plan and the simulation describe one machine: the same nodes,
devices, link classes, bandwidths and latencies (links the file leaves out
take the planner's built-in numbers, as the planner does).

  OUTDIR/platform.xml   SMPI platform (SimGrid 3.32, DTD 4.1): one host per
                        rank; a zone per node (routing Full) in which every
                        pair of ranks has its own split-duplex link of the
                        pair's class (same_device, nvlink or pcie per
                        gpu_link, shm without GPUs), and a router; every rank
                        has its own network adapter (split-duplex, the
                        [link network] bandwidth, half its latency) to that
                        router, and the node routers are joined by a
                        non-blocking fabric (a fat tree of full bisection: a
                        FATPIPE link per ordered pair of nodes, no latency of
                        its own). A message
                        between two nodes therefore sees the file's network
                        bandwidth and latency, one inside a node its pair's
                        link.
  OUTDIR/hostfile       rank r on line r
  OUTDIR/sampling/bus/HOST.{platform.v4.xml,bandwidth,latency,config,affinity}
                        StarPU's per-rank machine description: hosts MAIN,
                        CPU0..CPU{C-1}, CUDA0 (memsize = the file's device
                        memory) and RAM, RAM<->CUDA0 over the file's [link
                        pcie]; bandwidth (MB/s) and latency (us) matrices over
                        the memory nodes (RAM, CUDA0). StarPU 1.3 in simgrid
                        mode reads the platform, bandwidth and latency files;
                        config and affinity are written as a real calibration
                        would, for its tools. HOST is STARPU_HOSTNAME. Every
                        rank gets this description: ranks that share a device
                        (ranks_per_node > devices_per_node) are linked by the
                        same_device link but each simulates a whole GPU.
  --transport           how a GPU's data reaches the network (default staged):
                        staged: StarPU-MPI 1.3 as it is, with no GPUDirect:
                        every message of every dispatcher is copied between
                        the GPU and host memory over the [link pcie] of the
                        rank's description (RAM<->CUDA0) before it is sent
                        and after it is received; gpudirect: that link costs
                        nothing (GPUDIRECT_GBS, no latency), so a message
                        sees only the NVLink pair link inside a node or the
                        adapters between nodes, as device buffers sent with
                        GPUDirect P2P / RDMA would. Only the staging hop
                        changes; the SMPI links carry every dispatcher's
                        bytes alike under both. Caveat: the description
                        has one host<->GPU path, so under gpudirect every
                        host<->GPU copy is free, not only MPI's staging (a
                        graph reading host-resident data, e.g. the ring's
                        host copy of the weights it forwards, gets it for
                        free too).
  OUTDIR/env.sh         `. OUTDIR/env.sh` sets STARPU_PERF_MODEL_DIR,
                        STARPU_HOSTNAME, STARPU_NCUDA, STARPU_NCPU,
                        STARPU_NOPENCL, and RMOE_SIM_PLATFORM, RMOE_SIM_HOSTFILE,
                        RMOE_SIM_NP, RMOE_SIM_CFG (the SimGrid options that
                        make SMPI use the links' numbers as they are: no
                        empirical bandwidth or latency factors, no TCP
                        cross-traffic)
  OUTDIR/platform.json  what was described (for reports)

Run a program on it:
  . OUTDIR/env.sh
  starpu_smpirun -np $RMOE_SIM_NP -platform $RMOE_SIM_PLATFORM \\
      -hostfile $RMOE_SIM_HOSTFILE $RMOE_SIM_CFG PROGRAM ARGS

CPU mode (--cpu) describes this machine for checking the simulation against
real runs: RANKS ranks on one node, each with one CPU worker and no GPU,
exchanging through host shared memory at --shm-gbs GB/s and --shm-lat-us us
(defaults: a memory copy of 64 MiB measured here now, and 1 us). A cluster
file is not used. The simulation does not model that several ranks share
this machine's few cores.

Errors (a bad or incomplete cluster file, a value out of range, more ranks
than the machine holds) are reported with the file and line; the exit status
is then 1 (2 for bad options) and OUTDIR is left as it was: files are written
into a temporary folder beside it and moved in place at the end. An existing
OUTDIR is replaced only when it is empty or was written by this script.
"""

import argparse
import json
import math
import os
import re
import shutil
import sys
import tempfile
import time

LINKS = ("same_device", "nvlink", "pcie", "shm", "network")
# The planner's built-in numbers (scheduler/cluster.c, rmoe_cluster_defaults):
# what the planner uses for a link a file leaves out.
DEFAULT_LINKS = {
    "same_device": (800.0, 5.0),
    "nvlink": (130.0, 2.0),
    "pcie": (50.0, 3.0),
    "shm": (12.0, 1.0),
    "network": (24.0, 2.0),
}
MAX_NODES = 1000000
MAX_PER_NODE = 4096
MAX_FILE_BYTES = 16 << 20
MAX_RANKS = 4096          # of a simulation; StarPU's per-node limits apart
STARPU_MPI_AS_PREFIX = "StarPU-MPI"
MARKER = ".relaymoe-platform"
# StarPU's matrices are padded to 16 memory nodes with nan, as its shipped
# descriptions are: every real value is then followed by a tab, which the
# 1.3 loader needs (it drops a row's last value when a newline follows it).
MATRIX_PAD = 16
# --transport gpudirect: the host<->GPU link that StarPU-MPI's staging
# crosses, made free. SimGrid needs a finite rate: 1 PB/s moves the largest
# hop of a full-size layer (~600 MB) in 0.6 us.
GPUDIRECT_GBS = 1e6
TRANSPORTS = ("staged", "gpudirect")


class Fail(Exception):
    pass


# ---- cluster file (the planner's format, docs/planning.md) ----------------

TOP_KEYS = ("name", "nodes", "devices_per_node", "ranks_per_node", "gpu_link", "nics_per_node")
DEVICE_KEYS = ("bf16_tflops", "f32_tflops", "memory")
PLACEMENT_KEYS = ("rank_nodes", "rank_devices")
LINK_KEYS = ("bandwidth_gbs", "latency_us")
WHERE = {
    "top": "before any section: name, nodes, devices_per_node, ranks_per_node, gpu_link, nics_per_node",
    "device": "in [device]: bf16_tflops, f32_tflops, memory",
    "link": "in [link]: bandwidth_gbs, latency_us",
    "placement": "in [placement]: rank_nodes, rank_devices",
}


def _int(v, lo, hi):
    if not v or not v.isdigit() or len(v) > 12:
        return None
    x = int(v)
    return x if lo <= x <= hi else None


def _num(v, lo, hi):
    if len(v) > 63 or not re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", v):
        return None
    x = float(v)
    return x if math.isfinite(x) and lo <= x <= hi else None


def _bytes(v):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(i?)(B?)", v)
    if not m or (m.group(3) and not m.group(2)):
        return None
    mult = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2)]
    x = float(m.group(1)) * mult
    if x < 1 or x > 2 ** 62:
        return None
    return int(x)


def _name(v):
    return v if re.fullmatch(r"[A-Za-z0-9._-]{1,63}", v) else None


# The keys of one value: how it is read (None: refused) and what is expected
# of it. A link's go into its [link NAME] under LINK_FIELDS, the others under
# their own name.
VALUES = {
    "name": (_name, "1 to 63 characters of A-Z a-z 0-9 . _ -"),
    "nodes": (lambda v: _int(v, 1, MAX_NODES), "an integer from 1 to %d" % MAX_NODES),
    "devices_per_node": (lambda v: _int(v, 0, MAX_PER_NODE), "an integer from 0 (CPU only) to %d" % MAX_PER_NODE),
    "ranks_per_node": (lambda v: _int(v, 1, MAX_PER_NODE), "an integer from 1 to %d" % MAX_PER_NODE),
    "gpu_link": (lambda v: v if v in ("nvlink", "pcie") else None, "nvlink or pcie"),
    "nics_per_node": (lambda v: _int(v, 1, 4096), "an integer from 1 to 4096"),
    "bf16_tflops": (lambda v: _num(v, 1e-6, 1e6), "a positive number of TFLOP/s (at most 1e6)"),
    "f32_tflops": (lambda v: _num(v, 1e-6, 1e6), "a positive number of TFLOP/s (at most 1e6)"),
    "memory": (_bytes, "a byte count such as 64G, 80GiB or 68719476736"),
    "bandwidth_gbs": (lambda v: _num(v, 1e-6, 1e6), "a positive number of GB/s (at most 1e6)"),
    "latency_us": (lambda v: _num(v, 0, 1e6), "a number of microseconds from 0 to 1e6"),
}
LINK_FIELDS = {"bandwidth_gbs": "bw", "latency_us": "lat"}


def parse_cluster(path):
    """The planner's parser, line for line in its rules."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise Fail("cluster file %s: cannot open (%s)" % (path, e.strerror))
    if len(data) > MAX_FILE_BYTES:
        raise Fail("cluster file %s: larger than %d bytes" % (path, MAX_FILE_BYTES))

    def err(line, msg):
        return Fail("cluster file %s: line %d: %s" % (path, line, msg))

    c = {"links": {}, "gpu_link": "nvlink"}
    seen = {}
    section, link = "top", None
    lines = data.split(b"\n")
    lineno = 0
    for raw in lines:
        lineno += 1
        if b"\0" in raw:
            raise err(lineno, "a NUL byte: expected text")
        try:
            s = raw.decode("ascii")
        except UnicodeDecodeError:
            s = raw.decode("latin-1")
        s = s.split("#", 1)[0].strip()
        if not s:
            continue
        if s.startswith("["):
            inner = s[1:-1].strip() if s.endswith("]") else None
            if inner == "device":
                section, link = "device", None
            elif inner == "placement":
                section, link = "placement", None
            elif inner is not None and re.fullmatch(r"link\s+\S+", inner) and inner.split()[1] in LINKS:
                section, link = "link", inner.split()[1]
            else:
                raise err(lineno, "section '%s': expected [device], [placement] or [link NAME] "
                          "with NAME one of %s" % (s[:40], ", ".join(LINKS)))
            continue
        if "=" not in s:
            raise err(lineno, "text '%s': expected 'key = value' or a [section] header" % s[:40])
        k, v = (x.strip() for x in s.split("=", 1))
        if not k:
            raise err(lineno, "a key is missing before '='")
        allowed = {"top": TOP_KEYS, "device": DEVICE_KEYS, "link": LINK_KEYS,
                   "placement": PLACEMENT_KEYS}[section]
        if k not in allowed:
            raise err(lineno, "key '%s': expected %s" % (k[:40], WHERE[section]))
        slot = (link, k) if section == "link" else k
        if slot in seen:
            raise err(lineno, "'%s' is already set on line %d" % (k, seen[slot]))
        if not v:
            raise err(lineno, "'%s' has no value after '='" % k)
        seen[slot] = lineno
        if k in VALUES:
            parse, expected = VALUES[k]
            x = parse(v)
            if x is None:
                raise err(lineno, "%s '%s': expected %s" % (k, v[:40], expected))
            if k in LINK_FIELDS:
                c["links"].setdefault(link, {})[LINK_FIELDS[k]] = x
            else:
                c[k] = x
        elif k in PLACEMENT_KEYS:
            vals = v.split()
            if len(vals) > MAX_RANKS * 256:
                raise err(lineno, "%s lists too many ranks" % k)
            out = []
            hi = MAX_NODES - 1 if k == "rank_nodes" else MAX_PER_NODE - 1
            for i, t in enumerate(vals):
                x = _int(t, 0, hi)
                if x is None:
                    raise err(lineno, "%s entry %d '%s': expected an integer from 0 to %d"
                              % (k, i, t[:20], hi))
                out.append(x)
            c[k] = out
    end = lineno
    example = {"name": "name = my-cluster", "nodes": "nodes = 2",
               "devices_per_node": "devices_per_node = 4", "ranks_per_node": "ranks_per_node = 4",
               "bf16_tflops": "bf16_tflops = 400 in [device]",
               "f32_tflops": "f32_tflops = 50 in [device]", "memory": "memory = 64G in [device]"}
    for k in ("name", "nodes", "devices_per_node", "ranks_per_node", "bf16_tflops",
              "f32_tflops", "memory"):
        if k not in seen:
            raise err(end, "(end of input) '%s' is missing; expected e.g. '%s'" % (k, example[k]))
    if c["devices_per_node"] > 1 and "gpu_link" not in seen:
        raise err(end, "(end of input) 'gpu_link' is missing; devices_per_node = %d needs "
                  "'gpu_link = nvlink' or 'gpu_link = pcie'" % c["devices_per_node"])
    for name, l in c["links"].items():
        if "bw" not in l:
            raise err(seen[(name, "latency_us")], "[link %s] has latency_us but no bandwidth_gbs" % name)
        if "lat" not in l:
            raise err(seen[(name, "bandwidth_gbs")], "[link %s] has bandwidth_gbs but no latency_us" % name)
    need = [
        (c["nodes"] > 1, "network", "nodes > 1 needs the link between nodes"),
        (c["devices_per_node"] > 1, c["gpu_link"], "devices_per_node > 1 needs the GPU-GPU link of gpu_link"),
        (c["devices_per_node"] > 0 and c["ranks_per_node"] > c["devices_per_node"], "same_device",
         "ranks_per_node > devices_per_node puts ranks on a shared device"),
        (c["devices_per_node"] == 0 and c["ranks_per_node"] > 1, "shm",
         "CPU-only nodes with several ranks need the host shared-memory link"),
    ]
    for needed, name, why in need:
        if needed and name not in c["links"]:
            raise err(end, "(end of input) [link %s] with bandwidth_gbs and latency_us is missing: %s"
                      % (name, why))
    if "rank_devices" in c:
        if "rank_nodes" not in c:
            raise err(seen["rank_devices"], "rank_devices needs rank_nodes in [placement]")
        if len(c["rank_devices"]) != len(c["rank_nodes"]):
            raise err(seen["rank_devices"], "rank_devices lists %d ranks but rank_nodes (line %d) lists %d"
                      % (len(c["rank_devices"]), seen["rank_nodes"], len(c["rank_nodes"])))
        for r, d in enumerate(c["rank_devices"]):
            if d >= c["devices_per_node"]:
                raise err(seen["rank_devices"], "rank_devices gives rank %d device %d: expected a device "
                          "below devices_per_node = %d" % (r, d, c["devices_per_node"]))
    if "rank_nodes" in c:
        if not c["rank_nodes"]:
            raise err(seen["rank_nodes"], "rank_nodes lists no rank")
        count = {}
        for r, n in enumerate(c["rank_nodes"]):
            if n >= c["nodes"]:
                raise err(seen["rank_nodes"], "rank_nodes puts rank %d on node %d: expected a node below "
                          "nodes = %d" % (r, n, c["nodes"]))
            count[n] = count.get(n, 0) + 1
            if count[n] > c["ranks_per_node"]:
                raise err(seen["rank_nodes"], "rank_nodes puts more than ranks_per_node = %d ranks on node %d"
                          % (c["ranks_per_node"], n))
    # Links the file leaves out: the planner's numbers (apply_rates).
    c["link"] = {}
    for name in LINKS:
        l = c["links"].get(name)
        c["link"][name] = (l["bw"], l["lat"]) if l else DEFAULT_LINKS[name]
        c["link_from_file_" + name] = bool(l)
    c["path"] = path
    return c


# ---- placement (scheduler/topology.c, rmoe_topology_simulated) --------------

def place(c, nranks):
    """node[r], device[r] (-1: no device), as the planner places nranks ranks."""
    if c.get("rank_nodes") and len(c["rank_nodes"]) == nranks:
        # Nodes renumbered by first appearance in rank order, as the planner does.
        order, node = {}, []
        for n in c["rank_nodes"]:
            order.setdefault(n, len(order))
            node.append(order[n])
        how = "rank_nodes of the cluster description"
        explicit_dev = c.get("rank_devices")
    else:
        if c.get("rank_nodes"):
            raise Fail("cluster %s places %d ranks (rank_nodes) but there are %d: expected one entry "
                       "per rank, or no [placement]" % (c["name"], len(c["rank_nodes"]), nranks))
        cap = c["nodes"] * c["ranks_per_node"]
        if nranks > cap:
            raise Fail("%d ranks do not fit cluster %s: %d nodes x ranks_per_node %d = %d ranks"
                       % (nranks, c["name"], c["nodes"], c["ranks_per_node"], cap))
        node = [r // c["ranks_per_node"] for r in range(nranks)]
        how = "block: ranks_per_node consecutive ranks per node"
        explicit_dev = None
    g = c["devices_per_node"]
    device, seen = [], {}
    for r in range(nranks):
        local = seen.get(node[r], 0)
        seen[node[r]] = local + 1
        if explicit_dev:
            device.append(explicit_dev[r])
        else:
            device.append(local % g if g > 0 else -1)
    return node, device, how


def link_class(c, node, device, a, b):
    if node[a] != node[b]:
        return "network"
    if device[a] >= 0 and device[b] >= 0:
        return "same_device" if device[a] == device[b] else c["gpu_link"]
    return "shm"


# ---- writers ------------------------------------------------------------------

def bps(gbs):
    return "%.6gBps" % (gbs * 1e9)


def sec(us):
    return "%.9gs" % (us * 1e-6)


def smpi_platform(c, nranks, node, device, hosts):
    """SimGrid 3.32 platform (DTD 4.1). starpu_smpirun drops the first two
    lines and the <platform> tags and nests the rest in its own root zone, so
    the layout is fixed: xml line, DOCTYPE line, <platform>, one zone."""
    name = c["name"]
    nodes = sorted(set(node))
    net_bw, net_lat = c["link"]["network"]
    out = []
    w = out.append
    w("<?xml version='1.0'?>")
    w('<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">')
    w('<platform version="4.1">')
    w('<!-- %s, %d ranks on %d node(s); written by scripts/sim/platform.py from %s -->'
      % (name, nranks, len(nodes), os.path.basename(c["path"])))
    w('<zone id="%s" routing="Full">' % name)
    for n in nodes:
        ranks = [r for r in range(nranks) if node[r] == n]
        z = "%s-node%d" % (name, n)
        w(' <zone id="%s" routing="Full">' % z)
        for r in ranks:
            # SMPI computes nothing (starpu_smpirun: simulate-computation:no);
            # StarPU's workers run on the hosts of its own per-rank zone.
            w('  <host id="%s" speed="1Gf"/>' % hosts[r])
        w('  <router id="%s-gw"/>' % z)
        for i, a in enumerate(ranks):
            for b in ranks[i + 1:]:
                cls = link_class(c, node, device, a, b)
                bw, lat = c["link"][cls]
                w('  <link id="%s-%s-r%d-r%d" bandwidth="%s" latency="%s" sharing_policy="SPLITDUPLEX"/>'
                  % (z, cls, a, b, bps(bw), sec(lat)))
        # The node's network adapters: one per rank unless nics_per_node
        # says fewer, each shared by a contiguous group of the node's ranks
        # (its flows split the adapter's rate, as the planner's share).
        nics = min(c.get("nics_per_node") or len(ranks), len(ranks))
        nic = {r: i * nics // len(ranks) for i, r in enumerate(ranks)}
        for j in range(nics):
            w('  <link id="%s-nic-a%d" bandwidth="%s" latency="%s" sharing_policy="SPLITDUPLEX"/>'
              % (z, j, bps(net_bw), sec(net_lat / 2)))
        for i, a in enumerate(ranks):
            for b in ranks[i + 1:]:
                cls = link_class(c, node, device, a, b)
                lid = "%s-%s-r%d-r%d" % (z, cls, a, b)
                w('  <route src="%s" dst="%s" symmetrical="NO"><link_ctn id="%s" direction="UP"/></route>'
                  % (hosts[a], hosts[b], lid))
                w('  <route src="%s" dst="%s" symmetrical="NO"><link_ctn id="%s" direction="DOWN"/></route>'
                  % (hosts[b], hosts[a], lid))
        for r in ranks:
            w('  <route src="%s" dst="%s-gw" symmetrical="NO"><link_ctn id="%s-nic-a%d" direction="UP"/></route>'
              % (hosts[r], z, z, nic[r]))
            w('  <route src="%s-gw" dst="%s" symmetrical="NO"><link_ctn id="%s-nic-a%d" direction="DOWN"/></route>'
              % (z, hosts[r], z, nic[r]))
        w(' </zone>')
    if len(nodes) > 1:
        # Full-bisection fat tree: never the bottleneck, each flow is capped by
        # the adapters at its ends only. SimGrid forbids an empty route, so a
        # FATPIPE link (no latency, each flow alone capped at the adapter's
        # rate) joins each ordered pair of nodes. One link per pair, not one
        # for the whole fabric: SimGrid rescans every flow of a FATPIPE link
        # each time its bandwidth solver fixes one of them, and one shared
        # link crossed by every inter-node flow of an all-to-all (about
        # EP^2 of them) made that solver quadratic in the flows (section
        # "What a simulated run costs" of bench/results/sim.md).
        for a in nodes:
            for b in nodes:
                if a != b:
                    w(' <link id="%s-fabric-%d-%d" bandwidth="%s" latency="0s" sharing_policy="FATPIPE"/>'
                      % (name, a, b, bps(net_bw)))
        for a in nodes:
            for b in nodes:
                if a == b:
                    continue
                w(' <zoneRoute src="%s-node%d" dst="%s-node%d" gw_src="%s-node%d-gw" gw_dst="%s-node%d-gw" '
                  'symmetrical="NO"><link_ctn id="%s-fabric-%d-%d"/></zoneRoute>'
                  % (name, a, name, b, name, a, name, b, name, a, b))
    w('</zone>')
    w('</platform>')
    return "\n".join(out) + "\n"


def matrix(values, n):
    """StarPU's bus matrix format: a header, rows of tab-separated %e,
    padded with nan to MATRIX_PAD columns and rows."""
    size = max(MATRIX_PAD, n)
    lines = ["# " + "".join("to %d\t\t" % j for j in range(size))]
    for i in range(size):
        row = []
        for j in range(size):
            row.append("%e" % values[i][j] if i < n and j < n else "nan")
        lines.append("\t".join(row))
    return "\n".join(lines) + "\n"


def node_description(host, ncpus, cpu_flops, gpu, notes):
    """StarPU per-rank machine description; gpu: None or dict with memsize,
    flops, pcie (bw GB/s, lat us)."""
    files = {}
    x = []
    w = x.append
    w("<?xml version='1.0'?>")
    w('<!DOCTYPE platform SYSTEM "http://simgrid.gforge.inria.fr/simgrid/simgrid.dtd">')
    w('<platform version="4">')
    w(' <AS id="AS0" routing="Full">')
    w('   <host id="MAIN" speed="1f"/>')
    for i in range(ncpus):
        w('   <host id="CPU%d" speed="%.6gf"/>' % (i, cpu_flops))
    if gpu:
        w('   <host id="CUDA0" speed="%.6gf">' % gpu["flops"])
        w('     <prop id="memsize" value="%d"/>' % gpu["memsize"])
        w('     <prop id="memcpy_peer" value="1"/>')
        w('   </host>')
    w('   <host id="RAM" speed="1f"/>')
    if gpu:
        bw, lat = gpu["pcie"]
        w('   <link id="RAM-CUDA0" bandwidth="%s" latency="%s"/>' % (bps(bw), sec(lat)))
        w('   <link id="CUDA0-RAM" bandwidth="%s" latency="%s"/>' % (bps(bw), sec(lat)))
        w('   <route src="RAM" dst="CUDA0" symmetrical="NO"><link_ctn id="RAM-CUDA0"/></route>')
        w('   <route src="CUDA0" dst="RAM" symmetrical="NO"><link_ctn id="CUDA0-RAM"/></route>')
    w(' </AS>')
    w(' </platform>')
    files["platform.v4.xml"] = "\n".join(x) + "\n"
    n = 2 if gpu else 1
    bwm = [[0.0] * n for _ in range(n)]
    latm = [[0.0] * n for _ in range(n)]
    if gpu:
        bw, lat = gpu["pcie"]
        bwm[0][1] = bwm[1][0] = bw * 1e3      # MB/s
        latm[0][1] = latm[1][0] = lat         # us
    files["bandwidth"] = matrix(bwm, n)
    files["latency"] = matrix(latm, n)
    files["config"] = ("# Current configuration\n%d # Number of CPUs\n%d # Number of CUDA devices\n"
                       "0 # Number of OpenCL devices\n0 # Number of MIC devices\n0 # Number of MPI devices\n"
                       % (ncpus, 1 if gpu else 0))
    aff = "# GPU\t" + "".join("NUMA%d\t" % i for i in range(1)) + "\n"
    if gpu:
        aff += "0\t0\t\n"
    files["affinity"] = aff
    return files


def measure_copy_gbs():
    """One core's memory copy rate, the stdlib way: best of a few 64 MiB copies."""
    size = 64 << 20
    src = bytearray(size)
    dst = bytearray(size)
    mv = memoryview(dst)
    best = None
    for _ in range(5):
        t = time.perf_counter()
        mv[:] = src
        dt = time.perf_counter() - t
        best = dt if best is None or dt < best else best
    return size / best / 1e9


def write_out(outdir, files):
    outdir = os.path.abspath(outdir)
    parent = os.path.dirname(outdir)
    if os.path.exists(outdir):
        if not os.path.isdir(outdir):
            raise Fail("%s exists and is not a folder" % outdir)
        if os.listdir(outdir) and not os.path.exists(os.path.join(outdir, MARKER)):
            raise Fail("%s exists, is not empty and was not written by platform.py: choose "
                       "another folder or remove it" % outdir)
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix="." + os.path.basename(outdir) + ".", dir=parent)
    except OSError as e:
        raise Fail("cannot write beside %s: %s" % (outdir, e.strerror))
    try:
        for rel, text in files.items():
            p = os.path.join(tmp, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w") as f:
                f.write(text.replace("@OUTDIR@", outdir))
        with open(os.path.join(tmp, MARKER), "w") as f:
            f.write("written by scripts/sim/platform.py\n")
        old = None
        if os.path.exists(outdir):
            old = tempfile.mkdtemp(prefix="." + os.path.basename(outdir) + ".old.", dir=parent)
            os.rename(outdir, os.path.join(old, "d"))
        os.rename(tmp, outdir)
        if old:
            shutil.rmtree(old, ignore_errors=True)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise Fail("writing %s: %s" % (outdir, e))
    return outdir


SIM_CFG = ("--cfg=network/model:CM02 --cfg=network/crosstraffic:0 "
           "--cfg=network/TCP-gamma:0")


def env_sh(host, nranks, ncpu, ncuda):
    room = 8 * max(nranks, 2)
    return ("# . this file: StarPU reads the per-rank description from here\n"
            "export STARPU_PERF_MODEL_DIR=@OUTDIR@/sampling\n"
            "export STARPU_HOSTNAME=%s\n"
            "export STARPU_NCUDA=%d\n"
            "export STARPU_NCPU=%d\n"
            "export STARPU_NOPENCL=0\n"
            "export RMOE_SIM_PLATFORM=@OUTDIR@/platform.xml\n"
            "export RMOE_SIM_HOSTFILE=@OUTDIR@/hostfile\n"
            "export RMOE_SIM_NP=%d\n"
            "# SMPI's default network model scales bandwidth and latency by factors\n"
            "# fitted to Ethernet clusters; these use the links' numbers as given.\n"
            "export RMOE_SIM_CFG='%s'\n"
            "# StarPU-MPI reads its room for sends before main in a SimGrid build,\n"
            "# before the context sets it (graph/context/ctx_starpu.c: eight per\n"
            "# rank, at least 16; a value of the environment kept): the same here.\n"
            "export STARPU_MPI_NDETACHED_SEND=${STARPU_MPI_NDETACHED_SEND:-%d}\n"
            "export STARPU_MPI_NREADY_PROCESS=${STARPU_MPI_NREADY_PROCESS:-%d}\n"
            % (host, ncuda, ncpu, nranks, SIM_CFG, room, room))


def main(argv):
    ap = argparse.ArgumentParser(
        prog="platform.py", description=__doc__.split("\n\n", 1)[0],
        epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cluster", nargs="?", help="cluster file (scheduler/clusters/*.cluster); not with --cpu")
    ap.add_argument("-n", "--ranks", type=int, required=True, help="MPI ranks (one GPU each in GPU mode)")
    ap.add_argument("-o", "--out", required=True, help="output folder")
    ap.add_argument("--cpu", action="store_true", help="describe this machine: CPU workers, no GPU")
    ap.add_argument("--cpus-per-rank", type=int, default=1,
                    help="GPU mode: CPU hosts in each rank's StarPU description (default 1; "
                         "env.sh sets STARPU_NCPU=0: the GPU does the work)")
    ap.add_argument("--transport", choices=TRANSPORTS, default="staged",
                    help="GPU mode: staged (host staging over PCIe, StarPU-MPI 1.3) or gpudirect "
                         "(the staging hop free); default staged")
    ap.add_argument("--shm-gbs", type=float, help="--cpu: GB/s between ranks (default: measured copy rate)")
    ap.add_argument("--shm-lat-us", type=float, default=1.0, help="--cpu: us per message (default 1)")
    ap.add_argument("--cpu-gflops", type=float, default=10.0,
                    help="--cpu: speed of a CPU host in GFLOP/s (only for tasks without a cost model)")
    ap.add_argument("--hostname", help="STARPU_HOSTNAME of the description (default rmoe-NAME-gpu / rmoe-cpu)")
    a = ap.parse_args(argv)

    if not 1 <= a.ranks <= MAX_RANKS:
        raise Fail("--ranks %d: expected 1 to %d" % (a.ranks, MAX_RANKS))
    if a.hostname is not None and not re.fullmatch(r"[A-Za-z0-9._-]{1,40}", a.hostname):
        raise Fail("--hostname '%s': expected 1 to 40 characters of A-Z a-z 0-9 . _ -" % a.hostname)

    files = {}
    if a.cpu:
        if a.cluster:
            raise Fail("--cpu describes this machine: no cluster file (got %s)" % a.cluster)
        shm_measured = a.shm_gbs is None
        shm = measure_copy_gbs() if shm_measured else a.shm_gbs
        if not (math.isfinite(shm) and 1e-6 <= shm <= 1e6):
            raise Fail("--shm-gbs %g: expected a positive number of GB/s (at most 1e6)" % shm)
        if not (math.isfinite(a.shm_lat_us) and 0 <= a.shm_lat_us <= 1e6):
            raise Fail("--shm-lat-us %g: expected 0 to 1e6" % a.shm_lat_us)
        if not (math.isfinite(a.cpu_gflops) and 1e-6 <= a.cpu_gflops <= 1e6):
            raise Fail("--cpu-gflops %g: expected a positive number" % a.cpu_gflops)
        c = {"name": "this-machine", "path": "(this machine, --cpu)", "gpu_link": "nvlink",
             "devices_per_node": 0, "nodes": 1, "ranks_per_node": a.ranks,
             "link": dict(DEFAULT_LINKS, shm=(shm, a.shm_lat_us))}
        node, device, how = [0] * a.ranks, [-1] * a.ranks, "all ranks on this machine"
        host = a.hostname or "rmoe-cpu"
        hosts = ["cpu-r%d" % r for r in range(a.ranks)]
        nd = node_description(host, 1, a.cpu_gflops * 1e9, None, None)
        ncpu, ncuda = 1, 0
        info_extra = {"shm_gbs": shm, "shm_measured": shm_measured, "shm_lat_us": a.shm_lat_us,
                      "cpu_gflops": a.cpu_gflops}
    else:
        if not a.cluster:
            raise Fail("a cluster file is needed (e.g. scheduler/clusters/mn5-acc.cluster), or --cpu")
        if not 1 <= a.cpus_per_rank <= 64:
            raise Fail("--cpus-per-rank %d: expected 1 to 64" % a.cpus_per_rank)
        c = parse_cluster(a.cluster)
        if c["devices_per_node"] == 0:
            raise Fail("cluster file %s: devices_per_node = 0 (CPU-only nodes): the GPU platform needs "
                       "devices; use --cpu for this machine" % a.cluster)
        node, device, how = place(c, a.ranks)
        host = a.hostname or "rmoe-%s-gpu" % c["name"]
        hosts = ["n%d-r%d" % (node[r], r) for r in range(a.ranks)]
        staging = c["link"]["pcie"] if a.transport == "staged" else (GPUDIRECT_GBS, 0.0)
        gpu = {"memsize": c["memory"], "flops": c["bf16_tflops"] * 1e12, "pcie": staging}
        nd = node_description(host, a.cpus_per_rank, 1e9, gpu, None)
        ncpu, ncuda = 0, 1
        info_extra = {"memory_bytes": c["memory"], "bf16_tflops": c["bf16_tflops"],
                      "f32_tflops": c["f32_tflops"], "pcie": c["link"]["pcie"],
                      "transport": a.transport, "staging_link": list(staging),
                      "links_from_file": [l for l in LINKS if c.get("link_from_file_" + l)]}

    files["platform.xml"] = smpi_platform(c, a.ranks, node, device, hosts)
    files["hostfile"] = "".join(h + "\n" for h in hosts)
    for ext, text in nd.items():
        files[os.path.join("sampling", "bus", "%s.%s" % (host, ext))] = text
    files["env.sh"] = env_sh(host, a.ranks, ncpu, ncuda)
    used = {}
    for i in range(a.ranks):
        for j in range(i + 1, a.ranks):
            cls = link_class(c, node, device, i, j)
            used[cls] = {"bandwidth_gbs": c["link"][cls][0], "latency_us": c["link"][cls][1]}
    info = {"cluster": c["name"], "cluster_file": c["path"], "mode": "cpu" if a.cpu else "gpu",
            "ranks": a.ranks, "nodes": len(set(node)), "placement": how, "node": node, "device": device,
            "hosts": hosts, "starpu_hostname": host, "links_used": used, "simgrid_cfg": SIM_CFG}
    info.update(info_extra)
    files["platform.json"] = json.dumps(info, indent=1) + "\n"
    out = write_out(a.out, files)
    links = ", ".join("%s %.4g GB/s %.3g us" % (k, v["bandwidth_gbs"], v["latency_us"])
                      for k, v in sorted(used.items()))
    print("platform.py: %s: %d ranks on %d node(s) (%s)%s%s -> %s"
          % (c["name"], a.ranks, len(set(node)), how, "; " + links if links else "",
             "" if a.cpu else "; transport %s" % a.transport, out))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Fail as e:
        print("platform.py: error: %s" % e, file=sys.stderr)
        sys.exit(1)
