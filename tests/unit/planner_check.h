/* What the planner's tests (test_planner*.c) share: the seed of their
 * random draws, and a small valid cluster description with its variants. */
#ifndef RMOE_TEST_PLANNER_CHECK_H
#define RMOE_TEST_PLANNER_CHECK_H

#include "rmoe_plan.h"

#define SEED 11u

/* A small valid description; tests append or substitute lines. */
extern const char *const small;

int parse_str(const char *text, struct rmoe_cluster *c);

/* small with one line replaced (by its key) or, with no key, text appended. */
char *variant(const char *key_line, const char *replacement);

#endif
