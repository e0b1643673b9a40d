/* Text built whole in memory (text.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "text.h"

void rmoe_text_put(struct rmoe_text *t, const char *fmt, ...)
{
	if (t->failed)
		return;
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (n < 0) {
		t->failed = 1;
		return;
	}
	if (t->len + (size_t)n + 1 > t->cap) {
		size_t cap = t->cap ? t->cap : 4096;
		while (cap < t->len + (size_t)n + 1)
			cap *= 2;
		char *s = realloc(t->s, cap);
		if (!s) {
			t->failed = 1;
			return;
		}
		t->s = s;
		t->cap = cap;
	}
	va_start(ap, fmt);
	vsnprintf(t->s + t->len, t->cap - t->len, fmt, ap);
	va_end(ap);
	t->len += (size_t)n;
}

void rmoe_text_free(struct rmoe_text *t)
{
	free(t->s);
	*t = (struct rmoe_text){0};
}
