/* The description of planner_check.h and its variants. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner_check.h"

const char *const small =
	"# two nodes of two GPUs\n"
	"name = small\n"
	"nodes = 2\n"
	"devices_per_node = 2\n"
	"ranks_per_node = 2\n"
	"gpu_link = pcie\n"
	"[device]\n"
	"bf16_tflops = 100\n"
	"f32_tflops = 10\n"
	"memory = 16G\n"
	"[link pcie]\n"
	"bandwidth_gbs = 50\n"
	"latency_us = 3\n"
	"[link network]\n"
	"bandwidth_gbs = 25\n"
	"latency_us = 2\n";

int parse_str(const char *text, struct rmoe_cluster *c)
{
	return rmoe_cluster_parse(text, strlen(text), c);
}

char *variant(const char *key_line, const char *replacement)
{
	size_t n = strlen(small) + strlen(replacement) + 8;
	char *s = malloc(n);
	const char *at = key_line ? strstr(small, key_line) : NULL;
	if (at) {
		const char *eol = strchr(at, '\n');
		snprintf(s, n, "%.*s%s%s", (int)(at - small), small, replacement, eol);
	} else {
		snprintf(s, n, "%s%s", small, replacement);
	}
	return s;
}
