/* CMocka with the headers it needs before it, and the main() of a test
 * program: one group per program (tests/unit, hardening_config), as
 * rmoe_add_unit_test builds them. */
#ifndef RMOE_TEST_CMOCKA_MAIN_H
#define RMOE_TEST_CMOCKA_MAIN_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

/* main() running the CMocka tests given after the group's setup and
 * teardown (NULL for none); it returns the number of failed tests. */
#define RMOE_TEST_MAIN(group_setup, group_teardown, ...)                          \
	int main(void)                                                             \
	{                                                                          \
		const struct CMUnitTest tests[] = {__VA_ARGS__};                   \
		return cmocka_run_group_tests(tests, group_setup, group_teardown); \
	}

#endif
