/* Cluster descriptions (the format: docs/planning.md). The parser
 * takes untrusted bytes: it never reads past len, never relies on a NUL
 * terminator, bounds every number and list, and quotes input in messages only
 * after replacing unprintable bytes. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rmoe_plan.h"

static const char *const link_names[RMOE_LINK_COUNT] = {
	[RMOE_LINK_SAME_DEVICE] = "same_device",
	[RMOE_LINK_NVLINK] = "nvlink",
	[RMOE_LINK_PCIE] = "pcie",
	[RMOE_LINK_SHM] = "shm",
	[RMOE_LINK_NETWORK] = "network",
};

const char *rmoe_link_name(enum rmoe_link_class link)
{
	if ((unsigned)link < RMOE_LINK_COUNT)
		return link_names[link];
	return "invalid";
}

void rmoe_cluster_defaults(struct rmoe_cluster *c)
{
	memset(c, 0, sizeof(*c));
	/* The per-GPU numbers of scheduler/clusters/mn5-acc.cluster, where each
	 * has its source, on one node. */
	snprintf(c->name, sizeof(c->name), "defaults");
	c->nodes = 1;
	c->devices_per_node = 0;
	c->ranks_per_node = 1;
	c->gpu_link = RMOE_LINK_NVLINK;
	c->link[RMOE_LINK_SAME_DEVICE] = (struct rmoe_link){800.0, 5.0};
	c->link[RMOE_LINK_NVLINK] = (struct rmoe_link){130.0, 2.0};
	c->link[RMOE_LINK_PCIE] = (struct rmoe_link){50.0, 3.0};
	c->link[RMOE_LINK_SHM] = (struct rmoe_link){12.0, 1.0};
	c->link[RMOE_LINK_NETWORK] = (struct rmoe_link){24.0, 2.0};
	c->bf16_tflops = 400.0;
	c->f32_tflops = 50.0;
	c->memory_bytes = 64LL << 30;
}

void rmoe_cluster_free(struct rmoe_cluster *c)
{
	if (!c)
		return;
	free(c->rank_nodes);
	free(c->rank_devices);
	c->rank_nodes = NULL;
	c->rank_devices = NULL;
	c->nplaced = 0;
}

/* ---- the parser ------------------------------------------------------------ */

enum section { SEC_TOP, SEC_DEVICE, SEC_LINK, SEC_PLACEMENT };

enum key {
	K_NAME, K_NODES, K_DEVICES, K_RANKS, K_GPU_LINK, K_NICS,
	K_BF16, K_F32, K_MEMORY,
	K_RANK_NODES, K_RANK_DEVICES,
	K_BANDWIDTH, K_LATENCY,   /* per link: seen[] index K_BANDWIDTH + 2 * link */
	K_COUNT = K_BANDWIDTH + 2 * RMOE_LINK_COUNT
};

static const struct {
	enum section section;
	const char *name;
} keys[] = {
	[K_NAME] = {SEC_TOP, "name"},
	[K_NODES] = {SEC_TOP, "nodes"},
	[K_DEVICES] = {SEC_TOP, "devices_per_node"},
	[K_RANKS] = {SEC_TOP, "ranks_per_node"},
	[K_GPU_LINK] = {SEC_TOP, "gpu_link"},
	[K_NICS] = {SEC_TOP, "nics_per_node"},
	[K_BF16] = {SEC_DEVICE, "bf16_tflops"},
	[K_F32] = {SEC_DEVICE, "f32_tflops"},
	[K_MEMORY] = {SEC_DEVICE, "memory"},
	[K_RANK_NODES] = {SEC_PLACEMENT, "rank_nodes"},
	[K_RANK_DEVICES] = {SEC_PLACEMENT, "rank_devices"},
	[K_BANDWIDTH] = {SEC_LINK, "bandwidth_gbs"},
	[K_LATENCY] = {SEC_LINK, "latency_us"},
};
#define NKEYS ((int)(sizeof(keys) / sizeof(keys[0])))

struct parser {
	int line;
	enum section section;
	enum rmoe_link_class link;   /* of the open [link] section */
	int seen[K_COUNT];           /* line where each key was set; 0 = not yet */
	int rank_devices_count;      /* checked against rank_nodes at the end */
	struct rmoe_cluster *c;
};

static int is_space(char ch)
{
	return ch == ' ' || ch == '\t' || ch == '\r' || ch == '\v' || ch == '\f';
}

static void trim(const char **s, size_t *n)
{
	while (*n && is_space(**s)) {
		(*s)++;
		(*n)--;
	}
	while (*n && is_space((*s)[*n - 1]))
		(*n)--;
}

/* Up to 40 bytes of input, printable, for a message. */
static const char *quote(const char *s, size_t n, char buf[48])
{
	size_t m = n < 40 ? n : 40;
	for (size_t i = 0; i < m; i++) {
		unsigned char ch = (unsigned char)s[i];
		buf[i] = (ch >= 0x20 && ch < 0x7f) ? (char)ch : '?';
	}
	buf[m] = '\0';
	if (n > m)
		memcpy(buf + m, "...", 4);
	return buf;
}

static int fail(const struct parser *ps, const char *what, const char *s, size_t n, const char *expected)
{
	char q[48];
	return rmoe_error(RMOE_EFORMAT, "line %d: %s '%s': expected %s", ps->line, what, quote(s, n, q),
	                  expected);
}

static int same(const char *s, size_t n, const char *word)
{
	return strlen(word) == n && memcmp(s, word, n) == 0;
}

/* A decimal integer in [min, max], digits only. */
static int parse_int(const char *s, size_t n, int64_t min, int64_t max, int64_t *out)
{
	if (n == 0 || n > 18)   /* 18 digits cannot overflow int64 */
		return -1;
	int64_t v = 0;
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -1;
		v = v * 10 + (s[i] - '0');
	}
	if (v < min || v > max)
		return -1;
	*out = v;
	return 0;
}

/* A finite number in [min, max] (strtod's syntax, on a bounded copy). */
static int parse_double(const char *s, size_t n, double min, double max, double *out)
{
	char buf[64];
	if (n == 0 || n >= sizeof(buf))
		return -1;
	memcpy(buf, s, n);
	buf[n] = '\0';
	char *end;
	errno = 0;
	double v = strtod(buf, &end);
	if (errno || end != buf + n || !isfinite(v) || v < min || v > max)
		return -1;
	*out = v;
	return 0;
}

/* A byte count with an optional K/M/G/T (powers of 1024) suffix, "i" and "B"
 * allowed after it: 64G, 64GiB, 68719476736. */
static int parse_bytes(const char *s, size_t n, int64_t *out)
{
	size_t digits = n;
	double mult = 1;
	if (digits && s[digits - 1] == 'B')
		digits--;
	if (digits && s[digits - 1] == 'i')
		digits--;
	if (digits) {
		switch (s[digits - 1]) {
		case 'K': mult = 1024.0; break;
		case 'M': mult = 1024.0 * 1024; break;
		case 'G': mult = 1024.0 * 1024 * 1024; break;
		case 'T': mult = 1024.0 * 1024 * 1024 * 1024; break;
		default: break;
		}
	}
	if (mult > 1)
		digits--;
	else if (digits != n)
		return -1;   /* "B" or "iB" without a unit letter */
	double v;
	if (parse_double(s, digits, 1, 1e18, &v))
		return -1;
	v *= mult;
	if (v < 1 || v > 4.0e18 || v != floor(v))
		return -1;
	*out = (int64_t)v;
	return 0;
}

int rmoe_parse_bytes(const char *s, int64_t *out)
{
	return s ? parse_bytes(s, strlen(s), out) : -1;
}

/* A whitespace-separated list of integers in [0, max]. */
static int parse_list(struct parser *ps, const char *key, const char *s, size_t n, int max, int **out,
                      int *count)
{
	int cnt = 0;
	for (size_t i = 0; i < n;) {
		while (i < n && is_space(s[i]))
			i++;
		if (i == n)
			break;
		while (i < n && !is_space(s[i]))
			i++;
		if (++cnt > RMOE_CLUSTER_MAX_RANKS)
			return rmoe_error(RMOE_EFORMAT, "line %d: %s lists more than %d ranks", ps->line, key,
			                  RMOE_CLUSTER_MAX_RANKS);
	}
	if (cnt == 0)
		return rmoe_error(RMOE_EFORMAT, "line %d: %s lists no rank", ps->line, key);
	int *v = malloc(sizeof(int) * (size_t)cnt);
	if (!v)
		return rmoe_error(RMOE_ENOMEM, "line %d: out of host memory for %s", ps->line, key);
	int k = 0;
	for (size_t i = 0; i < n;) {
		while (i < n && is_space(s[i]))
			i++;
		if (i == n)
			break;
		size_t b = i;
		while (i < n && !is_space(s[i]))
			i++;
		int64_t x;
		if (parse_int(s + b, i - b, 0, max, &x)) {
			char q[48], what[64];
			snprintf(what, sizeof(what), "entry %d of %s", k, key);
			char expected[64];
			snprintf(expected, sizeof(expected), "an integer from 0 to %d", max);
			free(v);
			return rmoe_error(RMOE_EFORMAT, "line %d: %s '%s': expected %s", ps->line, what,
			                  quote(s + b, i - b, q), expected);
		}
		v[k++] = (int)x;
	}
	*out = v;
	*count = cnt;
	return 0;
}

static int parse_section(struct parser *ps, const char *s, size_t n)
{
	if (n < 2 || s[n - 1] != ']')
		return fail(ps, "section header", s, n, "[device], [placement] or [link NAME]");
	const char *in = s + 1;
	size_t m = n - 2;
	trim(&in, &m);
	if (same(in, m, "device")) {
		ps->section = SEC_DEVICE;
		return 0;
	}
	if (same(in, m, "placement")) {
		ps->section = SEC_PLACEMENT;
		return 0;
	}
	if (m > 4 && memcmp(in, "link", 4) == 0 && is_space(in[4])) {
		const char *nm = in + 4;
		size_t nl = m - 4;
		trim(&nm, &nl);
		for (int l = 0; l < RMOE_LINK_COUNT; l++)
			if (same(nm, nl, link_names[l])) {
				ps->section = SEC_LINK;
				ps->link = (enum rmoe_link_class)l;
				return 0;
			}
		return fail(ps, "link", nm, nl, "same_device, nvlink, pcie, shm or network");
	}
	return fail(ps, "section", s, n, "[device], [placement] or [link NAME]");
}

static int set_value(struct parser *ps, enum key k, const char *v, size_t n)
{
	struct rmoe_cluster *c = ps->c;
	int64_t x;
	double d;
	switch (k) {
	case K_NAME:
		if (n == 0 || n >= RMOE_CLUSTER_NAME_MAX)
			return fail(ps, "name", v, n, "1 to 63 characters of A-Z a-z 0-9 . _ -");
		for (size_t i = 0; i < n; i++) {
			char ch = v[i];
			if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
			      ch == '.' || ch == '_' || ch == '-'))
				return fail(ps, "name", v, n, "1 to 63 characters of A-Z a-z 0-9 . _ -");
		}
		memcpy(c->name, v, n);
		c->name[n] = '\0';
		return 0;
	case K_NODES:
		if (parse_int(v, n, 1, RMOE_CLUSTER_MAX_NODES, &x))
			return fail(ps, "nodes", v, n, "an integer from 1 to 1000000");
		c->nodes = (int)x;
		return 0;
	case K_DEVICES:
		if (parse_int(v, n, 0, RMOE_CLUSTER_MAX_PER_NODE, &x))
			return fail(ps, "devices_per_node", v, n, "an integer from 0 (CPU only) to 4096");
		c->devices_per_node = (int)x;
		return 0;
	case K_RANKS:
		if (parse_int(v, n, 1, RMOE_CLUSTER_MAX_PER_NODE, &x))
			return fail(ps, "ranks_per_node", v, n, "an integer from 1 to 4096");
		c->ranks_per_node = (int)x;
		return 0;
	case K_GPU_LINK:
		if (same(v, n, "nvlink"))
			c->gpu_link = RMOE_LINK_NVLINK;
		else if (same(v, n, "pcie"))
			c->gpu_link = RMOE_LINK_PCIE;
		else
			return fail(ps, "gpu_link", v, n, "nvlink or pcie");
		return 0;
	case K_NICS:
		if (parse_int(v, n, 1, RMOE_CLUSTER_MAX_PER_NODE, &x))
			return fail(ps, "nics_per_node", v, n, "an integer from 1 to 4096");
		c->nics_per_node = (int)x;
		return 0;
	case K_BF16:
	case K_F32:
		if (parse_double(v, n, 1e-6, 1e6, &d))
			return fail(ps, keys[k].name, v, n, "a positive number of TFLOP/s (at most 1e6)");
		*(k == K_BF16 ? &c->bf16_tflops : &c->f32_tflops) = d;
		return 0;
	case K_MEMORY:
		if (parse_bytes(v, n, &c->memory_bytes))
			return fail(ps, "memory", v, n, "a byte count such as 64G, 80GiB or 68719476736");
		return 0;
	case K_RANK_NODES:
		return parse_list(ps, "rank_nodes", v, n, RMOE_CLUSTER_MAX_NODES - 1, &c->rank_nodes,
		                  &c->nplaced);
	case K_RANK_DEVICES:
		return parse_list(ps, "rank_devices", v, n, RMOE_CLUSTER_MAX_PER_NODE - 1, &c->rank_devices,
		                  &ps->rank_devices_count);
	default:
		break;
	}
	return 0;
}

static int parse_link_value(struct parser *ps, int is_latency, const char *v, size_t n)
{
	struct rmoe_link *l = &ps->c->link[ps->link];
	double d;
	if (is_latency) {
		if (parse_double(v, n, 0, 1e6, &d))
			return fail(ps, "latency_us", v, n, "a number of microseconds from 0 to 1e6");
		l->latency_us = d;
	} else {
		if (parse_double(v, n, 1e-6, 1e6, &d))
			return fail(ps, "bandwidth_gbs", v, n, "a positive number of GB/s (at most 1e6)");
		l->bandwidth_gbs = d;
	}
	return 0;
}

static int parse_pair(struct parser *ps, const char *s, size_t n)
{
	const char *eq = memchr(s, '=', n);
	if (!eq)
		return fail(ps, "text", s, n, "'key = value' or a [section] header");
	const char *k = s, *v = eq + 1;
	size_t kn = (size_t)(eq - s), vn = n - kn - 1;
	trim(&k, &kn);
	trim(&v, &vn);
	if (kn == 0)
		return fail(ps, "line", s, n, "a key before '='");
	int found = -1;
	for (int i = 0; i < NKEYS; i++)
		if (keys[i].name && same(k, kn, keys[i].name)) {
			found = i;
			break;
		}
	if (found < 0 || keys[found].section != ps->section) {
		static const char *const where[] = {
			[SEC_TOP] = "before any section: name, nodes, devices_per_node, ranks_per_node, gpu_link, "
			            "nics_per_node",
			[SEC_DEVICE] = "in [device]: bf16_tflops, f32_tflops, memory",
			[SEC_LINK] = "in [link]: bandwidth_gbs, latency_us",
			[SEC_PLACEMENT] = "in [placement]: rank_nodes, rank_devices",
		};
		return fail(ps, "key", k, kn, where[ps->section]);
	}
	int slot = found;
	if (ps->section == SEC_LINK)
		slot = K_BANDWIDTH + 2 * (int)ps->link + (found == K_LATENCY);
	if (ps->seen[slot]) {
		char q[48];
		return rmoe_error(RMOE_EFORMAT, "line %d: '%s' is already set on line %d", ps->line,
		                  quote(k, kn, q), ps->seen[slot]);
	}
	if (vn == 0)
		return fail(ps, "value of", k, kn, "a value after '='");
	ps->seen[slot] = ps->line;
	if (ps->section == SEC_LINK)
		return parse_link_value(ps, found == K_LATENCY, v, vn);
	return set_value(ps, (enum key)found, v, vn);
}

static int cmp_int(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;
	return (x > y) - (x < y);
}

/* What the whole description must satisfy once every line is read.
 * Long: one check per rule of the format (docs/planning.md), each naming what is
 * missing or inconsistent. */
static int check_complete(const struct parser *ps)
{
	struct rmoe_cluster *c = ps->c;
	static const enum key required[] = {K_NAME, K_NODES, K_DEVICES, K_RANKS, K_BF16, K_F32, K_MEMORY};
	static const char *const example[] = {
		[K_NAME] = "name = my-cluster", [K_NODES] = "nodes = 2", [K_DEVICES] = "devices_per_node = 4",
		[K_RANKS] = "ranks_per_node = 4", [K_BF16] = "bf16_tflops = 400 in [device]",
		[K_F32] = "f32_tflops = 50 in [device]", [K_MEMORY] = "memory = 64G in [device]",
	};
	for (size_t i = 0; i < sizeof(required) / sizeof(required[0]); i++)
		if (!ps->seen[required[i]])
			return rmoe_error(RMOE_EFORMAT, "line %d (end of input): '%s' is missing; expected e.g. '%s'",
			                  ps->line, keys[required[i]].name, example[required[i]]);
	if (c->devices_per_node > 1 && !ps->seen[K_GPU_LINK])
		return rmoe_error(RMOE_EFORMAT,
		                  "line %d (end of input): 'gpu_link' is missing; devices_per_node = %d needs "
		                  "'gpu_link = nvlink' or 'gpu_link = pcie'",
		                  ps->line, c->devices_per_node);

	for (int l = 0; l < RMOE_LINK_COUNT; l++) {
		int bw = K_BANDWIDTH + 2 * l;
		if (ps->seen[bw] != 0 && !ps->seen[bw + 1])
			return rmoe_error(RMOE_EFORMAT, "line %d: [link %s] has bandwidth_gbs but no latency_us",
			                  ps->seen[bw], link_names[l]);
		if (ps->seen[bw + 1] != 0 && !ps->seen[bw])
			return rmoe_error(RMOE_EFORMAT, "line %d: [link %s] has latency_us but no bandwidth_gbs",
			                  ps->seen[bw + 1], link_names[l]);
	}

	struct {
		int needed;
		enum rmoe_link_class link;
		const char *why;
	} need[] = {
		{c->nodes > 1, RMOE_LINK_NETWORK, "nodes > 1 needs the link between nodes"},
		{c->devices_per_node > 1, c->gpu_link, "devices_per_node > 1 needs the GPU-GPU link of gpu_link"},
		{c->devices_per_node > 0 && c->ranks_per_node > c->devices_per_node, RMOE_LINK_SAME_DEVICE,
		 "ranks_per_node > devices_per_node puts ranks on a shared device"},
		{c->devices_per_node == 0 && c->ranks_per_node > 1, RMOE_LINK_SHM,
		 "CPU-only nodes with several ranks need the host shared-memory link"},
	};
	for (size_t i = 0; i < sizeof(need) / sizeof(need[0]); i++) {
		int bw = K_BANDWIDTH + 2 * (int)need[i].link;
		if (need[i].needed && (!ps->seen[bw] || !ps->seen[bw + 1]))
			return rmoe_error(RMOE_EFORMAT,
			                  "line %d (end of input): [link %s] with bandwidth_gbs and latency_us is "
			                  "missing: %s",
			                  ps->line, link_names[need[i].link], need[i].why);
	}
	if (ps->seen[K_RANK_DEVICES]) {
		if (!ps->seen[K_RANK_NODES])
			return rmoe_error(RMOE_EFORMAT, "line %d: rank_devices needs rank_nodes in [placement]",
			                  ps->seen[K_RANK_DEVICES]);
		if (ps->rank_devices_count != c->nplaced)
			return rmoe_error(RMOE_EFORMAT,
			                  "line %d: rank_devices lists %d ranks but rank_nodes (line %d) lists %d",
			                  ps->seen[K_RANK_DEVICES], ps->rank_devices_count, ps->seen[K_RANK_NODES],
			                  c->nplaced);
		for (int r = 0; r < c->nplaced; r++)
			if (c->rank_devices[r] >= c->devices_per_node)
				return rmoe_error(RMOE_EFORMAT,
				                  "line %d: rank_devices gives rank %d device %d: expected a device "
				                  "below devices_per_node = %d",
				                  ps->seen[K_RANK_DEVICES], r, c->rank_devices[r], c->devices_per_node);
	}
	if (ps->seen[K_RANK_NODES]) {
		if (c->nplaced == 0)
			return rmoe_error(RMOE_EFORMAT, "line %d: rank_nodes lists no rank", ps->seen[K_RANK_NODES]);
		for (int r = 0; r < c->nplaced; r++)
			if (c->rank_nodes[r] >= c->nodes)
				return rmoe_error(RMOE_EFORMAT,
				                  "line %d: rank_nodes puts rank %d on node %d: expected a node below "
				                  "nodes = %d",
				                  ps->seen[K_RANK_NODES], r, c->rank_nodes[r], c->nodes);
		int *sorted = malloc(sizeof(int) * (size_t)c->nplaced);
		if (!sorted)
			return rmoe_error(RMOE_ENOMEM, "out of host memory checking rank_nodes");
		memcpy(sorted, c->rank_nodes, sizeof(int) * (size_t)c->nplaced);
		qsort(sorted, (size_t)c->nplaced, sizeof(int), cmp_int);
		int rc = 0;
		for (int i = 0, run = 1; i < c->nplaced && !rc; i++, run++) {
			if (i > 0 && sorted[i] != sorted[i - 1])
				run = 1;
			if (run > c->ranks_per_node)
				rc = rmoe_error(RMOE_EFORMAT,
				                "line %d: rank_nodes puts more than ranks_per_node = %d ranks on node %d",
				                ps->seen[K_RANK_NODES], c->ranks_per_node, sorted[i]);
		}
		free(sorted);
		if (rc)
			return rc;
	}
	return 0;
}

int rmoe_cluster_parse(const char *text, size_t len, struct rmoe_cluster *out)
{
	if (!out)
		return rmoe_error(RMOE_EINVAL, "rmoe_cluster_parse: out is NULL");
	memset(out, 0, sizeof(*out));
	out->gpu_link = RMOE_LINK_NVLINK;
	if (!text && len)
		return rmoe_error(RMOE_EINVAL, "rmoe_cluster_parse: text is NULL");
	if (len > RMOE_CLUSTER_MAX_FILE_BYTES)
		return rmoe_error(RMOE_EFORMAT, "cluster description of %zu bytes: expected at most %d",
		                  len, RMOE_CLUSTER_MAX_FILE_BYTES);

	struct parser ps;
	memset(&ps, 0, sizeof(ps));
	ps.c = out;
	ps.section = SEC_TOP;
	int rc = 0;
	size_t pos = 0;
	while (pos < len && !rc) {
		ps.line++;
		const char *s = text + pos;
		const char *nl = memchr(s, '\n', len - pos);
		size_t n = nl ? (size_t)(nl - s) : len - pos;
		pos += n + (nl ? 1 : 0);
		if (memchr(s, '\0', n)) {
			rc = rmoe_error(RMOE_EFORMAT, "line %d: a NUL byte: expected text", ps.line);
			break;
		}
		const char *hash = memchr(s, '#', n);
		if (hash)
			n = (size_t)(hash - s);
		trim(&s, &n);
		if (n == 0)
			continue;
		if (s[0] == '[')
			rc = parse_section(&ps, s, n);
		else
			rc = parse_pair(&ps, s, n);
	}
	if (!rc)
		rc = check_complete(&ps);
	if (rc)
		rmoe_cluster_free(out);
	return rc;
}
