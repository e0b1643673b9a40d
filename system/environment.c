/* What the environment sets in a layer configuration: its defaults
 * (scheduler/config.c), then RMOE_WAIT_TIMEOUT. */
#include <math.h>
#include <stdlib.h>

#include "rmoe_system.h"

void rmoe_layer_config_init(struct rmoe_layer_config *cfg)
{
	rmoe_layer_config_defaults(cfg);
	/* Launchers that do not end the job when a rank dies leave the others
	 * waiting forever; the environment arms the timeout without a rebuild.
	 * A malformed value becomes -1, which rmoe_config_check refuses. */
	const char *timeout = getenv("RMOE_WAIT_TIMEOUT");
	if (timeout && *timeout) {
		char *end;
		double v = strtod(timeout, &end);
		cfg->wait_timeout = (*end == '\0' && isfinite(v) && v >= 0) ? v : -1;
	}
}
