/* The configuration checks the hardening added: the new fields, the
 * environment's timeout, and extents whose products used to overflow. Pure
 * functions: no MPI, no StarPU. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cmocka_main.h"
#include "rmoe_scheduler.h"

static void expect_invalid(struct rmoe_layer_config c, const char *needle)
{
	int rc = rmoe_config_check(&c, 1);
	assert_int_equal(rc, RMOE_EINVAL);
	if (!strstr(rmoe_strerror(rc), needle))
		fail_msg("message '%s' does not mention '%s'", rmoe_strerror(rc), needle);
}

static void test_hardening_config_new_fields(void **state)
{
	(void)state;
	unsetenv("RMOE_WAIT_TIMEOUT");
	struct rmoe_layer_config c;
	rmoe_layer_config_init(&c);
	assert_int_equal(c.check_finite, 0);
	assert_true(c.wait_timeout == 0);
	assert_int_equal(rmoe_config_check(&c, 1), 0);
	c.check_finite = 2;
	expect_invalid(c, "check_finite = 2: expected 0 or 1");
	rmoe_layer_config_init(&c);
	c.wait_timeout = -3;
	expect_invalid(c, "wait_timeout = -3");
	c.wait_timeout = NAN;
	expect_invalid(c, "wait_timeout = nan");
	c.wait_timeout = INFINITY;
	expect_invalid(c, "wait_timeout = inf");
	c.wait_timeout = 30;
	assert_int_equal(rmoe_config_check(&c, 1), 0);
}

static void test_hardening_config_timeout_from_environment(void **state)
{
	(void)state;
	struct rmoe_layer_config c;
	setenv("RMOE_WAIT_TIMEOUT", "12.5", 1);
	rmoe_layer_config_init(&c);
	assert_true(c.wait_timeout == 12.5);
	setenv("RMOE_WAIT_TIMEOUT", "soon", 1);
	rmoe_layer_config_init(&c);
	expect_invalid(c, "RMOE_WAIT_TIMEOUT");
	setenv("RMOE_WAIT_TIMEOUT", "-1", 1);
	rmoe_layer_config_init(&c);
	expect_invalid(c, "wait_timeout = -1");
	setenv("RMOE_WAIT_TIMEOUT", "", 1);
	rmoe_layer_config_init(&c);
	assert_true(c.wait_timeout == 0);
	unsetenv("RMOE_WAIT_TIMEOUT");
}

/* Each of these formed a signed product past INT64_MAX before the extents
 * were bounded (undefined behaviour; found with fuzz_opts). */
static void test_hardening_config_products_never_overflow(void **state)
{
	(void)state;
	struct rmoe_layer_config c;
	rmoe_layer_config_init(&c);
	c.ffn = 3000000000000000000LL;
	expect_invalid(c, "ffn = 3000000000000000000: expected at most 4294967295");
	rmoe_layer_config_init(&c);
	c.hidden = 4294967295LL;
	c.ffn = 1073741823LL;
	c.experts = 1;
	c.topk = 1;
	c.tokens = 1;
	expect_invalid(c, "3 x hidden x ffn");
	rmoe_layer_config_init(&c);
	c.shared_ffn = INT64_MAX;
	expect_invalid(c, "shared_ffn");
	rmoe_layer_config_init(&c);
	c.hidden = INT64_MAX;
	expect_invalid(c, "hidden");
}

static void test_hardening_config_hash_covers_check_finite(void **state)
{
	(void)state;
	struct rmoe_layer_config a, b;
	rmoe_layer_config_init(&a);
	b = a;
	b.check_finite = 1;
	assert_true(rmoe_config_hash(&a) != rmoe_config_hash(&b));
	/* The timeout is a rank's own affair: no need to agree. */
	b = a;
	b.wait_timeout = 9;
	assert_true(rmoe_config_hash(&a) == rmoe_config_hash(&b));
}

RMOE_TEST_MAIN(NULL, NULL,
               cmocka_unit_test(test_hardening_config_new_fields),
               cmocka_unit_test(test_hardening_config_timeout_from_environment),
               cmocka_unit_test(test_hardening_config_products_never_overflow),
               cmocka_unit_test(test_hardening_config_hash_covers_check_finite))
