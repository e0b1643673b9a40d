/* The option sets the subcommands share, each written once: the layer's
 * shape (run, plan, train), a Table 3 preset (run, plan), the ring and the
 * element type (run, plan), the seed (run, train). A subcommand puts them
 * in arrays of its own, beside its own options, and lists the arrays as
 * sets (RMOE_OPT_SET, support/opts.h): every array is sized by the
 * compiler, and an option has one name, one range and one help line in
 * every subcommand that takes it. */
#ifndef RMOE_OPTIONS_H
#define RMOE_OPTIONS_H

#include <stddef.h>
#include <stdint.h>

#include "opts.h"
#include "relaymoe/relaymoe.h"
#include "rmoe_scheduler.h"

/* What the parser accepts, the same in every subcommand: the bounds of a
 * sane value. What the layer can hold is checked after it: the products
 * the layer forms (rows times widths, partition and shared expert weights)
 * by rmoe_config_check, the planner's dimensions by rmoe_routing_check. */
#define RMOE_OPT_MAX_WIDTH 1e9      /* --hidden, --ffn, --shared-ffn */
#define RMOE_OPT_MAX_EXPERTS 1e6    /* --experts, --topk */
#define RMOE_OPT_MAX_TOKENS 1e12    /* --tokens, --seq */
#define RMOE_OPT_MAX_SEED 9.2e18    /* below INT64_MAX as a double */

/* The layer's shape; g_* say which were given (an explicit value wins
 * over a preset's). */
struct rmoe_shape_opts {
	int64_t hidden, ffn, experts, topk, tokens, shared_ffn;
	int g_hidden, g_ffn, g_experts, g_topk, g_tokens, g_shared;
};
#define RMOE_SHAPE_OPTIONS(s)                                                                                  \
	{"hidden", RMOE_OPT_INT, &(s)->hidden, 1, RMOE_OPT_MAX_WIDTH, "H", "hidden size", &(s)->g_hidden},     \
	{"ffn", RMOE_OPT_INT, &(s)->ffn, 1, RMOE_OPT_MAX_WIDTH, "F", "expert FFN width", &(s)->g_ffn},         \
	{"experts", RMOE_OPT_INT, &(s)->experts, 1, RMOE_OPT_MAX_EXPERTS, "E",                                 \
	 "routed experts, a multiple of the rank count N", &(s)->g_experts},                                   \
	{"topk", RMOE_OPT_INT, &(s)->topk, 1, RMOE_OPT_MAX_EXPERTS, "K", "experts per token", &(s)->g_topk},   \
	{"tokens", RMOE_OPT_INT, &(s)->tokens, 1, RMOE_OPT_MAX_TOKENS, "T", "tokens per rank", &(s)->g_tokens}, \
	{"shared-ffn", RMOE_OPT_INT, &(s)->shared_ffn, 0, RMOE_OPT_MAX_WIDTH, "FS",                            \
	 "shared expert width (0: none)", &(s)->g_shared}

/* A Table 3 shape, scaled down (scale 1: none). */
struct rmoe_preset_opts {
	const char *preset;
	double scale;
};
#define RMOE_PRESET_OPTIONS(p)                                                                                 \
	{"preset", RMOE_OPT_STRING, &(p)->preset, 0, 0, "NAME", "a Table 3 shape (below)", NULL},             \
	{"scale", RMOE_OPT_DOUBLE, &(p)->scale, 1, 1e6, "S", "divide the preset's H, F, FS and tokens by S", NULL}
#define RMOE_PRESET_NOTE                                                                                       \
	"  --preset takes a Table 3 shape (Qwen3-30B-A3B, Qwen3.5-35B-A3B, Qwen2-57B-A14B,\n"                   \
	"  MoE-E64/E128/E384, MoE-K4/K8/K12/K16, MoE-H512/H768/H2048) with 49152 tokens\n"                     \
	"  per rank (the paper's §2 profile) and its model's routing: Qwen2-57B-A14B does not\n"               \
	"  renormalise the top-k and gates its shared expert of 20480, Qwen3.5-35B-A3B gates\n"                \
	"  one of 512, the others are Qwen3-style (renormalised, no shared expert);\n"                          \
	"  --hidden, --ffn, --tokens etc. win over it.\n"

/* The layer's routing as one line ("top-k renormalised, gated shared expert
 * of 1280 (Qwen2-MoE)"), for run and plan. */
void rmoe_app_routing_line(const struct rmoe_layer_config *cfg, char *line, size_t len);

/* The element type, the ring and its memory cap. */
struct rmoe_ring_opts {
	const char *dtype;         /* f32 | bf16 */
	const char *ring_order;    /* planned | rank */
	int64_t mem_cap;           /* bytes; 0: none */
	int64_t window;            /* the rings' receive buffers per relayed kind; 0: default */
	int64_t chunk_rows;        /* rows per chunk of a hop or block; 0: whole */
	int64_t stripes;           /* the rings: per node-crossing hop; 0: as planned */
};
#define RMOE_RING_OPTIONS(o)                                                                                   \
	{"dtype", RMOE_OPT_STRING, &(o)->dtype, 0, 0, "f32|bf16",                                              \
	 "element type of weights, activations and transfers", NULL},                                          \
	{"ring-order", RMOE_OPT_STRING, &(o)->ring_order, 0, 0, "planned|rank",                               \
	 "the ring: planned from the topology, or rank order", NULL},                                          \
	{"mem-cap", RMOE_OPT_SIZE, &(o)->mem_cap, 1, 9e18, "BYTES",                                           \
	 "keep each ring layer's and a2a's peak under BYTES (e.g. 64M): hops or blocks in chunks", NULL},      \
	{"window", RMOE_OPT_INT, &(o)->window, 0, 1e6, "W",                                                   \
	 "rings: receive at most W hops ahead of what was consumed (0: 2); all-to-alls: W blocks or chunks in " \
	 "flight per role (0: every peer's, 2 under --mem-cap); W >= 2", NULL},                               \
	{"chunk-rows", RMOE_OPT_INT, &(o)->chunk_rows, 0, 1e12, "C",                                          \
	 "split each hop (a2a: each exchanged block) into chunks of C rows", NULL},                            \
	{"stripes", RMOE_OPT_INT, &(o)->stripes, 0, RMOE_STRIPES_MAX, "S",                                    \
	 "ring: each node-crossing hop in S stripes, one per network adapter, relayed over the GPU links (0: " \
	 "as planned, the node's adapters; 1: the flat ring)", NULL}

/* The seed every random tensor of the command is drawn from. */
#define RMOE_SEED_OPTION(dst)                                                                                  \
	{"seed", RMOE_OPT_INT, (dst), 0, RMOE_OPT_MAX_SEED, "N", "seed of the random weights and inputs", NULL}

/* A subcommand's options: parsed from argv[first..argc) into the sets'
 * destinations, or --help printed on rank 0 (head, the sets, tail).
 * Returns 0, 1 after --help, or a negative RMOE_E* code with msg naming
 * the bad option. */
int rmoe_app_options(const struct rmoe_opt_set *sets, size_t nsets, int argc, char **argv, int first,
                     const char *head, const char *tail, char *msg, size_t len);

/* The layer configuration of a preset (may be NULL: none) and the shape's
 * given values over it; 0 or RMOE_EINVAL with msg. */
int rmoe_app_shape_config(const struct rmoe_preset_opts *p, const struct rmoe_shape_opts *s,
                          struct rmoe_layer_config *cfg, char *msg, size_t len);

/* The element type, the memory cap and the window into cfg, the ring
 * order checked (the window by rmoe_config_check);
 * 0 or RMOE_EINVAL with msg naming the value. */
int rmoe_app_ring_config(const struct rmoe_ring_opts *o, struct rmoe_layer_config *cfg, char *msg, size_t len);

/* --tokens-per-rank: list, comma-separated whole counts >= 0 (at most
 * RMOE_OPT_MAX_TOKENS), exactly one per rank of nranks, not all 0, into
 * counts[nranks]; their largest into *most. 0, or RMOE_EINVAL with msg
 * naming the value and the number of ranks. */
int rmoe_app_rank_tokens(const char *list, int nranks, int64_t *counts, int64_t *most, char *msg, size_t len);

/* The dispatchers a --dispatch value names into which (room for every
 * dispatcher), ring first, since ratios are against it: a name, both (ring
 * and a2a), baselines (ring and every all-to-all), all, or a comma list of
 * these (each dispatcher once, in that order). 0, with msg, when a word is
 * none of them or auto is not alone. */
int rmoe_app_dispatch_list(const char *d, enum rmoe_dispatch *which, char *msg, size_t len);

#endif
