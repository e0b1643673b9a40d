/* The JSON writer (json.h): each item first writes what separates it from
 * the one before, so no caller counts its items. */
#include "json.h"

void rmoe_json_init(struct rmoe_json *j, struct rmoe_text *out)
{
	*j = (struct rmoe_json){.out = out, .brk = -1};
}

static void newline(struct rmoe_json *j, int indent)
{
	rmoe_text_put(j->out, "\n%*s", indent, "");
}

/* What goes before an item: nothing before a key's value or the document;
 * a comma after an earlier item; then a new line, or a space after a
 * comma. */
static void item(struct rmoe_json *j)
{
	if (j->after_key) {
		j->after_key = 0;
		return;
	}
	if (j->depth == 0)
		return;
	int *items = &j->open[j->depth - 1].items;
	const int indent = j->brk >= 0 ? j->brk : j->open[j->depth - 1].item_indent;
	if (*items)
		rmoe_text_put(j->out, ",");
	if (indent >= 0)
		newline(j, indent);
	else if (*items)
		rmoe_text_put(j->out, " ");
	(*items)++;
	j->brk = -1;
}

static void begin(struct rmoe_json *j, char open)
{
	item(j);
	if (j->depth == RMOE_JSON_MAX_DEPTH) {
		j->out->failed = 1;
		return;
	}
	j->open[j->depth++] = (struct rmoe_json_level){.items = 0, .item_indent = -1, .end_indent = -1};
	rmoe_text_put(j->out, "%c", open);
}

static void end(struct rmoe_json *j, char close)
{
	if (j->depth == 0) {
		j->out->failed = 1;
		return;
	}
	const int indent = j->brk >= 0 ? j->brk : j->open[j->depth - 1].end_indent;
	if (indent >= 0)
		newline(j, indent);
	j->depth--;
	j->brk = -1;
	rmoe_text_put(j->out, "%c", close);
}

void rmoe_json_begin_object(struct rmoe_json *j)
{
	begin(j, '{');
}

void rmoe_json_end_object(struct rmoe_json *j)
{
	end(j, '}');
}

void rmoe_json_begin_array(struct rmoe_json *j)
{
	begin(j, '[');
}

void rmoe_json_end_array(struct rmoe_json *j)
{
	end(j, ']');
}

void rmoe_json_lines(struct rmoe_json *j, int item_indent, int end_indent)
{
	if (j->depth > 0) {
		j->open[j->depth - 1].item_indent = item_indent;
		j->open[j->depth - 1].end_indent = end_indent;
	}
}

void rmoe_json_break(struct rmoe_json *j, int indent)
{
	j->brk = indent;
}

/* s as a JSON string literal: '"' and '\' escaped, control characters as
 * \u00XX, every other byte as it is (UTF-8 passes through). */
static void quoted(struct rmoe_text *t, const char *s)
{
	rmoe_text_put(t, "\"");
	for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
		if (*c == '"' || *c == '\\')
			rmoe_text_put(t, "\\%c", *c);
		else if (*c < 0x20)
			rmoe_text_put(t, "\\u%04x", *c);
		else
			rmoe_text_put(t, "%c", *c);
	}
	rmoe_text_put(t, "\"");
}

void rmoe_json_key(struct rmoe_json *j, const char *key)
{
	item(j);
	quoted(j->out, key);
	rmoe_text_put(j->out, ": ");
	j->after_key = 1;
}

void rmoe_json_string(struct rmoe_json *j, const char *s)
{
	item(j);
	if (s)
		quoted(j->out, s);
	else
		rmoe_text_put(j->out, "null");
}

void rmoe_json_int(struct rmoe_json *j, long long v)
{
	item(j);
	rmoe_text_put(j->out, "%lld", v);
}

void rmoe_json_real(struct rmoe_json *j, double v)
{
	item(j);
	rmoe_text_put(j->out, "%.6g", v);
}

void rmoe_json_whole(struct rmoe_json *j, double v)
{
	item(j);
	rmoe_text_put(j->out, "%.0f", v);
}

void rmoe_json_bool(struct rmoe_json *j, int v)
{
	item(j);
	rmoe_text_put(j->out, "%s", v ? "true" : "false");
}

void rmoe_json_null(struct rmoe_json *j)
{
	item(j);
	rmoe_text_put(j->out, "null");
}

void rmoe_json_raw(struct rmoe_json *j, const char *json)
{
	item(j);
	rmoe_text_put(j->out, "%s", json);
}

void rmoe_json_key_string(struct rmoe_json *j, const char *key, const char *s)
{
	rmoe_json_key(j, key);
	rmoe_json_string(j, s);
}

void rmoe_json_key_int(struct rmoe_json *j, const char *key, long long v)
{
	rmoe_json_key(j, key);
	rmoe_json_int(j, v);
}

void rmoe_json_key_real(struct rmoe_json *j, const char *key, double v)
{
	rmoe_json_key(j, key);
	rmoe_json_real(j, v);
}

void rmoe_json_key_whole(struct rmoe_json *j, const char *key, double v)
{
	rmoe_json_key(j, key);
	rmoe_json_whole(j, v);
}

void rmoe_json_key_bool(struct rmoe_json *j, const char *key, int v)
{
	rmoe_json_key(j, key);
	rmoe_json_bool(j, v);
}
