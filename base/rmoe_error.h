/* Error reporting, written once for every layer: a function that fails
 * returns a negative RMOE_E* code (relaymoe.h) after rmoe_error has set the
 * thread's last message, which names the bad value and what was expected;
 * rmoe_strerror returns that message for its code. */
#ifndef RMOE_ERROR_H
#define RMOE_ERROR_H

#include "relaymoe/relaymoe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Sets the thread's last message and code; returns code. */
int rmoe_error(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The message of the thread's last error ("" if none). */
const char *rmoe_last_error_message(void);
void rmoe_error_clear(void);

#ifdef __cplusplus
}
#endif

#endif /* RMOE_ERROR_H */
