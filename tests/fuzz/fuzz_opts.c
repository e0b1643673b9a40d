/* Fuzz target: the command-line parser (rmoe_opts_parse) with the option
 * kinds and ranges of `relaymoe run`, then what the program does with what
 * it accepted: the preset lookup, the layer configuration built from it,
 * rmoe_config_check and the memory model. The input is an argv, one
 * argument per line. Every refusal must say why (a non-empty message);
 * nothing may overflow (UBSan) or read out of bounds (ASan). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "opts.h"
#include "relaymoe/relaymoe.h"
#include "rmoe_memory_model.h"
#include "rmoe_scheduler.h"

#define MAX_ARGS 64

struct values {
	int64_t hidden, ffn, experts, topk, tokens, shared_ffn, chunk_rows, seed, repeat, mem_cap, ranks, partitions;
	double scale;
	const char *preset, *dispatch, *load, *ring_order, *dtype;
	int check, no_norm_topk, check_finite;
	int g_hidden, g_ffn, g_experts, g_topk, g_tokens, g_shared;
};

static int configure(const struct values *v, struct rmoe_layer_config *cfg)
{
	rmoe_layer_config_init(cfg);
	if (v->preset) {
		const struct rmoe_preset *p = rmoe_preset_find(v->preset);
		if (!p)
			return RMOE_EINVAL;
		cfg->hidden = (int64_t)llround((double)p->hidden / v->scale);
		cfg->ffn = (int64_t)llround((double)p->ffn / v->scale);
		cfg->tokens = (int64_t)llround(49152.0 / v->scale);
		cfg->shared_ffn = (int64_t)llround((double)p->shared_ffn / v->scale);
		cfg->experts = p->experts;
		cfg->topk = p->topk;
	}
	if (v->g_hidden) cfg->hidden = v->hidden;
	if (v->g_ffn) cfg->ffn = v->ffn;
	if (v->g_experts) cfg->experts = v->experts;
	if (v->g_topk) cfg->topk = v->topk;
	if (v->g_tokens) cfg->tokens = v->tokens;
	if (v->g_shared) cfg->shared_ffn = v->shared_ffn;
	cfg->norm_topk = !v->no_norm_topk;
	cfg->chunk_rows = v->chunk_rows;
	cfg->mem_cap = v->mem_cap;
	cfg->check_finite = v->check_finite;
	cfg->partitions = v->partitions;
	if (v->dtype && !strcmp(v->dtype, "bf16"))
		cfg->dtype = RMOE_DTYPE_BF16;
	if (v->dispatch && rmoe_dispatch_parse(v->dispatch, &cfg->dispatch) != 0)
		RMOE_FUZZ_REQUIRE(rmoe_strerror(RMOE_EINVAL)[0] != '\0');
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size > 4096)
		return 0;
	char *text = malloc(size + 1);
	if (!text)
		return 0;
	memcpy(text, data, size);
	text[size] = '\0';
	char *argv[MAX_ARGS + 2] = {"relaymoe", "run"};
	int argc = 2;
	for (char *s = text; argc < MAX_ARGS + 2;) {
		argv[argc++] = s;
		char *nl = memchr(s, '\n', (size_t)(text + size - s));
		if (!nl)
			break;
		*nl = '\0';
		s = nl + 1;
	}

	/* The kinds and ranges of cmd_run.c, plus a rank count and a wide
	 * integer that reaches the configuration checks' overflow guards. */
	struct values v = {.seed = 1, .repeat = 3, .scale = 1.0, .ranks = 1, .partitions = 1};
	const struct rmoe_opt opts[] = {
		{"hidden", RMOE_OPT_INT, &v.hidden, 1, 9.2e18, "H", "hidden size", &v.g_hidden},
		{"ffn", RMOE_OPT_INT, &v.ffn, 1, 9.2e18, "F", "expert FFN width", &v.g_ffn},
		{"experts", RMOE_OPT_INT, &v.experts, 1, 9.2e18, "E", "routed experts", &v.g_experts},
		{"topk", RMOE_OPT_INT, &v.topk, 1, 9.2e18, "K", "experts per token", &v.g_topk},
		{"tokens", RMOE_OPT_INT, &v.tokens, 1, 9.2e18, "T", "tokens per rank", &v.g_tokens},
		{"shared-ffn", RMOE_OPT_INT, &v.shared_ffn, 0, 9.2e18, "FS", "shared width", &v.g_shared},
		{"preset", RMOE_OPT_STRING, &v.preset, 0, 0, "NAME", "a Table 3 shape", NULL},
		{"scale", RMOE_OPT_DOUBLE, &v.scale, 1, 1e6, "S", "divide the preset", NULL},
		{"dispatch", RMOE_OPT_STRING, &v.dispatch, 0, 0, "D", "dispatch", NULL},
		{"seed", RMOE_OPT_INT, &v.seed, 0, 9.2e18, "N", "seed", NULL},
		{"repeat", RMOE_OPT_INT, &v.repeat, 1, 1000, "R", "repetitions", NULL},
		{"chunk-rows", RMOE_OPT_INT, &v.chunk_rows, 0, 9.2e18, "C", "chunk rows", NULL},
		{"mem-cap", RMOE_OPT_SIZE, &v.mem_cap, 1, 9e18, "BYTES", "memory cap", NULL},
		{"ranks", RMOE_OPT_INT, &v.ranks, 1, 4096, "N", "ranks", NULL},
		{"no-norm-topk", RMOE_OPT_FLAG, &v.no_norm_topk, 0, 0, NULL, "unnormalised", NULL},
		{"check", RMOE_OPT_FLAG, &v.check, 0, 0, NULL, "check", NULL},
		{"check-finite", RMOE_OPT_FLAG, &v.check_finite, 0, 0, NULL, "check finite", NULL},
		{"load", RMOE_OPT_STRING, &v.load, 0, 0, "DIR", "load", NULL},
		{"ring-order", RMOE_OPT_STRING, &v.ring_order, 0, 0, "planned|rank", "ring order", NULL},
		{"partitions", RMOE_OPT_INT, &v.partitions, 1, 9.2e18, "P", "partitions", NULL},
		{"dtype", RMOE_OPT_STRING, &v.dtype, 0, 0, "f32|bf16", "element type", NULL},
	};
	const size_t nopts = sizeof(opts) / sizeof(opts[0]);
	char msg[256];
	msg[0] = '\0';
	int rc = rmoe_opts_parse(opts, nopts, argc, argv, 2, msg, sizeof(msg));
	RMOE_FUZZ_REQUIRE(rc == 0 || rc == 1 || rc == RMOE_EINVAL);
	if (rc == RMOE_EINVAL)
		RMOE_FUZZ_REQUIRE(msg[0] != '\0' && strlen(msg) < sizeof(msg));
	if (rc == 1) {
		char help[2048];
		rmoe_opts_help(opts, nopts, help, sizeof(help));
		char small[16];
		rmoe_opts_help(opts, nopts, small, sizeof(small));
		RMOE_FUZZ_REQUIRE(strlen(small) < sizeof(small));
	}
	for (int i = 2; i < argc; i++) {
		int64_t bytes;
		if (rmoe_parse_size(argv[i], &bytes) == 0)
			RMOE_FUZZ_REQUIRE(bytes >= 0);
	}
	if (rc == 0) {
		struct rmoe_layer_config cfg;
		if (configure(&v, &cfg) == 0) {
			int crc = rmoe_config_check(&cfg, (int)v.ranks);
			if (crc)
				RMOE_FUZZ_REQUIRE(rmoe_strerror(crc)[0] != '\0');
			(void)rmoe_config_hash(&cfg);
			if (crc == 0 && cfg.dispatch != RMOE_DISPATCH_AUTO) {
				struct rmoe_mem_config mc;
				rmoe_mem_config_from_layer(&mc, &cfg, (int)v.ranks);
				struct rmoe_mem_estimate est;
				if (rmoe_memory_model(cfg.dispatch, &mc, &est) == 0)
					RMOE_FUZZ_REQUIRE(est.peak >= 0);
				int64_t chunk;
				if (cfg.mem_cap > 0)
					(void)rmoe_memory_cap_chunk(cfg.dispatch, &mc, cfg.mem_cap, &chunk);
			}
		} else {
			RMOE_FUZZ_REQUIRE(v.preset != NULL);
		}
	}
	free(text);
	return 0;
}
