/* Model shapes of the paper's Table 3 (hidden H, expert FFN F, experts E,
 * top-k K; L layers for full-model planning), with each model's routing. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "rmoe_scheduler.h"

/* Attention: Qwen3-30B-A3B has 32 query heads, 4 KV heads of 128; the
 * Qwen3-style scaling configurations share it; Qwen2-57B-A14B has 28 and 4
 * of 128. Qwen3.5's hybrid linear attention is modelled as that GQA too. */
#define QWEN3_ATTN 32, 4, 128
/* Routing: Qwen3-MoE renormalises the top-k probabilities and has no shared
 * expert (norm_topk_prob true); the scaling study's shapes are Qwen3-style
 * (Table 3: "Qwen3-style architecture"), so route alike. */
#define QWEN3_ROUTING 1, 0, 0
static const struct rmoe_preset presets[] = {
	{"Qwen3-30B-A3B", 48, 2048, 768, 128, 8, QWEN3_ROUTING, QWEN3_ATTN},
	/* Qwen3.5's MoE block is Qwen3-Next's: top-k renormalised, one shared
	 * expert of the routed experts' width (512) behind a sigmoid gate. */
	{"Qwen3.5-35B-A3B", 40, 2048, 512, 256, 8, 1, 512, 1, QWEN3_ATTN},
	/* Qwen2-57B-A14B (Qwen2-MoE): norm_topk_prob false, and a shared expert
	 * of width 20480 (shared_expert_intermediate_size) scaled by
	 * sigmoid(shared_expert_gate(x)). */
	{"Qwen2-57B-A14B", 28, 3584, 2560, 64, 8, 0, 20480, 1, 28, 4, 128},
	{"MoE-E64", 24, 2048, 768, 64, 8, QWEN3_ROUTING, QWEN3_ATTN},
	{"MoE-E128", 12, 2048, 768, 128, 8, QWEN3_ROUTING, QWEN3_ATTN},
	{"MoE-E384", 4, 2048, 768, 384, 8, QWEN3_ROUTING, QWEN3_ATTN},
	{"MoE-K4", 12, 2048, 768, 128, 4, QWEN3_ROUTING, QWEN3_ATTN},
	{"MoE-K8", 12, 2048, 768, 128, 8, QWEN3_ROUTING, QWEN3_ATTN},
	{"MoE-K12", 12, 2048, 768, 128, 12, QWEN3_ROUTING, QWEN3_ATTN},
	{"MoE-K16", 12, 2048, 768, 128, 16, QWEN3_ROUTING, QWEN3_ATTN},
	{"MoE-H512", 18, 2048, 512, 128, 8, QWEN3_ROUTING, QWEN3_ATTN},
	{"MoE-H768", 12, 2048, 768, 128, 8, QWEN3_ROUTING, QWEN3_ATTN},
	{"MoE-H2048", 5, 2048, 2048, 128, 8, QWEN3_ROUTING, QWEN3_ATTN},
};

const struct rmoe_preset *rmoe_preset_list(size_t *count)
{
	*count = sizeof(presets) / sizeof(presets[0]);
	return presets;
}

const struct rmoe_preset *rmoe_preset_find(const char *name)
{
	for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++)
		if (name && strcasecmp(name, presets[i].name) == 0)
			return &presets[i];
	return NULL;
}

int rmoe_preset_apply(const char *name, double scale, struct rmoe_layer_config *cfg, char *msg, size_t len)
{
	const struct rmoe_preset *p = rmoe_preset_find(name);
	if (!p) {
		int used = snprintf(msg, len, "--preset '%s' is not a known shape; expected one of", name ? name : "");
		for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]) && used > 0 && (size_t)used < len; i++)
			used += snprintf(msg + used, len - (size_t)used, " %s", presets[i].name);
		return RMOE_EINVAL;
	}
	cfg->hidden = (int64_t)llround((double)p->hidden / scale);
	cfg->ffn = (int64_t)llround((double)p->ffn / scale);
	cfg->tokens = (int64_t)llround(RMOE_PRESET_TOKENS / scale);
	cfg->shared_ffn = (int64_t)llround((double)p->shared_ffn / scale);
	cfg->experts = p->experts;
	cfg->topk = p->topk;
	cfg->norm_topk = p->norm_topk;
	cfg->shared_gated = cfg->shared_ffn > 0 && p->shared_gated;
	if (cfg->hidden < 1 || cfg->ffn < 1 || cfg->tokens < 1) {
		snprintf(msg, len,
		         "--scale %g leaves %s with hidden=%lld ffn=%lld tokens=%lld: expected a scale that keeps each "
		         "at least 1",
		         scale, p->name, (long long)cfg->hidden, (long long)cfg->ffn, (long long)cfg->tokens);
		return RMOE_EINVAL;
	}
	return 0;
}
