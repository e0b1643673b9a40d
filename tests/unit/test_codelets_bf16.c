/* Unit tests of bf16 elements at the codelets: rounding to nearest even, and
 * the expert FFN on bf16 buffers (fp32 copies in, rounded stores out)
 * against the same FFN in fp32. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <starpu.h>

#include "cmocka_main.h"
#include "relaymoe/relaymoe.h"
#include "codelets_check.h"
#include "codelets_fixture.h"

/* bf16 keeps 8 significant bits: round to nearest, ties to even. */
static void test_codelets_bf16_rounding_to_nearest_even(void **state)
{
	(void)state;
	const float cases[][2] = {
		{1.0f, 1.0f},
		{1.0f + 0x1p-8f, 1.0f},                  /* half-way, to the even 1.0 */
		{1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-6f},     /* half-way, to the even 1 + 2^-6 */
		{1.0f + 0x1p-8f + 0x1p-20f, 1.0f + 0x1p-7f}, /* just above half-way */
		{-2.5f, -2.5f},
		{0x1.fffffep127f, INFINITY},              /* above bf16's largest finite, 0x1.fep127 */
		{INFINITY, INFINITY},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		float v = cases[i][0];
		rmoe_round_to_dtype(&v, 1, RMOE_DTYPE_BF16);
		if (v != cases[i][1])
			fail_msg("bf16(%a) = %a, expected %a", (double)cases[i][0], (double)v, (double)cases[i][1]);
	}
	float nan = NAN, same = 0.1f;
	rmoe_round_to_dtype(&nan, 1, RMOE_DTYPE_BF16);
	assert_true(isnan(nan));
	rmoe_round_to_dtype(&same, 1, RMOE_DTYPE_F32);
	assert_true(same == 0.1f);
}

/* A bf16 buffer reaches a CPU kernel as an fp32 copy and what the kernel
 * writes is rounded back: the expert FFN on bf16 rows and weights gives the
 * fp32 FFN of the bf16 values, rounded once more on output (relative norm
 * error a few units of 2^-9), and leaves its inputs untouched. */
static void test_codelets_bf16_operands_in_fp32_copies(void **state)
{
	(void)state;
	const int64_t H = 16, F = 8, ne = 2, rows_per_expert[2] = {5, 7}, m = 12;
	struct rng r = {63};
	float *x = rng_floats(&r, m * H, 1.0), *w = rng_floats(&r, 3 * ne * H * F, 1.0 / sqrt((double)H));
	rmoe_round_to_dtype(x, m * H, RMOE_DTYPE_BF16);
	rmoe_round_to_dtype(w, 3 * ne * H * F, RMOE_DTYPE_BF16);
	uint16_t *xb = xcalloc(m * H, 2), *wb = xcalloc(3 * ne * H * F, 2), *outb = xcalloc(m * H, 2);
	uint16_t *workb = xcalloc(3 * m * F, 2);
	rmoe_to_elements(x, xb, m * H, 2);
	rmoe_to_elements(w, wb, 3 * ne * H * F, 2);
	float *work = xcalloc(3 * m * F, sizeof(float)), *out = xcalloc(m * H, sizeof(float));
	starpu_data_handle_t h[8];
	starpu_vector_data_register(&h[0], STARPU_MAIN_RAM, (uintptr_t)xb, (uint32_t)(m * H), 2);
	starpu_vector_data_register(&h[1], STARPU_MAIN_RAM, (uintptr_t)wb, (uint32_t)(3 * ne * H * F), 2);
	starpu_vector_data_register(&h[2], STARPU_MAIN_RAM, (uintptr_t)workb, (uint32_t)(3 * m * F), 2);
	starpu_vector_data_register(&h[3], STARPU_MAIN_RAM, (uintptr_t)outb, (uint32_t)(m * H), 2);
	h[4] = vec_f(x, m * H);
	h[5] = vec_f(w, 3 * ne * H * F);
	h[6] = vec_f(work, 3 * m * F);
	h[7] = vec_f(out, m * H);
	struct rmoe_expert_shape a = expert_shape(H, F, ne, rows_per_expert);
	INSERT(rmoe_insert_expert_ffn(opts("expert-ffn"), &a, h[0], h[1], h[2], h[3]));
	INSERT(rmoe_insert_expert_ffn(opts("expert-ffn"), &a, h[4], h[5], h[6], h[7]));
	wait_all();
	unregister_all(h, 8);
	float *got = xcalloc(m * H, sizeof(float)), *x_back = xcalloc(m * H, sizeof(float));
	rmoe_from_elements(outb, got, m * H, 2);
	rmoe_from_elements(xb, x_back, m * H, 2);
	assert_memory_equal(x_back, x, (size_t)(m * H) * sizeof(float));
	/* The fp32 run saw the same values; only the bf16 stores differ. */
	assert_rel_err(rel_err_f(got, out, m * H), 2e-2);
	assert_true(rel_err_f(got, out, m * H) > 0);
	void *all[] = {x, w, xb, wb, outb, workb, work, out, got, x_back};
	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
		free(all[i]);
}

RMOE_TEST_MAIN(codelets_group_setup, codelets_fixture_stop,
               cmocka_unit_test(test_codelets_bf16_rounding_to_nearest_even),
               cmocka_unit_test(test_codelets_bf16_operands_in_fp32_copies))
