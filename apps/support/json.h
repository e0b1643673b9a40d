/* A small JSON writer into a text (text.h): objects, arrays, keys and
 * values, the writer placing the commas. Items run on one line, ", "
 * between them, unless the caller asks for line breaks: for every item of
 * a container (rmoe_json_lines) or for the next one (rmoe_json_break), so
 * that a long document stays readable where it is long. An end with
 * nothing open, or nesting deeper than RMOE_JSON_MAX_DEPTH, marks the text
 * failed; that keys and values alternate in an object is the caller's. */
#ifndef RMOE_JSON_H
#define RMOE_JSON_H

#include "text.h"

#define RMOE_JSON_MAX_DEPTH 16

/* An open object or array. */
struct rmoe_json_level {
	int items;                   /* written so far */
	int item_indent, end_indent; /* -1: on the line */
};

struct rmoe_json {
	struct rmoe_text *out;
	int depth;
	int after_key;               /* a key was written: its value comes next, no comma */
	int brk;                     /* the next item's or end's line indent; -1: none */
	struct rmoe_json_level open[RMOE_JSON_MAX_DEPTH];
};

void rmoe_json_init(struct rmoe_json *j, struct rmoe_text *out);

void rmoe_json_begin_object(struct rmoe_json *j);
void rmoe_json_end_object(struct rmoe_json *j);
void rmoe_json_begin_array(struct rmoe_json *j);
void rmoe_json_end_array(struct rmoe_json *j);

/* Every item of the innermost open container starts a line indented by
 * item_indent spaces, and its end one indented by end_indent. */
void rmoe_json_lines(struct rmoe_json *j, int item_indent, int end_indent);
/* The next item, or the end of the container, starts a line indented by
 * indent spaces. */
void rmoe_json_break(struct rmoe_json *j, int indent);

/* A member's key, in an object; its value follows. */
void rmoe_json_key(struct rmoe_json *j, const char *key);

/* Values. A string is escaped as RFC 8259 asks; NULL writes null. */
void rmoe_json_string(struct rmoe_json *j, const char *s);
void rmoe_json_int(struct rmoe_json *j, long long v);
/* A real number to six significant digits (printf's %.6g). */
void rmoe_json_real(struct rmoe_json *j, double v);
/* A real number rounded to a whole one, every digit written (printf's
 * %.0f): a byte count computed in floating point. */
void rmoe_json_whole(struct rmoe_json *j, double v);
void rmoe_json_bool(struct rmoe_json *j, int v);
void rmoe_json_null(struct rmoe_json *j);
/* A value already written as JSON (by another writer), inserted as it is. */
void rmoe_json_raw(struct rmoe_json *j, const char *json);

/* A key and its value, in one call. */
void rmoe_json_key_string(struct rmoe_json *j, const char *key, const char *s);
void rmoe_json_key_int(struct rmoe_json *j, const char *key, long long v);
void rmoe_json_key_real(struct rmoe_json *j, const char *key, double v);
void rmoe_json_key_whole(struct rmoe_json *j, const char *key, double v);
void rmoe_json_key_bool(struct rmoe_json *j, const char *key, int v);

#endif
