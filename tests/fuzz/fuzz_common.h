/* What the fuzz targets share: an invariant that, broken, stops the run
 * with the input kept (libFuzzer and the replay driver both treat abort()
 * as a crash). */
#ifndef RMOE_FUZZ_COMMON_H
#define RMOE_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define RMOE_FUZZ_REQUIRE(cond)                                                          \
	do {                                                                             \
		if (!(cond)) {                                                           \
			fprintf(stderr, "%s:%d: invariant broken: %s\n", __FILE__, __LINE__, \
			        #cond);                                                  \
			abort();                                                         \
		}                                                                        \
	} while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
