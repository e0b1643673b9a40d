/* Text built whole in memory before it is printed: a command's output goes
 * out in one piece, from one rank, or not at all when building it ran out
 * of memory. */
#ifndef RMOE_TEXT_H
#define RMOE_TEXT_H

#include <stddef.h>

/* Zero-initialised: empty. failed: a put ran out of memory (or could not
 * format); every later put is then ignored, and s holds what came before. */
struct rmoe_text {
	char *s;
	size_t len, cap;
	int failed;
};

/* Appends the formatted text. */
void rmoe_text_put(struct rmoe_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void rmoe_text_free(struct rmoe_text *t);

#endif
