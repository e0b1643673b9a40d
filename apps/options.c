/* What the subcommands do with the option sets they share (options.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "messages.h"
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
	cfg->chunk_rows = o->chunk_rows;
	cfg->stripes = (int)o->stripes;
	return 0;
}

int rmoe_app_rank_tokens(const char *list, int nranks, int64_t *counts, int64_t *most, char *msg, size_t len)
{
	int n = 0;
	*most = 0;
	for (const char *p = list;; p++) {
		const size_t w = strcspn(p, ",");
		char word[24] = "", *end = NULL;
		if (w > 0 && w < sizeof(word))
			memcpy(word, p, w);
		errno = 0;
		const long long v = strtoll(word, &end, 10);
		if (!word[0] || strspn(word, "0123456789") != w || *end || errno || v > RMOE_OPT_MAX_TOKENS) {
			snprintf(msg, len, "--tokens-per-rank '%s': '%.*s' is not a token count: expected a whole number "
			         "from 0 to %.0f for each of the %d rank(s)", list, (int)(w < 40 ? w : 40), p,
			         RMOE_OPT_MAX_TOKENS, nranks);
			return RMOE_EINVAL;
		}
		if (n < nranks)
			counts[n] = v;
		n++;
		*most = v > *most ? v : *most;
		p += w;
		if (*p != ',')
			break;
	}
	if (n != nranks) {
		snprintf(msg, len, "--tokens-per-rank '%s': %d count(s) for %d rank(s): expected one count per rank", list,
		         n, nranks);
		return RMOE_EINVAL;
	}
	if (*most == 0) {
		snprintf(msg, len, "--tokens-per-rank '%s': every count is 0: expected tokens on at least one of the %d "
		         "rank(s)", list, nranks);
		return RMOE_EINVAL;
	}
	return 0;
}

#define DISPATCH_BIT(i) (1u << (i))

/* Whether name is one of the comma-separated names of list. */
static int name_in_list(const char *name, const char *list)
{
	const size_t n = strlen(name);
	for (const char *p = list; *p; p += strcspn(p, ","), p += *p == ',')
		if (strcspn(p, ",") == n && !strncmp(p, name, n))
			return 1;
	return 0;
}

/* The dispatchers one word of --dispatch names, as bits of their rows in
 * rmoe_dispatchers[]; 0: none. The group words name lists of rows. */
static unsigned dispatch_word(const char *word)
{
	static const struct {
		const char *word, *names;
	} groups[] = {{"both", "ring,a2a"}, {"baselines", "ring,a2a,a2a-megatron,a2a-deepep"}};
	for (size_t g = 0; g < sizeof(groups) / sizeof(groups[0]); g++)
		if (!strcmp(word, groups[g].word)) {
			unsigned bits = 0;
			for (int i = 0; i < RMOE_NDISPATCHERS; i++)
				if (name_in_list(rmoe_dispatchers[i].name, groups[g].names))
					bits |= DISPATCH_BIT(i);
			return bits;
		}
	unsigned bits = 0;
	for (int i = 0; i < RMOE_NDISPATCHERS; i++)
		if (!strcmp(word, "all") ? rmoe_dispatchers[i].family != RMOE_FAMILY_CHOICE
		                         : !strcmp(word, rmoe_dispatchers[i].name))
			bits |= DISPATCH_BIT(i);
	return bits;
}

int rmoe_app_dispatch_list(const char *d, enum rmoe_dispatch *which, char *msg, size_t len)
{
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
			char names[128];
			snprintf(msg, len, "--dispatch '%s': expected %s, both, baselines or all, or a comma list of them "
			         "('%.*s' is none)", d, rmoe_dispatch_names(names, sizeof(names)), (int)(w < 40 ? w : 40), p);
			return 0;
		}
		named |= bits;
		words++;
		p += w;
	} while (*p++ == ',');
	for (int i = 0; i < RMOE_NDISPATCHERS; i++)
		if ((named & DISPATCH_BIT(i)) && rmoe_dispatchers[i].family == RMOE_FAMILY_CHOICE && words > 1) {
			snprintf(msg, len, "--dispatch '%s': %s chooses one dispatcher and stands alone", d,
			         rmoe_dispatchers[i].name);
			return 0;
		}
	for (int i = 0; i < RMOE_NDISPATCHERS; i++)
		if (named & DISPATCH_BIT(i))
			which[n++] = rmoe_dispatchers[i].kind;
	return n;
}
