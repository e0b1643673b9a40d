/* The check of the scheduling policy a context asks StarPU for. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <starpu.h>

#include "rmoe_ctx.h"

/* A policy StarPU does not know is replaced by its default with a warning
 * only: a scheduler experiment would measure another policy than the one
 * it names. The name StarPU will use (STARPU_SCHED wins over the
 * configuration's, as in StarPU) must be one of StarPU's; "help" (StarPU
 * lists them) and "heft" (StarPU 1.3's alias of dmda) pass. */
int rmoe_ctx_check_policy(const struct rmoe_ctx_config *cfg)
{
	const char *env = getenv("STARPU_SCHED");
	const char *name = env && *env ? env : cfg->sched;
	if (!name || !*name || !strcmp(name, "help") || !strcmp(name, "heft"))
		return 0;
	/* The message names the classic policies and counts the modular ones. */
	char known[400] = "";
	size_t used = 0;
	int modular = 0;
	for (struct starpu_sched_policy **p = starpu_sched_get_predefined_policies(); p && *p; p++) {
		const char *pn = (*p)->policy_name;
		if (!pn)
			continue;
		if (!strcmp(pn, name))
			return 0;
		if (!strncmp(pn, "modular-", 8)) {
			modular++;
			continue;
		}
		int n = snprintf(known + used, sizeof(known) - used, "%s%s", used ? ", " : "", pn);
		if (n > 0 && (size_t)n < sizeof(known) - used)
			used += (size_t)n;
	}
	const int from_env = name == env && (!cfg->sched || strcmp(env, cfg->sched));
	return rmoe_error(RMOE_EINVAL, "scheduling policy '%s'%s is not one StarPU knows: expected one of %s, or one of "
	                  "its %d modular-* policies", name, from_env ? " (STARPU_SCHED)" : "", known, modular);
}
