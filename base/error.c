/* Thread-local last error, so rmoe_strerror can name the bad value. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "rmoe_error.h"

static _Thread_local int last_code;
static _Thread_local char last_message[512];

int rmoe_error(int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(last_message, sizeof(last_message), fmt, ap);
	va_end(ap);
	last_code = code;
	return code;
}

const char *rmoe_last_error_message(void)
{
	return last_message;
}

void rmoe_error_clear(void)
{
	last_code = 0;
	last_message[0] = '\0';
}

static const char *generic(int code)
{
	switch (code) {
	case RMOE_OK: return "success";
	case RMOE_EINVAL: return "a configuration or argument value is out of range";
	case RMOE_ENOMEM: return "an allocation failed";
	case RMOE_EMPI: return "an MPI call failed or MPI is not usable as initialised";
	case RMOE_ESTARPU: return "StarPU returned an error";
	case RMOE_EMISMATCH: return "the ranks disagree";
	case RMOE_ESTATE: return "call out of order";
	case RMOE_ENOTSUP: return "not supported by this build or configuration";
	case RMOE_EIO: return "a file could not be read or written";
	case RMOE_ENONFINITE: return "a NaN or infinity was found";
	case RMOE_EFORMAT: return "a file or description does not parse or does not match";
	case RMOE_EPEER: return "another rank failed";
	default: return "unknown error code";
	}
}

const char *rmoe_strerror(int code)
{
	if (code != 0 && code == last_code && last_message[0])
		return last_message;
	return generic(code);
}
