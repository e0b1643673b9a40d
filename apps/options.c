/* What the subcommands do with the option sets they share (options.h). */
#include <stdio.h>
#include <string.h>

#include "app.h"
#include "options.h"
#include "rmoe_scheduler.h"

int rmoe_app_options(const struct rmoe_opt_set *sets, size_t nsets, int argc, char **argv, int first,
                     const char *head, const char *tail, char *msg, size_t len)
{
	int rc = rmoe_opts_parse_sets(sets, nsets, argc, argv, first, msg, len);
	if (rc == 1) {
		char help[16384];
		rmoe_opts_help_sets(sets, nsets, help, sizeof(help));
		rmoe_app_say("%s%s%s", head, help, tail);
	}
	return rc;
}

int rmoe_app_shape_config(const struct rmoe_preset_opts *p, const struct rmoe_shape_opts *s,
                          struct rmoe_layer_config *cfg, char *msg, size_t len)
{
	rmoe_layer_config_init(cfg);
	if (p && p->preset) {
		if (rmoe_preset_apply(p->preset, p->scale, cfg, msg, len))
			return RMOE_EINVAL;
	} else if (p && p->scale != 1.0) {
		snprintf(msg, len, "--scale %g needs --preset", p->scale);
		return RMOE_EINVAL;
	}
	if (s->g_hidden) cfg->hidden = s->hidden;
	if (s->g_ffn) cfg->ffn = s->ffn;
	if (s->g_experts) cfg->experts = s->experts;
	if (s->g_topk) cfg->topk = s->topk;
	if (s->g_tokens) cfg->tokens = s->tokens;
	if (s->g_shared) cfg->shared_ffn = s->shared_ffn;
	if (cfg->shared_ffn == 0) cfg->shared_gated = 0;
	return 0;
}

void rmoe_app_routing_line(const struct rmoe_layer_config *cfg, char *line, size_t len)
{
	const char *norm = cfg->norm_topk ? "top-k renormalised" : "top-k not renormalised";
	if (cfg->shared_ffn <= 0)
		snprintf(line, len, "%s, no shared expert", norm);
	else
		snprintf(line, len, "%s, %s shared expert of %lld", norm,
		         cfg->shared_gated ? "gated (Qwen2-MoE)" : "ungated (DeepSeek-style)", (long long)cfg->shared_ffn);
}

int rmoe_app_ring_config(const struct rmoe_ring_opts *o, struct rmoe_layer_config *cfg, char *msg, size_t len)
{
	if (!strcmp(o->dtype, "bf16")) {
		cfg->dtype = RMOE_DTYPE_BF16;
	} else if (!strcmp(o->dtype, "f32")) {
		cfg->dtype = RMOE_DTYPE_F32;
	} else {
		snprintf(msg, len, "--dtype '%s': expected f32 or bf16", o->dtype);
		return RMOE_EINVAL;
	}
	if (strcmp(o->ring_order, "planned") && strcmp(o->ring_order, "rank")) {
		snprintf(msg, len, "--ring-order '%s': expected planned or rank", o->ring_order);
		return RMOE_EINVAL;
	}
	cfg->mem_cap = o->mem_cap;
	cfg->window = (int)o->window;
	return 0;
}

#define DISPATCH_BIT(d) (1u << (d))

/* The dispatchers one word of --dispatch names, as bits; 0: none. */
static unsigned dispatch_word(const char *word)
{
	const unsigned both = DISPATCH_BIT(RMOE_DISPATCH_RING_EXPERT) | DISPATCH_BIT(RMOE_DISPATCH_ALLTOALL),
	               baselines = both | DISPATCH_BIT(RMOE_DISPATCH_ALLTOALL_MEGATRON) |
	                           DISPATCH_BIT(RMOE_DISPATCH_ALLTOALL_DEEPEP);
	enum rmoe_dispatch d;
	if (!strcmp(word, "both"))
		return both;
	if (!strcmp(word, "baselines"))
		return baselines;
	if (!strcmp(word, "all"))
		return baselines | DISPATCH_BIT(RMOE_DISPATCH_RING_TOKEN);
	return rmoe_dispatch_parse(word, &d) ? 0 : DISPATCH_BIT(d);
}

int rmoe_app_dispatch_list(const char *d, enum rmoe_dispatch *which, char *msg, size_t len)
{
	static const enum rmoe_dispatch order[] = {RMOE_DISPATCH_AUTO, RMOE_DISPATCH_RING_EXPERT,
	                                           RMOE_DISPATCH_RING_TOKEN, RMOE_DISPATCH_ALLTOALL,
	                                           RMOE_DISPATCH_ALLTOALL_MEGATRON, RMOE_DISPATCH_ALLTOALL_DEEPEP};
	unsigned named = 0;
	int n = 0, words = 0;
	const char *p = d;
	do {
		size_t w = strcspn(p, ",");
		char word[32] = "";
		if (w < sizeof(word))
			memcpy(word, p, w);
		unsigned bits = dispatch_word(word);
		if (!bits) {
			snprintf(msg, len,
			         "--dispatch '%s': expected ring, token, a2a, a2a-megatron, a2a-deepep, auto, both, baselines "
			         "or all, or a comma list of them ('%.*s' is none)",
			         d, (int)(w < 40 ? w : 40), p);
			return 0;
		}
		named |= bits;
		words++;
		p += w;
	} while (*p++ == ',');
	if ((named & DISPATCH_BIT(RMOE_DISPATCH_AUTO)) && words > 1) {
		snprintf(msg, len, "--dispatch '%s': auto chooses one dispatcher and stands alone", d);
		return 0;
	}
	for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++)
		if (named & DISPATCH_BIT(order[i]))
			which[n++] = order[i];
	return n;
}
